/*
 * forward: the upstream request head (see forward.h). Pure: no clock, no state.
 */
#include <string.h>

#include <event2/buffer.h>

#include "forward.h"
#include "h1_write.h"
#include "http.h"
#include "util.h"

static bool named(const struct http_hdr *h, const char *name, size_t nlen)
{
	return str_ieq(h->name, h->nlen, name, nlen);
}

#define NAMED(h, lit) named((h), lit, sizeof(lit) - 1)

static void host_field(const struct forward_req *f, struct evbuffer *b)
{
	const struct http_head *r = f->req;
	if (f->host_rewrite && f->host_rewrite[0])
		H1_FIELD_STR(b, "Host", f->host_rewrite, strlen(f->host_rewrite));
	else if (r->host_len > 0)
		H1_FIELD_STR(b, "Host", r->host, r->host_len);
	else
		H1_FIELD_STR(b, "Host", f->endpoint, strlen(f->endpoint));
}

/* X-Forwarded-For / -Proto: earlier lines go on as they came, the last gets our hop */
static void forwarded(struct evbuffer *b, const char *name, size_t nlen, const struct http_hdr *last,
                      const char *ours)
{
	if (last)
		h1_field_append(b, name, nlen, last->value, last->vlen, ours, strlen(ours));
	else
		h1_field(b, name, nlen, ours, strlen(ours));
}

static void deadline_fields(const struct forward_req *f, struct evbuffer *b)
{
	char v[DEADLINE_FMT_MAX];
	int n = deadline_format(DL_X_TIMEOUT_MS, f->wait_us, v, sizeof(v));
	H1_FIELD_STR(b, "X-Timeout-Ms", v, (size_t)(n > 0 ? n : 0));
	for (int k = 1; k < DL_NKINDS; k++) {
		if (!f->dl_present[k])
			continue;
		n = deadline_format((enum dl_kind)k, f->wait_us, v, sizeof(v));
		h1_field(b, deadline_header_name[k], strlen(deadline_header_name[k]), v,
		         (size_t)(n > 0 ? n : 0));
	}
}

static void framing(const struct forward_req *f, struct evbuffer *b)
{
	const struct http_head *r = f->req;
	if (f->streamed) {
		if (r->expect_continue)
			evbuffer_add(b, "Expect: 100-continue\r\n", 22);
		if (r->content_length >= 0)
			H1_FIELD_INT(b, "Content-Length", r->content_length);
		else
			evbuffer_add(b, "Transfer-Encoding: chunked\r\n", 28);
	} else if (f->body_len > 0 || r->content_length >= 0 || r->chunked) {
		H1_FIELD_INT(b, "Content-Length", f->body_len);
	}
}

void forward_h1_head(const struct forward_req *f, struct evbuffer *b)
{
	const struct http_head *r = f->req;
	evbuffer_expand(b, 1024);
	evbuffer_add(b, r->method, strlen(r->method));
	evbuffer_add(b, " ", 1);
	evbuffer_add(b, r->path, r->path_len);
	evbuffer_add(b, " HTTP/1.1\r\n", 11);
	host_field(f, b);

	const struct http_hdr *xff = NULL, *xfp = NULL;
	bool have_reqid = false;
	for (int i = 0; i < r->nhdrs; i++) {
		const struct http_hdr *h = &r->hdrs[i];
		if (h->hop || NAMED(h, "Host") || NAMED(h, "Expect") ||
		    deadline_header_kind(h->name, h->nlen) >= 0)
			continue;
		if (!f->nested && NAMED(h, "X-Retrygate-Attempt"))
			continue;
		if (NAMED(h, "X-Forwarded-For")) {
			if (xff)
				H1_FIELD_STR(b, "X-Forwarded-For", xff->value, xff->vlen);
			xff = h;
			continue;
		}
		if (NAMED(h, "X-Forwarded-Proto")) {
			if (xfp)
				H1_FIELD_STR(b, "X-Forwarded-Proto", xfp->value, xfp->vlen);
			xfp = h;
			continue;
		}
		if (NAMED(h, "X-Request-Id"))
			have_reqid = true;
		h1_field(b, h->name, h->nlen, h->value, h->vlen);
	}
	forwarded(b, "X-Forwarded-For", 15, xff, f->peer_ip);
	forwarded(b, "X-Forwarded-Proto", 17, xfp, f->tls ? "https" : "http");
	if (!have_reqid)
		H1_FIELD_STR(b, "X-Request-Id", f->reqid, strlen(f->reqid));
	deadline_fields(f, b);
	if (!f->nested)
		H1_FIELD_INT(b, "X-Retrygate-Attempt", f->attempt);
	if (r->upgrade) {
		size_t n = 0;
		const char *u = http_head_get(r, "Upgrade", &n);
		evbuffer_add(b, "Connection: upgrade\r\n", 21);
		H1_FIELD_STR(b, "Upgrade", u ? u : "", u ? n : 0);
	}
	framing(f, b);
	evbuffer_add(b, "\r\n", 2);
}

void forward_request_id(const struct http_head *req, char out[FORWARD_ID_MAX], uint64_t *rng)
{
	size_t n = 0;
	const char *cid = http_head_get(req, "X-Request-Id", &n);
	if (!cid || n == 0) {
		request_id_new(out, rng);
		return;
	}
	if (n > FORWARD_ID_MAX - 1)
		n = FORWARD_ID_MAX - 1;
	memcpy(out, cid, n);
	out[n] = 0;
}
