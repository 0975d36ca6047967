/*
 * transport: what the attempt sees of the way one request goes to an endpoint and its response
 * comes back. Two implement it: an HTTP/1.1 connection of its own (h1_conn.c, pooled between
 * requests) and a stream on a shared HTTP/2 connection (h2_conn.c). The attempt picks one when
 * it starts and speaks only this interface after that.
 *
 * Invariants, both transports:
 *   - open never calls back before it returned; it fails only at once (returns NULL and why).
 *   - Every opened transport ends exactly once through on_close, unless its owner cancelled it
 *     first: after either, the owner never touches it again and it never calls back again.
 *   - on_close's OUT_CONNECT_FAILURE means the request was provably not processed (not
 *     connected, nothing written, refused, above a GOAWAY); OUT_RESET that it may have been,
 *     with BAD when the head received was invalid HTTP (SPEC §4 "bad-response"); OUT_NONE
 *     that the response ended cleanly. A timer of the opener's that cuts the request asks
 *     sent() to tell the two apart.
 *   - Decoded response body bytes are appended to the opener's buffer (transport_req.body_out)
 *     and announced by on_data; the opener says what it took (consume) or that it takes
 *     nothing for now (pause): the HTTP/2 windows or the HTTP/1 socket reads follow.
 */
#ifndef RG_TRANSPORT_H
#define RG_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nghttp2/nghttp2.h>
#include <openssl/ssl.h>

#include "policy/retry.h"

struct loop;
struct ep_state;
struct evbuffer;
struct stream;
struct http_head;
struct http_hdr;
struct transport;

struct transport_cbs {
	/* A response head: 1xx (more follow) or the final one (>= 200, or 101 over HTTP/1). */
	void (*on_head)(void *arg, const struct http_head *h);
	/* More decoded response body bytes were appended to body_out. */
	void (*on_data)(void *arg);
	/* Trailer fields after the body (HTTP/2 only: an HTTP/1 transport never reports them). */
	void (*on_trailers)(void *arg, const struct http_hdr *t, int n);
	/* The streamed request body left our buffer: room for more. */
	void (*on_drain)(void *arg);
	/* The end (see above): the transport is gone. */
	void (*on_close)(void *arg, enum outcome out, bool bad, const char *detail);
};

struct transport_req {
	struct evbuffer *body;          /* replayable body (referenced, not taken) or NULL; with
	                                 * streaming (HTTP/2 only) it may grow, and an empty
	                                 * send_body() says it did */
	bool streaming;                 /* more body through send_body() */
	struct evbuffer *body_out;      /* the opener's: decoded response body goes here */
	int64_t connect_timeout_us;     /* for a connection this request makes us open */
	SSL_CTX *tls;                   /* TLS to the upstream, or NULL */
	const char *sni;                /* server name ("": none); the opener's, kept while open */
	bool verify;
	/* HTTP/1 */
	struct evbuffer *head;          /* serialized request head (taken, also when open fails) */
	bool chunked;                   /* encode the streamed body as chunked */
	bool is_head;                   /* HEAD request: the response has no body */
	bool fresh_conn;                /* do not reuse a pooled connection */
	bool other_conn;                /* HTTP/2: a connection with no stream in flight */
	/* HTTP/2 */
	const nghttp2_nv *nv;           /* lowercase names; copied */
	size_t nvlen;
	const char *nv_bytes;           /* the bytes every value of NV lies in, and every name
	                                 * that is not a string literal: the stream keeps one copy
	                                 * until its HEADERS left (NULL: nghttp2 copies each
	                                 * field) */
	size_t nv_bytes_len;
	const struct http_hdr *trailers;    /* request trailers (copied), or NULL: SPEC §9 relays
	                                     * them between HTTP/2 peers */
	int ntrailers;
};

struct transport_ops {
	/* Start the request towards EP. NULL: it failed at once (*ERR says why; not processed). */
	struct transport *(*open)(struct loop *l, struct ep_state *ep, const struct transport_req *r,
	                          const struct transport_cbs *cbs, void *arg, const char **err);
	/* The owner gives up: the request is cut (a connection closed, a stream reset). */
	void (*cancel)(struct transport *t);
	/* Some of the request left (a byte was written, or the HEADERS went out). */
	bool (*sent)(const struct transport *t);
	/* Streamed request body bytes not yet written. */
	size_t (*pending)(const struct transport *t);
	void (*send_body)(struct transport *t, struct evbuffer *data);
	/* Request trailers to send after the streamed body (before body_end); HTTP/1 drops them
	 * (SPEC §9: trailers cross only between HTTP/2 peers). */
	void (*send_trailers)(struct transport *t, const struct http_hdr *f, int n);
	void (*body_end)(struct transport *t);
	/* N bytes of body_out were taken by the opener (HTTP/2: the windows open by as much). */
	void (*consume)(struct transport *t, size_t n);
	/* The opener takes no body for now / again (HTTP/1: the socket is not read meanwhile). */
	void (*pause)(struct transport *t, bool paused);
	/* After a 101: the raw connection, and the bytes read after the head, for a tunnel; the
	 * transport is gone. NULL in a transport that cannot upgrade (HTTP/2). */
	struct stream *(*take_stream)(struct transport *t);
};

/* The first member of each transport's object. */
struct transport {
	const struct transport_ops *ops;
};

#endif
