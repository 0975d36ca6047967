/*
 * store: what both idempotency backends share (see store.h): the rule that judges a claim
 * against a record, and the record's byte encoding (what redis holds).
 */
#include <stdbool.h>
#include <string.h>

#include "idempotency/store.h"

enum idem_result rec_judge(enum rec_state st, const unsigned char stored_fp[32],
                           const unsigned char fp[32])
{
	if (memcmp(stored_fp, fp, 32) != 0)
		return IDEM_MISMATCH;
	return st == REC_DONE ? IDEM_REPLAY : IDEM_IN_PROGRESS;
}

/* ------------------------------------------------------------------ the record codec */

static const unsigned char rec_magic[4] = { 'R', 'G', 'I', '1' };
static const unsigned char rec_magic2[4] = { 'R', 'G', 'I', '2' };

static void put_be(unsigned char *p, uint64_t v, int n)
{
	for (int i = n - 1; i >= 0; i--, v >>= 8)
		p[i] = (unsigned char)v;
}

static uint64_t get_be(const unsigned char *p, int n)
{
	uint64_t v = 0;
	for (int i = 0; i < n; i++)
		v = v << 8 | p[i];
	return v;
}

/* the version-2 form only when there is something the first cannot say */
static bool has_trailers(const struct idem_response *resp)
{
	return resp->trailers_len > 0;
}

size_t rec_size(enum rec_state st, const struct idem_response *resp)
{
	if (st != REC_DONE)
		return REC_HEAD_LEN;
	if (resp->headers_len > UINT32_MAX || resp->body_len > UINT32_MAX ||
	    resp->trailers_len > UINT32_MAX)
		return 0;
	size_t head = has_trailers(resp) ? REC_RESP_HEAD2 : REC_RESP_HEAD;
	return REC_HEAD_LEN + head + resp->headers_len + resp->body_len + resp->trailers_len;
}

void rec_encode(unsigned char *out, enum rec_state st, const unsigned char fp[32],
                const struct idem_response *resp)
{
	bool v2 = st == REC_DONE && has_trailers(resp);
	memcpy(out, v2 ? rec_magic2 : rec_magic, 4);
	out[4] = (unsigned char)st;
	memcpy(out + 5, fp, 32);
	if (st != REC_DONE)
		return;
	unsigned char *p = out + REC_HEAD_LEN;
	put_be(p, (uint64_t)resp->status, 2);
	put_be(p + 2, resp->headers_len, 4);
	put_be(p + 6, resp->body_len, 4);
	if (v2)
		put_be(p + 10, resp->trailers_len, 4);
	p += v2 ? REC_RESP_HEAD2 : REC_RESP_HEAD;
	if (resp->headers_len)
		memcpy(p, resp->headers, resp->headers_len);
	p += resp->headers_len;
	if (resp->body_len)
		memcpy(p, resp->body, resp->body_len);
	p += resp->body_len;
	if (v2)
		memcpy(p, resp->trailers, resp->trailers_len);
}

bool rec_decode(const unsigned char *p, size_t n, struct rec *out)
{
	memset(out, 0, sizeof *out);
	if (n < REC_HEAD_LEN)
		return false;
	bool v2 = memcmp(p, rec_magic2, 4) == 0;
	if (!v2 && memcmp(p, rec_magic, 4) != 0)
		return false;
	out->state = (enum rec_state)p[4];
	memcpy(out->fp, p + 5, 32);
	switch (p[4]) {
	case REC_CLAIMED:
	case REC_KEPT:
		return !v2 && n == REC_HEAD_LEN;    /* the version-2 form is for DONE only */
	case REC_DONE:
		break;
	default:
		return false;
	}
	size_t head = v2 ? REC_RESP_HEAD2 : REC_RESP_HEAD;
	if (n < REC_HEAD_LEN + head)
		return false;
	const unsigned char *q = p + REC_HEAD_LEN;
	uint64_t status = get_be(q, 2), hl = get_be(q + 2, 4), bl = get_be(q + 6, 4);
	uint64_t tl = v2 ? get_be(q + 10, 4) : 0;
	/* the lengths are below 2^32 each, so the sum cannot wrap a size_t; a version-2 record
	 * without trailers would be a second spelling of a version-1 one: refused */
	if (status < 100 || status > 599 || (v2 && tl == 0) ||
	    n - REC_HEAD_LEN - head != hl + bl + tl)
		return false;
	q += head;
	out->resp.status = (int)status;
	out->resp.headers = (const char *)q;
	out->resp.headers_len = (size_t)hl;
	out->resp.body = (const char *)q + hl;
	out->resp.body_len = (size_t)bl;
	if (v2) {
		out->resp.trailers = (const char *)q + hl + bl;
		out->resp.trailers_len = (size_t)tl;
	}
	return true;
}
