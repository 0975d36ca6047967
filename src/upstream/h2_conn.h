/*
 * h2_conn: the HTTP/2 transport under the attempt (SPEC §9 upstream side). Per worker loop and
 * endpoint, multiplexed connections (prior knowledge, or TLS with ALPN h2): a stream goes on
 * the first one with room under the server's SETTINGS_MAX_CONCURRENT_STREAMS, another is
 * opened when all are full; after a GOAWAY a connection takes no new stream.
 *
 * A stream's HEADERS count as sent only once the frame was serialized and a byte of it left
 * our output buffer: a stream closed before that (queued behind the server's limit, refused,
 * above a GOAWAY's last-stream-id) was not processed and ends as OUT_CONNECT_FAILURE.
 * Every stream ends exactly once through on_close, unless its owner cancelled it first.
 */
#ifndef RG_H2_CONN_H
#define RG_H2_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nghttp2/nghttp2.h>
#include <openssl/ssl.h>

#include "policy/retry.h"

struct loop;
struct ep_state;
struct pool_ep;
struct evbuffer;
struct http_head;
struct http_hdr;
struct h2_upstream_stream;

struct h2_upstream_cbs {
	/* A response head (1xx, or the final one). */
	void (*on_head)(void *arg, const struct http_head *h);
	/* Response DATA: the callee hands back what it consumed with h2_upstream_consume(). */
	void (*on_data)(void *arg, const uint8_t *data, size_t len);
	void (*on_trailers)(void *arg, const struct http_hdr *t, int n);
	/* The streamed request body left our buffer: room for more. */
	void (*on_drain)(void *arg);
	/* The end (the stream is gone; do not touch it again): OUT_NONE = the response ended
	 * with END_STREAM; else OUT_CONNECT_FAILURE (not processed) or OUT_RESET (BAD: the
	 * server sent an invalid response head, SPEC §4 "bad-response"). */
	void (*on_close)(void *arg, enum outcome out, bool bad, const char *detail);
};

struct h2_open {
	const nghttp2_nv *nv;           /* lowercase names; copied */
	size_t nvlen;
	const char *nv_bytes;           /* the bytes NV's names and values lie in: the stream
	                                 * keeps one copy until its HEADERS left (NULL: nghttp2
	                                 * copies each field) */
	size_t nv_bytes_len;
	struct evbuffer *body;          /* complete body (referenced, not drained) or NULL */
	bool streaming;                 /* more body through h2_upstream_send_body() */
	const struct http_hdr *trailers;    /* request trailers (copied), or NULL: SPEC §9 relays
	                                     * them between HTTP/2 peers */
	int ntrailers;
	int64_t connect_timeout_us;     /* for a connection this stream makes us open */
	SSL_CTX *tls;                   /* NULL: cleartext, prior knowledge */
	const char *sni;
	bool verify;
};

/* Open a stream towards EP (PE holds its address). Never calls back before returning. */
struct h2_upstream_stream *h2_upstream_open(struct loop *l, struct ep_state *ep,
                                            struct pool_ep *pe, const struct h2_open *o,
                                            const struct h2_upstream_cbs *cbs, void *arg);
/* The owner gives up: RST_STREAM CANCEL if it was sent, no callback ever again. */
void h2_upstream_cancel(struct h2_upstream_stream *s);
bool h2_upstream_sent(const struct h2_upstream_stream *s);

void h2_upstream_send_body(struct h2_upstream_stream *s, struct evbuffer *data);
void h2_upstream_body_end(struct h2_upstream_stream *s);
/* Trailer fields to send after the streamed body (copied; before h2_upstream_body_end). */
void h2_upstream_send_trailers(struct h2_upstream_stream *s, const struct http_hdr *t, int n);
size_t h2_upstream_pending(const struct h2_upstream_stream *s);
/* N bytes of DATA were taken by the owner: open the flow-control windows by as much. */
void h2_upstream_consume(struct h2_upstream_stream *s, size_t n);

/* Worker exit, called down: GOAWAY on every connection and take no new stream; then free. */
void h2_drain(struct loop *l);
void h2_free_all(struct loop *l);

#endif
