/*
 * forward: the upstream request head, HTTP/1.1 or HTTP/2 (see forward.h). Pure: no clock,
 * no state.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "forward.h"
#include "grpc.h"
#include "h1_write.h"
#include "http.h"
#include "util.h"

static bool named(const struct http_hdr *h, const char *name, size_t nlen)
{
	return str_ieq(h->name, h->nlen, name, nlen);
}

#define NAMED(h, lit) named((h), lit, sizeof(lit) - 1)

/* Where the fields go: an HTTP/1.1 head (names as they came) or an HTTP/2 field list
 * (names lowercased). One walk over the client's fields serves both, so the two protocols
 * cannot drift apart in what they forward. */
struct sink {
	struct evbuffer *b;             /* HTTP/1.1 */
	struct forward_nv *nv;          /* HTTP/2 */
};

static void nv_add(struct forward_nv *o, const char *name, size_t nlen, const char *v1, size_t l1,
                   const char *v2, size_t l2, const char *v3, size_t l3)
{
	size_t need = nlen + l1 + l2 + l3;
	if (o->used + need > o->acap) {
		size_t cap = o->acap ? o->acap * 2 : 1024;
		while (cap < o->used + need)
			cap *= 2;
		o->arena = xrealloc(o->arena, cap);
		o->acap = cap;
	}
	if (o->n == o->cap) {
		o->cap = o->cap ? o->cap * 2 : 32;
		o->nv = xrealloc(o->nv, o->cap * sizeof(*o->nv));
	}
	/* offsets into the arena until forward_h2_headers() ends: it may still move */
	nghttp2_nv *e = &o->nv[o->n++];
	char *p = o->arena + o->used;
	for (size_t i = 0; i < nlen; i++)
		p[i] = (char)((name[i] >= 'A' && name[i] <= 'Z') ? name[i] + 32 : name[i]);
	e->name = (uint8_t *)(uintptr_t)o->used;
	e->namelen = nlen;
	p += nlen;
	if (l1)
		memcpy(p, v1, l1);
	if (l2)
		memcpy(p + l1, v2, l2);
	if (l3)
		memcpy(p + l1 + l2, v3, l3);
	e->value = (uint8_t *)(uintptr_t)(o->used + nlen);
	e->valuelen = l1 + l2 + l3;
	e->flags = NGHTTP2_NV_FLAG_NONE;
	o->used += need;
}

static void put3(struct sink *k, const char *name, size_t nlen, const char *v1, size_t l1,
                 const char *v2, size_t l2, const char *v3, size_t l3)
{
	if (k->b)
		h1_field3(k->b, name, nlen, v1, l1, v2, l2, v3, l3);
	else
		nv_add(k->nv, name, nlen, v1, l1, v2, l2, v3, l3);
}

static void put(struct sink *k, const char *name, size_t nlen, const char *v, size_t vlen)
{
	if (k->b)
		h1_field(k->b, name, nlen, v, vlen);
	else
		nv_add(k->nv, name, nlen, v, vlen, NULL, 0, NULL, 0);
}

static void put_int(struct sink *k, const char *name, size_t nlen, int64_t v)
{
	char d[24];
	put(k, name, nlen, d, h1_fmt_int(d, v));
}

#define PUT_STR(k, lit, v, vlen) put((k), lit, sizeof(lit) - 1, (v), (vlen))
#define PUT_INT(k, lit, v) put_int((k), lit, sizeof(lit) - 1, (v))

/* The authority the upstream sees: host_rewrite, else the client's, else the endpoint */
static void authority(const struct forward_req *f, const char **v, size_t *n)
{
	const struct http_head *r = f->req;
	if (f->host_rewrite && f->host_rewrite[0]) {
		*v = f->host_rewrite;
		*n = strlen(f->host_rewrite);
	} else if (r->host_len > 0) {
		*v = r->host;
		*n = r->host_len;
	} else {
		*v = f->endpoint;
		*n = strlen(f->endpoint);
	}
}

/* X-Forwarded-For / -Proto: earlier lines go on as they came, the last gets our hop */
static void forwarded(struct sink *k, const char *name, size_t nlen, const struct http_hdr *last,
                      const char *ours)
{
	if (last)
		put3(k, name, nlen, last->value, last->vlen, ", ", 2, ours, strlen(ours));
	else
		put(k, name, nlen, ours, strlen(ours));
}

static void deadline_fields(const struct forward_req *f, struct sink *k)
{
	char v[DEADLINE_FMT_MAX];
	int n = deadline_format(DL_X_TIMEOUT_MS, f->wait_us, v, sizeof(v));
	PUT_STR(k, "X-Timeout-Ms", v, (size_t)(n > 0 ? n : 0));
	for (int i = 1; i < DL_NKINDS; i++) {
		/* SPEC §10: a gRPC server enforces the deadline natively only if it is told in its
		 * own header, so every attempt of a call carries one, sent or not by the client */
		if (!f->dl_present[i] && !(f->grpc && i == DL_GRPC_TIMEOUT))
			continue;
		n = deadline_format((enum dl_kind)i, f->wait_us, v, sizeof(v));
		put(k, deadline_header_name[i], strlen(deadline_header_name[i]), v,
		    (size_t)(n > 0 ? n : 0));
	}
}

/* Body framing. HTTP/2 has no chunked coding: a length when known, else DATA frames alone. */
static void framing(const struct forward_req *f, struct sink *k)
{
	const struct http_head *r = f->req;
	if (f->streamed) {
		if (r->expect_continue)
			PUT_STR(k, "Expect", "100-continue", 12);
		if (r->content_length >= 0)
			PUT_INT(k, "Content-Length", r->content_length);
		else if (k->b)
			PUT_STR(k, "Transfer-Encoding", "chunked", 7);
	} else if (f->body_len > 0 || r->content_length >= 0 || r->chunked) {
		PUT_INT(k, "Content-Length", f->body_len);
	}
}

/* Every field after the request line / pseudo-headers, in the order both protocols share */
static void fields(const struct forward_req *f, struct sink *k)
{
	const struct http_head *r = f->req;
	const struct http_hdr *xff = NULL, *xfp = NULL;
	bool have_reqid = false;
	for (int i = 0; i < r->nhdrs; i++) {
		const struct http_hdr *h = &r->hdrs[i];
		if (h->hop || NAMED(h, "Host") || NAMED(h, "Expect") ||
		    deadline_header_kind(h->name, h->nlen) >= 0)
			continue;
		if (h->nlen > 0 && h->name[0] == ':')
			continue;   /* an HTTP/2 client's pseudo-headers are ours to rebuild */
		if (!f->nested && NAMED(h, "X-Retrygate-Attempt"))
			continue;
		if (f->grpc && !f->nested && NAMED(h, "grpc-previous-rpc-attempts"))
			continue;   /* ours below: this hop's count, not the client's */
		if (NAMED(h, "X-Forwarded-For")) {
			if (xff)
				PUT_STR(k, "X-Forwarded-For", xff->value, xff->vlen);
			xff = h;
			continue;
		}
		if (NAMED(h, "X-Forwarded-Proto")) {
			if (xfp)
				PUT_STR(k, "X-Forwarded-Proto", xfp->value, xfp->vlen);
			xfp = h;
			continue;
		}
		if (NAMED(h, "X-Request-Id"))
			have_reqid = true;
		put(k, h->name, h->nlen, h->value, h->vlen);
	}
	forwarded(k, "X-Forwarded-For", 15, xff, f->peer_ip);
	forwarded(k, "X-Forwarded-Proto", 17, xfp, f->tls ? "https" : "http");
	if (!have_reqid)
		PUT_STR(k, "X-Request-Id", f->reqid, strlen(f->reqid));
	deadline_fields(f, k);
	if (!f->nested)
		PUT_INT(k, "X-Retrygate-Attempt", f->attempt);
	/* gRFC A6's own marker, so the server (and its metrics) see a retry as gRPC names it */
	if (f->grpc && !f->nested && f->attempt > 1)
		PUT_INT(k, "grpc-previous-rpc-attempts", f->attempt - 1);
}

void forward_h1_head(const struct forward_req *f, struct evbuffer *b)
{
	const struct http_head *r = f->req;
	struct sink k = { .b = b };
	evbuffer_expand(b, 1024);
	evbuffer_add(b, r->method, strlen(r->method));
	evbuffer_add(b, " ", 1);
	evbuffer_add(b, r->path, r->path_len);
	evbuffer_add(b, " HTTP/1.1\r\n", 11);
	const char *host;
	size_t hlen;
	authority(f, &host, &hlen);
	PUT_STR(&k, "Host", host, hlen);
	fields(f, &k);
	if (r->upgrade) {
		size_t n = 0;
		const char *u = http_head_get(r, "Upgrade", &n);
		evbuffer_add(b, "Connection: upgrade\r\n", 21);
		PUT_STR(&k, "Upgrade", u ? u : "", u ? n : 0);
	}
	framing(f, &k);
	evbuffer_add(b, "\r\n", 2);
}

/* Does the client's TE list "trailers"? (te: trailers is the one TE HTTP/2 allows.) */
static bool te_trailers(const struct http_head *r)
{
	for (int i = 0; i < r->nhdrs; i++) {
		const struct http_hdr *h = &r->hdrs[i];
		if (!NAMED(h, "TE"))
			continue;
		for (size_t j = 0; j + 8 <= h->vlen; j++)
			if (str_ieq(h->value + j, 8, "trailers", 8) &&
			    (j == 0 || h->value[j - 1] == ',' || h->value[j - 1] == ' ') &&
			    (j + 8 == h->vlen || h->value[j + 8] == ',' || h->value[j + 8] == ' ' ||
			     h->value[j + 8] == ';'))
				return true;
	}
	return false;
}

void forward_h2_headers(const struct forward_req *f, bool up_tls, struct forward_nv *out)
{
	const struct http_head *r = f->req;
	struct sink k = { .nv = out };
	out->n = out->used = 0;
	nv_add(out, ":method", 7, r->method, strlen(r->method), NULL, 0, NULL, 0);
	nv_add(out, ":scheme", 7, up_tls ? "https" : "http", up_tls ? 5 : 4, NULL, 0, NULL, 0);
	const char *host;
	size_t hlen;
	authority(f, &host, &hlen);
	nv_add(out, ":authority", 10, host, hlen, NULL, 0, NULL, 0);
	nv_add(out, ":path", 5, r->path, r->path_len, NULL, 0, NULL, 0);
	fields(f, &k);
	/* gRPC servers refuse a call without it (it says the client reads trailers); exactly
	 * one, the client's own TE being hop-by-hop and dropped above */
	if (f->grpc || te_trailers(r))
		PUT_STR(&k, "te", "trailers", 8);
	framing(f, &k);
	for (size_t i = 0; i < out->n; i++) {
		out->nv[i].name = (uint8_t *)out->arena + (uintptr_t)out->nv[i].name;
		out->nv[i].value = (uint8_t *)out->arena + (uintptr_t)out->nv[i].value;
	}
}

void forward_nv_free(struct forward_nv *o)
{
	free(o->nv);
	free(o->arena);
	memset(o, 0, sizeof(*o));
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
