/*
 * h2_session_impl: what the files of the HTTP/2 client codec share, and nobody else: the
 * connection and stream objects, the session core, and the calls between the files.
 * h2_session.c runs the connection (the send path, stream ends, defences, timers, drain);
 * h2_request.c is the request intake (heads, their checks, the exchange's start, request DATA
 * and trailers); h2_responder.c is the responder its exchanges answer through (response heads,
 * DATA, trailers, the end of a stream).
 *
 * Calls go one way, down this list: h2_session.c -> h2_request.c -> h2_responder.c -> the core
 * (at the end of this file: schedule a send, find a stream). Each file may call those below it,
 * none those above: news goes up only as state in the objects (a flag, a buffer) that the
 * connection reads on its next round, or through nghttp2's callbacks, which h2_session.c
 * registers. The exchange (proxy/) reaches a stream only through the responder's table.
 */
#ifndef RG_H2_SESSION_IMPL_H
#define RG_H2_SESSION_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include <event2/event.h>
#include <nghttp2/nghttp2.h>

#include "client/h2_guard.h"
#include "http/h1_parser.h"
#include "http/responder.h"
#include "client/session.h"
#include "base/util.h"

struct cfg_listener;
struct event;
struct evbuffer;
struct exchange;
struct loop;
struct runtime;
struct stream;

/* The client side's objects: names and values apart from the upstream h2_conn's */
#define H2CL_SESSION_MAGIC 0x4832a55au
#define H2CL_STREAM_MAGIC 0x4832a57bu
#define STREAM_WINDOW (64 * 1024)       /* request body a stream may send ahead of the exchange */
#define CONN_WINDOW (1024 * 1024)       /* ... and all streams of a connection together */
#define OUT_HIGH (128 * 1024)           /* connection output: pack no more frames above this */
#define OUT_LOW (32 * 1024)
#define RESP_LOW (64 * 1024)            /* a stream's pending response: tell the exchange below */
/* Response bytes buffered for a connection's streams together (resp_pending): at or above
 * this, none of its exchanges reads its upstream (the responder answers RESPONDER_FULL) until
 * the client took some. With RESP_TOTAL_CAP bytes buffered over every connection of the
 * process, the figure is RESP_LOW instead. Per stream, the exchange's own mark (256 KiB)
 * holds too, and a paused upstream keeps what it had read (its window, or one read). */
#define RESP_BUDGET (1024 * 1024)
#define RESP_TOTAL_CAP ((size_t)64 << 20)
#define NOTICE_RTT_US (100 * 1000)      /* shutdown notice to final GOAWAY, at least */
#define RECV_SLICE 4096                 /* input handed to nghttp2 between two sends */
#define HDRS_INLINE 16                  /* request fields kept in the stream itself ... */
#define RC_INLINE 32                    /* ... and the rcbufs they point into: no allocation
                                         * for the head of a typical request */

enum h2cl_state { H2CL_OPEN, H2CL_DRAINING, H2CL_CLOSING, H2CL_CLOSED };

struct h2_session;

/* From the loop's free list (LOOP_H2_STREAM): the first member is overwritten while free. */
struct h2_client_stream {
	uint32_t magic;
	struct loop *loop;              /* for the deferred free: the session may be gone by then */
	struct h2_session *s;
	int32_t id;
	TAILQ_ENTRY(h2_client_stream) link;
	struct http_head head;
	struct http_hdr *hdrs;          /* point into the rcbufs held in rc; hdrs_in until it grows */
	int cap;
	nghttp2_rcbuf **rc;             /* rc_in until it grows */
	int nrc, caprc;
	struct http_hdr hdrs_in[HDRS_INLINE];
	nghttp2_rcbuf *rc_in[RC_INLINE];
	char *cookie;                   /* the cookie fields joined with "; " (RFC 9113 §8.2.3) */
	size_t cookie_len;
	const char *authority, *hosthdr;  /* into rc, as hdrs; NULL once the head is released */
	size_t alen, hlen;
	bool host_kept;                 /* a host field was kept: a second one is malformed */
	/* SPEC §9's checks, which nghttp2 is told to leave to us (h2_request.c, check_field) */
	uint8_t pseudo;                 /* the pseudo-headers seen, a bit each (PS_*) */
	uint8_t req_flags;              /* what the head says of the path rule (RQ_*) */
	bool regular_seen;              /* a regular field came: no pseudo-header after it */
	bool cl_seen;                   /* a content-length came: a second one is malformed */
	uint8_t prio;                   /* its priority field (RFC 9218): PRIO_SET | PRIO_INC |
	                                 * urgency, PRIO_BAD, or 0 (none) */
	uint64_t req_bytes;             /* request DATA received, against content-length */
	size_t list_bytes;              /* decoded header-list size, RFC 7541 §4.1 */
	int refuse_status;              /* 414 / 431 / 501 found while reading the head */
	const char *refuse_reason;
	bool malformed, head_done;
	bool grpc;                      /* its content-type is gRPC: refusals are gRPC errors */
	bool oversize;                  /* over max_header_bytes: nothing more of it is kept */
	bool refused;                   /* beyond max_concurrent_streams: REFUSED_STREAM */
	struct exchange *ex;
	bool ex_done;                   /* the exchange reported end() */
	struct evbuffer *req_in;        /* DATA received, not yet taken (nor consumed); NULL
	                                 * until the first DATA */
	bool req_end, body_end_sent;
	struct evbuffer *resp;          /* response DATA not yet sent */
	bool head_sent, bodyless, resp_eof, deferred, cut, rst_after, client_reset, was_high;
	bool drained;                   /* pending fell below RESP_LOW: tell the exchange */
	bool budget_wait;               /* its exchange stopped reading for the connection's
	                                 * budget (h2cl_resp_full): tell it when there is room */
	char *head_blk;                 /* the final head's bytes, which nghttp2 reads uncopied
	                                 * when it packs the HEADERS (loop_blk_alloc) */
	nghttp2_nv *trailers;           /* the list, then the bytes it points to: one block from
	                                 * loop_blk_alloc, submitted uncopied too */
	size_t ntrailers;
	struct evbuffer *req_trailers;  /* the request's trailer fields, (nlen, vlen, name, value)
	                                 * each, for an HTTP/2 upstream (SPEC §9); or NULL */
	int nreq_trailers;
	size_t req_trailer_bytes;
};

struct h2_session {
	uint32_t magic;
	enum h2cl_state state;
	uint64_t id;
	struct loop *loop;
	struct session_owner own;
	char *lname;
	struct runtime *rt;
	struct cfg_listener *lcfg;
	struct stream *strm;
	nghttp2_session *ng;
	TAILQ_HEAD(, h2_client_stream) streams;
	int nstreams;
	struct h2_client_stream *last;  /* the stream stream_of found last (or NULL) */
	int nrst_after;                 /* streams with rst_after set */
	bool stream_seen;               /* a stream began since the timers were last set */
	struct h2_guard guard;
	struct event *send_ev, *idle_ev, *hdr_ev, *stall_ev;
	bool send_pending;
	bool read_paused;               /* replies wait behind a full output: input not read */
	size_t resp_pending;            /* response bytes buffered over all streams */
	int64_t last_progress_us;       /* the last DATA byte written */
	/* SETTINGS_MAX_CONCURRENT_STREAMS (SPEC §9): nghttp2 is told a limit it never reaches,
	 * the client ours, patched into each SETTINGS of ours on its way out (send_cb). The
	 * limit enforced is the one the client acknowledged, or a higher one sent since: a
	 * reload that lowers it takes effect once the client has been told. */
	uint32_t max_streams;           /* enforced (h2_request.c's begin_headers_cb) */
	uint32_t streams_advertised;    /* the last value sent */
	int settings_unacked;           /* our SETTINGS not yet acknowledged */
	int settings_to_patch;          /* our SETTINGS not yet past send_cb */
	bool notice_sent, goaway_final;
	int64_t notice_us;
	unsigned logged;                /* defences logged on this connection, a bit per kind */
	unsigned refusals_logged;       /* the same for the refusals of h2_request.c */
	bool tls;
	char peer_ip[64];
	struct evbuffer *tmp;
	uint8_t *stage;                 /* during session_send: frames gathered for one append */
	size_t staged, stagecap;
	nghttp2_nv *nv;                 /* scratch for submits (nghttp2 copies the list) */
	size_t nvcap;
	char *names;                    /* scratch for the bytes of a head nghttp2 copies */
	size_t namescap;
	unsigned reqids;                /* X-Request-Id fields sent: see unique_flags */
};

/* h2_request.c: called by h2_session.c */
/* The current runtime's config for the connection's listener; false when it has none. */
bool h2cl_refresh_config(struct h2_session *s);
/* nghttp2's receive callbacks: heads, request DATA, trailers, a client's RST_STREAM. */
void h2cl_request_callbacks(nghttp2_session_callbacks *cbs);
/* Request DATA received and not yet taken by the exchange. */
size_t h2cl_req_pending(const struct h2_client_stream *st);
/* Request body to the exchange as far as it takes it; its end, and trailers, after. */
void h2cl_stream_pump(struct h2_session *s, struct h2_client_stream *st);
/* Lets go of the rcbufs the stream's head points into and of its field array, and forgets
 * every pointer into them: nothing of the head may be read after. */
void h2cl_head_release(struct h2_client_stream *st);

/* h2_responder.c: called by h2_request.c (and the exchange, through the table) */
extern const struct responder h2_responder;
/* A connection-specific field (RFC 9113 §8.2.2): never sent to an HTTP/2 peer. */
bool h2cl_connection_field(const char *n, size_t len);
void h2cl_rsp_end(void *arg, bool complete, bool close);

/* ------------------------------------------------------------------ the core: called by all */

/* Response bytes buffered by every HTTP/2 client connection of the process (all workers). */
extern atomic_size_t h2cl_resp_total;

/* Response bytes buffered on S grew by ADD, shrank by SUB. */
static inline void h2cl_resp_count(struct h2_session *s, size_t add, size_t sub)
{
	s->resp_pending += add;
	s->resp_pending -= sub;
	if (add)
		atomic_fetch_add_explicit(&h2cl_resp_total, add, memory_order_relaxed);
	if (sub)
		atomic_fetch_sub_explicit(&h2cl_resp_total, sub, memory_order_relaxed);
}

/* S buffers as much response as it may (RESP_BUDGET, or RESP_LOW while the process is over
 * RESP_TOTAL_CAP): its exchanges read their upstreams no more. */
static inline bool h2cl_resp_full(const struct h2_session *s)
{
	size_t total = atomic_load_explicit(&h2cl_resp_total, memory_order_relaxed);
	return s->resp_pending >= (total > RESP_TOTAL_CAP ? RESP_LOW : RESP_BUDGET);
}

/* Schedule a send: nghttp2 runs from a clean stack (the session's send event), never from a
 * responder call or an nghttp2 callback. */
static inline void h2cl_kick(struct h2_session *s)
{
	if (!s->send_pending && s->state != H2CL_CLOSED) {
		s->send_pending = true;
		event_active(s->send_ev, EV_TIMEOUT, 0);
	}
}

/* The stream of ID, or NULL. nghttp2's callbacks come a stream at a time (a head's fields,
 * then its frame; a response's frames), so the last one found is kept: a map lookup less for
 * each field of each request. stream_destroy (h2_session.c) forgets it. */
static inline struct h2_client_stream *h2cl_stream_of(struct h2_session *s, int32_t id)
{
	struct h2_client_stream *st = s->last;
	if (st && st->id == id)
		return st;
	st = nghttp2_session_get_stream_user_data(s->ng, id);
	if (st) {
		MAGIC_CHECK(st, H2CL_STREAM_MAGIC);
		s->last = st;
	}
	return st;
}

#endif
