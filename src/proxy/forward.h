/*
 * forward: the request one attempt sends upstream, as a pure function of the client's request
 * and the attempt's facts (SPEC §3, §4 markers, §8): one Host (host_rewrite, else the client's,
 * else the endpoint's name), hop-by-hop fields removed, X-Forwarded-For/-Proto appended,
 * X-Request-Id added when absent, X-Timeout-Ms and every other deadline header the client sent
 * rewritten to this attempt's time, X-Retrygate-Attempt N (unless the request arrived marked
 * as a retry: then its markers go on unchanged), and framing computed here.
 */
#ifndef RG_FORWARD_H
#define RG_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include <stddef.h>

#include <nghttp2/nghttp2.h>

#include "policy/deadline.h"

struct evbuffer;
struct http_head;

struct forward_req {
	const struct http_head *req;
	const char *host_rewrite;       /* NULL or "": the client's Host */
	const char *endpoint;           /* "host:port": Host when the client sent none */
	const char *peer_ip;
	bool tls;                       /* the client connection: X-Forwarded-Proto https */
	const char *reqid;              /* X-Request-Id when the client sent none */
	const bool *dl_present;         /* [DL_NKINDS]: the deadline headers the client sent */
	int64_t wait_us;                /* the time the attempt is told it has: how long it
	                                 * will be waited for (gRPC: the call's remaining time) */
	int attempt;                    /* 1-based */
	bool nested;                    /* arrived marked as a retry: markers unchanged */
	bool hedge;                     /* a hedge (SPEC §14): X-Retrygate-Hedge: 1 */
	bool streamed;                  /* body streamed: the client's framing (length or chunked),
	                                 * and its Expect: 100-continue goes along */
	int64_t body_len;               /* buffered body: Content-Length (if any body or framing) */
	bool grpc;                      /* SPEC §10 markers: exactly one te: trailers, grpc-timeout
	                                 * = grpc_timeout_format(wait_us) replacing the client's,
	                                 * and unless nested grpc-previous-rpc-attempts: attempt-1
	                                 * on attempt > 1 (the client's dropped) */
};

#define FORWARD_ID_MAX 132

/* The request's id: the client's X-Request-Id (truncated to fit), else 32 random hex digits
 * (added upstream, SPEC §8). The access log names the request by it. */
void forward_request_id(const struct http_head *req, char out[FORWARD_ID_MAX], uint64_t *rng);

/* Append the HTTP/1.1 request head to OUT. */
void forward_h1_head(const struct forward_req *f, struct evbuffer *out);

/* The same request as an HTTP/2 field list (SPEC §9 mapping): :method, :scheme (https when
 * UP_TLS), :authority (host_rewrite, else the client's Host or :authority, else the endpoint),
 * :path, then the fields of forward_h1_head with lowercase names, no host and no
 * connection-specific field, te: trailers only when the client's TE listed it, a length when
 * known and never chunked. OUT (forward_nv_init, or reused) owns the values and the client's
 * names, all in arena[0, used): they stay valid until the next call or forward_nv_free(); the
 * names retrygate writes itself are string literals, pointed at. A request's list usually fits
 * the struct itself (no allocation); x-request-id and the deadline fields carry
 * NGHTTP2_NV_FLAG_NO_INDEX. */
#define FORWARD_NV_INLINE 32
struct forward_nv {
	nghttp2_nv *nv;
	size_t n, cap;
	char *arena;
	size_t used, acap;
	nghttp2_nv inl_nv[FORWARD_NV_INLINE];
	char inl[1024];
};
/* Ready for forward_h2_headers(), on the struct's own storage (not zeroed: it is 2 KiB). */
static inline void forward_nv_init(struct forward_nv *o)
{
	o->nv = o->inl_nv;
	o->cap = FORWARD_NV_INLINE;
	o->arena = o->inl;
	o->acap = sizeof(o->inl);
	o->n = o->used = 0;
}
void forward_h2_headers(const struct forward_req *f, bool up_tls, struct forward_nv *out);
void forward_nv_free(struct forward_nv *o);

#endif
