/*
 * forward: the upstream request head, HTTP/1.1 or HTTP/2 (see forward.h). Pure: no clock,
 * no state.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/forward.h"
#include "http/grpc.h"
#include "http/h1_write.h"
#include "http/h1_parser.h"
#include "base/util.h"

static bool named(const struct http_hdr *h, const char *name, size_t nlen)
{
	return str_ieq(h->name, h->nlen, name, nlen);
}

#define NAMED(h, lit) named((h), lit, sizeof(lit) - 1)

/* How nv_add() takes a field's name */
enum nname {
	NAME_OURS,      /* a literal of retrygate's: pointed at, never copied */
	NAME_COPY,      /* the client's, lowercase already (an HTTP/2 client's: uppercase is
	                 * malformed, SPEC §9) */
	NAME_LOWER,     /* the client's, lowercased (an HTTP/1 client's) */
};

/* Where the fields go: an HTTP/1.1 head (names as they came) or an HTTP/2 field list
 * (names lowercased). One walk over the client's fields serves both, so the two protocols
 * cannot drift apart in what they forward. */
struct sink {
	struct h1_out *o;               /* HTTP/1.1 */
	struct forward_nv *nv;          /* HTTP/2 */
	enum nname client;              /* HTTP/2: how the client's names go */
};

/* A field name retrygate writes itself, in both spellings: lowercasing it per request would
 * cost more than the rest of the field. */
struct fname {
	const char *h1, *h2;
	size_t len;
};
#define FNAME(var, h1, h2) static const struct fname var = { h1, h2, sizeof(h1) - 1 }
FNAME(F_XFF, "X-Forwarded-For", "x-forwarded-for");
FNAME(F_XFP, "X-Forwarded-Proto", "x-forwarded-proto");
FNAME(F_XRID, "X-Request-Id", "x-request-id");
FNAME(F_XTMS, "X-Timeout-Ms", "x-timeout-ms");
FNAME(F_XRA, "X-Retrygate-Attempt", "x-retrygate-attempt");
FNAME(F_XRH, "X-Retrygate-Hedge", "x-retrygate-hedge");
FNAME(F_GPRA, "grpc-previous-rpc-attempts", "grpc-previous-rpc-attempts");
FNAME(F_EXPECT, "Expect", "expect");
FNAME(F_CL, "Content-Length", "content-length");
FNAME(F_TE, "te", "te");

/* A pointer into arena[FROM, FROM + LEN] (an empty value may point at its end) now at TO's */
static uint8_t *moved(uint8_t *p, const char *from, size_t len, char *to)
{
	uintptr_t d = (uintptr_t)p - (uintptr_t)from;
	return d <= len ? (uint8_t *)to + d : p;
}

/* Room for N more bytes and one more field; the first ones go in the struct's own storage. */
static void nv_room(struct forward_nv *o, size_t need)
{
	if (o->used + need > o->acap) {
		size_t cap = o->acap * 2;
		while (cap < o->used + need)
			cap *= 2;
		char *a = xmalloc(cap);
		memcpy(a, o->arena, o->used);
		/* rare: the fields so far point into the old arena (names of ours do not) */
		for (size_t i = 0; i < o->n; i++) {
			o->nv[i].name = moved(o->nv[i].name, o->arena, o->used, a);
			o->nv[i].value = moved(o->nv[i].value, o->arena, o->used, a);
		}
		if (o->arena != o->inl)
			free(o->arena);
		o->arena = a;
		o->acap = cap;
	}
	if (o->n == o->cap) {
		nghttp2_nv *v = xmalloc(o->cap * 2 * sizeof(*v));
		memcpy(v, o->nv, o->n * sizeof(*v));
		if (o->nv != o->inl_nv)
			free(o->nv);
		o->nv = v;
		o->cap *= 2;
	}
}

/* One field, its name taken as HOW says. FLAGS: NGHTTP2_NV_FLAG_NO_INDEX for a value
 * that differs in every request (x-request-id, the deadline fields): indexed, each would enter
 * the connection's HPACK table, evict the fields that repeat, and make the encoder compare every
 * same-name entry on each lookup. Sent as never-indexed literals (RFC 7541 §6.2.3) instead. */
static inline __attribute__((always_inline))
void nv_add(struct forward_nv *o, const char *name, size_t nlen, enum nname how, uint8_t flags,
            const char *v1, size_t l1, const char *v2, size_t l2, const char *v3, size_t l3)
{
	size_t nbytes = how == NAME_OURS ? 0 : nlen;
	size_t need = nbytes + l1 + l2 + l3;
	nv_room(o, need);
	nghttp2_nv *e = &o->nv[o->n++];
	char *p = o->arena + o->used;
	if (how == NAME_OURS) {
		e->name = (uint8_t *)(uintptr_t)name;
	} else {
		if (how == NAME_COPY)
			memcpy(p, name, nlen);
		else
			ascii_lower_copy(p, name, nlen);
		e->name = (uint8_t *)p;
	}
	e->namelen = nlen;
	p += nbytes;
	e->value = (uint8_t *)p;
	if (l1)
		memcpy(p, v1, l1);
	if (l2)
		memcpy(p + l1, v2, l2);
	if (l3)
		memcpy(p + l1 + l2, v3, l3);
	e->valuelen = l1 + l2 + l3;
	e->flags = flags;
	o->used += need;
}

/* A field of the client's */
static void put_client(struct sink *k, const struct http_hdr *h, uint8_t flags)
{
	if (k->o)
		h1_field(k->o, h->name, h->nlen, h->value, h->vlen);
	else
		nv_add(k->nv, h->name, h->nlen, k->client, flags, h->value, h->vlen, NULL, 0, NULL, 0);
}

/* A field of retrygate's: NAME's spelling for the protocol */
static inline __attribute__((always_inline))
void put3(struct sink *k, const struct fname *f, uint8_t flags, const char *v1, size_t l1,
          const char *v2, size_t l2, const char *v3, size_t l3)
{
	if (k->o)
		h1_field3(k->o, f->h1, f->len, v1, l1, v2, l2, v3, l3);
	else
		nv_add(k->nv, f->h2, f->len, NAME_OURS, flags, v1, l1, v2, l2, v3, l3);
}

static void put(struct sink *k, const struct fname *f, uint8_t flags, const char *v, size_t vlen)
{
	put3(k, f, flags, v, vlen, NULL, 0, NULL, 0);
}

static void put_int(struct sink *k, const struct fname *f, int64_t v)
{
	char d[24];
	put(k, f, NGHTTP2_NV_FLAG_NONE, d, h1_fmt_int(d, v));
}

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
static void forwarded(struct sink *k, const struct fname *name, const struct http_hdr *last,
                      const char *ours)
{
	if (last)
		put3(k, name, NGHTTP2_NV_FLAG_NONE, last->value, last->vlen, ", ", 2, ours, strlen(ours));
	else
		put(k, name, NGHTTP2_NV_FLAG_NONE, ours, strlen(ours));
}

static void deadline_fields(const struct forward_req *f, struct sink *k)
{
	char v[DEADLINE_FMT_MAX];
	int n = deadline_format(DL_X_TIMEOUT_MS, f->wait_us, v, sizeof(v));
	put(k, &F_XTMS, NGHTTP2_NV_FLAG_NO_INDEX, v, (size_t)(n > 0 ? n : 0));
	for (int i = 1; i < DL_NKINDS; i++) {
		/* SPEC §10: a gRPC server enforces the deadline natively only if it is told in its
		 * own header, so every attempt of a call carries one, sent or not by the client */
		if (!f->dl_present[i] && !(f->grpc && i == DL_GRPC_TIMEOUT))
			continue;
		n = deadline_format((enum dl_kind)i, f->wait_us, v, sizeof(v));
		/* the other kinds are spelled lowercase in the table */
		struct fname nm = { deadline_header_name[i], deadline_header_name[i],
		                    deadline_header_len[i] };
		put(k, &nm, NGHTTP2_NV_FLAG_NO_INDEX, v, (size_t)(n > 0 ? n : 0));
	}
}

/* Body framing. HTTP/2 has no chunked coding: a length when known, else DATA frames alone. */
static void framing(const struct forward_req *f, struct sink *k)
{
	const struct http_head *r = f->req;
	if (f->streamed) {
		if (r->expect_continue)
			put(k, &F_EXPECT, NGHTTP2_NV_FLAG_NONE, "100-continue", 12);
		if (r->content_length >= 0)
			put_int(k, &F_CL, r->content_length);
		else if (k->o)
			H1_FIELD_STR(k->o, "Transfer-Encoding", "chunked", 7);
	} else if (f->body_len > 0 || r->content_length >= 0 || r->chunked) {
		put_int(k, &F_CL, f->body_len);
	}
}

/* What fields() does with a field of the client's */
enum ckind { CK_COPY, CK_SKIP, CK_XRA, CK_GPRA, CK_XFF, CK_XFP, CK_XRID, CK_DEADLINE };

/* By length first: most fields are told apart without comparing a byte. */
static enum ckind client_kind(const struct http_hdr *h)
{
	if (h->hop)
		return CK_SKIP;
	if (h->nlen > 0 && h->name[0] == ':')
		return CK_SKIP;     /* an HTTP/2 client's pseudo-headers are ours to rebuild */
	switch (h->nlen) {
	case 4:
		return NAMED(h, "Host") ? CK_SKIP : CK_COPY;
	case 6:
		return NAMED(h, "Expect") ? CK_SKIP : CK_COPY;
	case 12:
		if (NAMED(h, "X-Request-Id"))
			return CK_XRID;
		break;
	case 15:
		return NAMED(h, "X-Forwarded-For") ? CK_XFF : CK_COPY;
	case 17:
		return NAMED(h, "X-Forwarded-Proto") ? CK_XFP : CK_COPY;
	case 19:
		return NAMED(h, "X-Retrygate-Attempt") ? CK_XRA : CK_COPY;
	case 26:
		if (NAMED(h, "grpc-previous-rpc-attempts"))
			return CK_GPRA;
		break;
	}
	return deadline_header_kind(h->name, h->nlen) >= 0 ? CK_DEADLINE : CK_COPY;
}

/* Every field after the request line / pseudo-headers, in the order both protocols share */
static void fields(const struct forward_req *f, struct sink *k)
{
	const struct http_head *r = f->req;
	const struct http_hdr *xff = NULL, *xfp = NULL;
	bool have_reqid = false;
	for (int i = 0; i < r->nhdrs; i++) {
		const struct http_hdr *h = &r->hdrs[i];
		uint8_t flags = NGHTTP2_NV_FLAG_NONE;
		switch (client_kind(h)) {
		case CK_SKIP:
		case CK_DEADLINE:       /* rewritten below */
			continue;
		case CK_XRA:
			if (!f->nested)
				continue;
			break;
		case CK_GPRA:
			if (f->grpc && !f->nested)
				continue;   /* ours below: this hop's count, not the client's */
			break;
		case CK_XFF:
			if (xff)
				put(k, &F_XFF, NGHTTP2_NV_FLAG_NONE, xff->value, xff->vlen);
			xff = h;
			continue;
		case CK_XFP:
			if (xfp)
				put(k, &F_XFP, NGHTTP2_NV_FLAG_NONE, xfp->value, xfp->vlen);
			xfp = h;
			continue;
		case CK_XRID:
			have_reqid = true;
			flags = NGHTTP2_NV_FLAG_NO_INDEX;
			break;
		case CK_COPY:
			break;
		}
		put_client(k, h, flags);
	}
	forwarded(k, &F_XFF, xff, f->peer_ip);
	forwarded(k, &F_XFP, xfp, f->tls ? "https" : "http");
	if (!have_reqid)
		put(k, &F_XRID, NGHTTP2_NV_FLAG_NO_INDEX, f->reqid, strlen(f->reqid));
	deadline_fields(f, k);
	if (!f->nested)
		put_int(k, &F_XRA, f->attempt);
	if (f->hedge)
		put(k, &F_XRH, 0, "1", 1);     /* SPEC §14 */
	/* gRFC A6's own marker, so the server (and its metrics) see a retry as gRPC names it */
	if (f->grpc && !f->nested && f->attempt > 1)
		put_int(k, &F_GPRA, f->attempt - 1);
}

void forward_h1_head(const struct forward_req *f, struct evbuffer *b)
{
	const struct http_head *r = f->req;
	struct h1_out o;
	struct sink k = { .o = &o };
	h1_out_begin(&o, b);
	h1_out_add(&o, r->method, strlen(r->method));
	h1_out_add(&o, " ", 1);
	h1_out_add(&o, r->path, r->path_len);
	H1_OUT_LIT(&o, " HTTP/1.1\r\n");
	const char *host;
	size_t hlen;
	authority(f, &host, &hlen);
	H1_FIELD_STR(&o, "Host", host, hlen);
	fields(f, &k);
	if (r->upgrade) {
		size_t n = 0;
		const char *u = http_head_get(r, "Upgrade", &n);
		H1_OUT_LIT(&o, "Connection: upgrade\r\n");
		H1_FIELD_STR(&o, "Upgrade", u ? u : "", u ? n : 0);
	}
	framing(f, &k);
	H1_OUT_LIT(&o, "\r\n");
	h1_out_end(&o);
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
	struct sink k = { .nv = out, .client = r->version == 20 ? NAME_COPY : NAME_LOWER };
	out->n = out->used = 0;
	const uint8_t none = NGHTTP2_NV_FLAG_NONE;
	nv_add(out, ":method", 7, NAME_OURS, none, r->method, strlen(r->method), NULL, 0, NULL, 0);
	nv_add(out, ":scheme", 7, NAME_OURS, none, up_tls ? "https" : "http", up_tls ? 5 : 4, NULL, 0,
	       NULL, 0);
	const char *host;
	size_t hlen;
	authority(f, &host, &hlen);
	nv_add(out, ":authority", 10, NAME_OURS, none, host, hlen, NULL, 0, NULL, 0);
	nv_add(out, ":path", 5, NAME_OURS, none, r->path, r->path_len, NULL, 0, NULL, 0);
	fields(f, &k);
	/* gRPC servers refuse a call without it (it says the client reads trailers); exactly
	 * one, the client's own TE being hop-by-hop and dropped above */
	if (f->grpc || te_trailers(r))
		put(&k, &F_TE, none, "trailers", 8);
	framing(f, &k);
}

void forward_nv_free(struct forward_nv *o)
{
	if (o->nv != o->inl_nv)
		free(o->nv);
	if (o->arena != o->inl)
		free(o->arena);
	forward_nv_init(o);
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
