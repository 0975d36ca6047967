/*
 * h2_conn_impl: what the two halves of the HTTP/2 transport share (private to src/upstream/):
 * h2_conn.c runs the connections (connect, read, flush, fail, retire, drain), h2_stream.c the
 * streams on them (open, send, the nghttp2 callbacks that turn frames into a stream's head,
 * data, trailers and end).
 *
 * Connection states: UC_CONNECTING -> UC_READY -> UC_GOAWAY (the peer's GOAWAY, or our drain:
 * no new stream, the rest finish) -> UC_DEAD (unlinked, every stream reported, freed once the
 * callback stack unwound). Streams: US_OPEN (no final head) -> US_BODY -> US_CLOSED. (UC_, US_,
 * h2u_, h2_upstream_: the upstream side; the client side's streams are in src/client/.)
 * Each state has one writer: conn_set_state in h2_conn.c, h2u_set_state in h2_stream.c.
 *
 * Frames are serialized with nghttp2_session_mem_send into the stream's output only while the
 * output is below H2_OUT_HIGH and never from inside an nghttp2 callback (c->busy): a flush
 * asked for meanwhile runs when the outer call returns. Received DATA opens the windows only
 * as the owner consumes it (no automatic WINDOW_UPDATE): backpressure towards the server.
 */
#ifndef RG_H2_CONN_IMPL_H
#define RG_H2_CONN_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include <event2/event_struct.h>
#include <nghttp2/nghttp2.h>
#include <openssl/ssl.h>

#include "upstream/transport.h"
#include "http/h1_parser.h"

struct loop;
struct ep_state;
struct pool_ep;
struct stream;
struct evbuffer;

/* distinct from the client side's (h2_session_impl.h): a stream of one side handed to the
 * other fails the check */
#define H2U_CONN_MAGIC 0x4832c0a1u
#define H2U_STREAM_MAGIC 0x48557e5bu
#define H2_HEAD_MAX (64 * 1024)         /* response header block, as for HTTP/1.1 */
#define H2_MAX_FIELDS 100               /* ... and its fields */

enum h2u_conn_state { UC_CONNECTING, UC_READY, UC_GOAWAY, UC_DEAD };
enum h2u_stream_state { US_OPEN, US_BODY, US_CLOSED };

struct hfield {
	uint32_t noff, nlen, voff, vlen;
};

struct h2_upstream_stream {
	struct transport t;             /* first: what the attempt holds */
	uint32_t magic;
	enum h2u_stream_state state;
	struct h2_conn *c;
	int32_t id;
	struct transport_cbs cbs;
	void *arg;
	struct evbuffer *body_out;      /* the opener's: response DATA goes here */
	struct ep_state *ep;            /* the opener's (alive while the stream is) */
	nghttp2_nv *nv;                 /* the field list, kept while the HEADERS may have to move
	                                 * to another connection (h2u_move): opened before the
	                                 * server's limit was known; NULL otherwise */
	size_t nvlen;
	bool has_body;
	bool hdr_queued;                /* our HEADERS were serialized, starting at hdr_mark */
	uint64_t hdr_mark;
	bool streaming, body_ended, drain_due, data_deferred, bad_head;
	struct evbuffer *body;          /* referenced replayable body, read from body_off */
	size_t body_off;
	struct evbuffer *pending;       /* streamed body not yet taken by nghttp2 */
	nghttp2_nv *tnv;                /* request trailers, sent when the body ends */
	size_t ntnv;
	char *tmem;
	int status;
	/* the response's checks (RFC 9113 §8.1-8.3; nghttp2's HTTP messaging is off): RC_* */
	uint8_t rchk;
	int64_t resp_cl;                /* what the final head's content-length says, or -1 */
	uint64_t resp_bytes;            /* response DATA received */
	TAILQ_ENTRY(h2_upstream_stream) link;
	/* A copy of the request's field bytes follows the struct: nghttp2 was told not to copy
	 * them (NGHTTP2_NV_FLAG_NO_COPY_*), and reads them when it serializes the HEADERS, which
	 * may be a flush later. A stream is freed only once its HEADERS left, was dropped
	 * (on_frame_not_send), or was cancelled in the queue by our RST_STREAM (h2_upstream_cancel:
	 * nghttp2 then never serializes it) — or with the whole session. */
	char fields[];
};

struct h2_conn {
	uint32_t magic;
	enum h2u_conn_state state;
	struct loop *loop;
	struct h2_table *t;
	uint64_t serial;                /* of the endpoint: with tls, the table's key */
	SSL_CTX *tls;
	char sni[256];
	bool verify;
	struct pool_ep *pe;
	struct stream *strm;
	nghttp2_session *ng;
	uint64_t queued;                /* bytes serialized into the output (stream_written()
	                                 * counts those that left) */
	int nstreams;
	uint32_t peer_max;              /* assumed (see h2conn_pick) until settings_seen */
	bool settings_seen;
	int32_t goaway_last;            /* valid in UC_GOAWAY when goaway_seen */
	bool goaway_seen;
	/* the last x-timeout-ms and grpc-timeout values sent (see repeats_last) */
	char last_tmo[2][16];
	uint8_t last_tmo_len[2];
	bool rid_indexed;               /* an x-request-id went indexable (see goes_indexed) */
	int busy;
	bool want_flush;
	int64_t connect_timeout_us;
	struct event timer;             /* connect timeout, then idle lifetime */
	struct event kick;              /* zero-delay flush: a stream opened never hears back
	                                 * before h2_upstream_open returned */
	struct event move;              /* streams beyond the limit learnt late: H2_MOVE_AFTER_US
	                                 * after the SETTINGS, those still queued move */
	TAILQ_HEAD(, h2_upstream_stream) streams;
	TAILQ_ENTRY(h2_conn) link;
	/* the last stream find() returned: the callbacks of one frame all name the same stream */
	struct h2_upstream_stream *last;
	/* The header block being received. A block is never interleaved with another stream's
	 * (RFC 9113 §4.3: CONTINUATION follows at once), so one per connection serves every
	 * stream, and no stream allocates for its head. */
	char *hb;
	size_t hused, hcap;
	struct hfield hf[H2_MAX_FIELDS];
	int nhf;
	struct http_hdr hdrs[H2_MAX_FIELDS + 1];    /* the block as fields, for on_head */
};

struct h2_table {
	TAILQ_HEAD(, h2_conn) conns;
	bool draining;
};

/* ---------------------------------------------------------------- h2_conn.c */

/* The connection for a new stream to EP: the first with room, else a new one (which may be
 * dead already: its connect failed at once). */
struct h2_conn *h2conn_pick(struct loop *l, struct ep_state *ep, const struct transport_req *o);
/* S joined or left C's streams (an idle connection's lifetime stops or starts). Joining also
 * kicks a flush at the end of this loop turn. */
void h2conn_stream_added(struct h2_conn *c, struct h2_upstream_stream *s);
void h2conn_stream_removed(struct h2_conn *c, struct h2_upstream_stream *s);
/* Serialize what nghttp2 has to send (later, if inside one of its callbacks). */
void h2conn_flush(struct h2_conn *c);
/* Flush at the end of this loop turn: what a turn asked for leaves together. */
void h2conn_kick(struct h2_conn *c);
/* The connection is gone: each stream ends (UNPROCESSED: none was processed). */
void h2conn_fail(struct h2_conn *c, const char *detail, bool unprocessed);
/* SETTINGS or GOAWAY from the server. */
void h2conn_peer_frame(struct h2_conn *c, const nghttp2_frame *f);

/* ---------------------------------------------------------------- h2_stream.c */

/* The nghttp2 callbacks of a session's streams. */
void h2u_set_callbacks(nghttp2_session_callbacks *cb);
/* A byte of S's HEADERS left: the kernel (or the TLS layer) took it. */
bool h2u_sent(const struct h2_upstream_stream *s);
/* Report the end and forget S. The owner may open or cancel streams from inside on_close. */
void h2u_end(struct h2_upstream_stream *s, enum outcome out, const char *detail);
/* S, whose HEADERS wait in its connection's queue (never serialized), goes to another
 * connection (h2conn_pick); false: it cannot (no field list kept), and stays. It may end
 * instead (OUT_CONNECT_FAILURE: no connection to go to). */
bool h2u_move(struct h2_upstream_stream *s);

#endif
