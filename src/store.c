/*
 * store: what both idempotency backends share (see store.h): the rule that judges a claim
 * against a record, and the record's byte encoding (what redis holds).
 */
#include <stdbool.h>
#include <string.h>

#include "store.h"

enum idem_result rec_judge(enum rec_state st, const unsigned char stored_fp[32],
                           const unsigned char fp[32])
{
	if (memcmp(stored_fp, fp, 32) != 0)
		return IDEM_MISMATCH;
	return st == REC_DONE ? IDEM_REPLAY : IDEM_IN_PROGRESS;
}

/* ------------------------------------------------------------------ the record codec */

static const unsigned char rec_magic[4] = { 'R', 'G', 'I', '1' };

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

size_t rec_size(enum rec_state st, const struct idem_response *resp)
{
	if (st != REC_DONE)
		return REC_HEAD_LEN;
	if (resp->headers_len > UINT32_MAX || resp->body_len > UINT32_MAX)
		return 0;
	return REC_HEAD_LEN + REC_RESP_HEAD + resp->headers_len + resp->body_len;
}

void rec_encode(unsigned char *out, enum rec_state st, const unsigned char fp[32],
                const struct idem_response *resp)
{
	memcpy(out, rec_magic, 4);
	out[4] = (unsigned char)st;
	memcpy(out + 5, fp, 32);
	if (st != REC_DONE)
		return;
	unsigned char *p = out + REC_HEAD_LEN;
	put_be(p, (uint64_t)resp->status, 2);
	put_be(p + 2, resp->headers_len, 4);
	put_be(p + 6, resp->body_len, 4);
	p += REC_RESP_HEAD;
	if (resp->headers_len)
		memcpy(p, resp->headers, resp->headers_len);
	if (resp->body_len)
		memcpy(p + resp->headers_len, resp->body, resp->body_len);
}

bool rec_decode(const unsigned char *p, size_t n, struct rec *out)
{
	memset(out, 0, sizeof *out);
	if (n < REC_HEAD_LEN || memcmp(p, rec_magic, 4) != 0)
		return false;
	out->state = (enum rec_state)p[4];
	memcpy(out->fp, p + 5, 32);
	switch (p[4]) {
	case REC_CLAIMED:
	case REC_KEPT:
		return n == REC_HEAD_LEN;
	case REC_DONE:
		break;
	default:
		return false;
	}
	if (n < REC_HEAD_LEN + REC_RESP_HEAD)
		return false;
	const unsigned char *q = p + REC_HEAD_LEN;
	uint64_t status = get_be(q, 2), hl = get_be(q + 2, 4), bl = get_be(q + 6, 4);
	/* the lengths are below 2^32 each, so the sum cannot wrap a size_t */
	if (status < 100 || status > 599 || n - REC_HEAD_LEN - REC_RESP_HEAD != hl + bl)
		return false;
	q += REC_RESP_HEAD;
	out->resp.status = (int)status;
	out->resp.headers = (const char *)q;
	out->resp.headers_len = (size_t)hl;
	out->resp.body = (const char *)q + hl;
	out->resp.body_len = (size_t)bl;
	return true;
}
