/*
 * attempt: one try of one request against one endpoint: take a pooled connection or open
 * one, write the head and body, read the response head and body, and classify the outcome:
 * connect-failure (no byte of the request written), reset (closed, reset or invalid after
 * writing), timeout (no head in time), or a status. It makes no retry decision: it reports
 * through the callbacks it was handed (DESIGN rule 7) and the exchange decides.
 *
 * The transport (transport.h) is an HTTP/1.1 connection (h1_conn.c: pooled, or a fresh one)
 * or, with req->h2, a stream on a multiplexed HTTP/2 connection (h2_conn.c): REFUSED_STREAM,
 * above-GOAWAY and never-sent streams are connect-failures there, other resets are resets.
 *
 * The owner frees an attempt with attempt_free() at any time, including from inside one of
 * its callbacks (an HTTP/2 stream in flight is then reset with CANCEL); the connection is
 * pooled only if the response completed cleanly.
 */
#ifndef RG_ATTEMPT_H
#define RG_ATTEMPT_H

#include <stdbool.h>
#include <stdint.h>

#include <nghttp2/nghttp2.h>

#include "policy/retry.h"

struct loop;
struct ep_state;
struct evbuffer;
struct http_head;
struct http_hdr;
struct attempt;

struct attempt_cbs {
	/* A response head: 1xx (then more follow) or final. */
	void (*on_head)(void *arg, struct attempt *a, const struct http_head *h);
	/* Decoded response body bytes in DATA: the callee must drain what it takes. */
	void (*on_body)(void *arg, struct attempt *a, struct evbuffer *data);
	/* Trailer fields after the body (HTTP/2 transports only; NULL-safe: an HTTP/1 attempt
	 * never reports them), before on_end. */
	void (*on_trailers)(void *arg, struct attempt *a, const struct http_hdr *t, int n);
	/* The request body written so far has drained to the socket: send more. */
	void (*on_drain)(void *arg, struct attempt *a);
	/* The end. Before a final head: OUT_CONNECT_FAILURE / OUT_RESET / OUT_TIMEOUT
	 * (bad_response: the peer sent invalid HTTP). After it: OUT_NONE = complete, OUT_RESET =
	 * the body broke off. The attempt is finished; the owner still calls attempt_free(). */
	void (*on_end)(void *arg, struct attempt *a, enum outcome out, bool bad_response,
	               const char *detail);
};

struct attempt_req {
	struct evbuffer *head;          /* serialized request head (taken); NULL with h2 */
	struct evbuffer *body;          /* replayable body (referenced, not taken) or NULL; with
	                                 * streaming (HTTP/2 only) it may grow, and an empty
	                                 * send_body() says it did */
	bool streaming;                 /* body arrives later through attempt_send_body() */
	bool chunked;                   /* encode the streamed body as chunked */
	bool is_head;                   /* HEAD request: the response has no body */
	bool fresh_conn;                /* do not reuse a pooled connection */
	bool other_conn;                /* HTTP/2: not over a connection with streams in flight
	                                 * (a hedge to an endpoint its request already uses) */
	int64_t connect_timeout_us;
	int64_t head_timeout_us;        /* 0: none (the exchange's deadline timer governs) */
	struct ssl_ctx_st *tls;         /* TLS to the upstream, or NULL */
	const char *sni;                /* server name to send and, with verify, to check */
	bool verify;
	/* HTTP/2 upstream (protocol: h2): the request as a field list (copied when the attempt
	 * starts) instead of HEAD, sent on a stream of a shared connection (h2_conn.c) */
	bool h2;
	const nghttp2_nv *nv;
	size_t nvlen;
	const char *nv_bytes;           /* the bytes every value of NV lies in, and every name
	                                 * that is not a string literal */
	size_t nv_bytes_len;
	const struct http_hdr *trailers;    /* HTTP/2: request trailers known at the start (copied) */
	int ntrailers;
};

struct attempt *attempt_start(struct loop *loop, struct ep_state *ep, struct attempt_req *req,
                              const struct attempt_cbs *cbs, void *arg);
void attempt_free(struct attempt *a);

/* Streaming request body */
void attempt_send_body(struct attempt *a, struct evbuffer *data);
void attempt_send_body_end(struct attempt *a);
/* Request trailers, before attempt_send_body_end(): sent to an HTTP/2 upstream, dropped for
 * HTTP/1 (SPEC §9: trailers cross only between HTTP/2 peers). */
void attempt_send_trailers(struct attempt *a, const struct http_hdr *t, int n);
size_t attempt_send_pending(const struct attempt *a);

/* Response backpressure */
void attempt_pause(struct attempt *a);
void attempt_resume(struct attempt *a);

bool attempt_wrote_any(const struct attempt *a);
const char *attempt_peer(const struct attempt *a);

/* Upgrade: after a 101 head, take the raw connection (and bytes already read) for a tunnel. */
struct stream *attempt_take_stream(struct attempt *a);

#endif
