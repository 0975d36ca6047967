/*
 * h1_conn: the HTTP/1.1 transport (see h1_conn.h and transport.h).
 *
 * A request (struct h1_req, what the attempt holds) has one connection (struct upconn) at a
 * time; the connection outlives it in the pool. Request states: R_CONNECTING (a fresh
 * connection, its connect timer armed) -> R_WAITING (connected or pooled: the request being
 * written, no final head yet) -> R_BODY (final head delivered) -> R_DONE (ended, cancelled or
 * upgraded: the connection parked or closed, the request freed once the callback stack
 * unwound). A stale pooled connection replaced goes back from R_WAITING to R_CONNECTING.
 * Invariant: r->c is set exactly while the state is not R_DONE.
 *
 * "Sent" is counted, not flagged: queued is what the connection's output would hold had none
 * of it left, so the output holding less means some was written (counted at each add: no
 * evbuffer callback, which cost an allocation per request and a call per change of the buffer).
 */
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>

#include "upstream/h1_conn.h"
#include "upstream/pool.h"
#include "http/h1_parser.h"
#include "http/h1_write.h"
#include "net/stream.h"
#include "net/tls.h"
#include "base/loop.h"
#include "base/util.h"

#define H1REQ_MAGIC 0x4831e9a5u
#define BODY_CHUNK (64 * 1024)

/* An upstream HTTP/1.1 connection: what the pool keeps, plus its response parser. */
struct upconn {
	struct pool_conn pc;            /* first: the pool's view (stream, loop, endpoint) */
	struct http_msg *parser;        /* made at the first response, kept across requests */
	bool closed;                    /* upconn_close ran (it is idempotent) */
};

enum h1_req_state { R_CONNECTING, R_WAITING, R_BODY, R_DONE };

struct h1_req {
	struct transport t;             /* first: what the attempt holds */
	uint32_t magic;
	enum h1_req_state state;
	struct loop *loop;
	struct ep_state *ep;
	struct pool_ep *pe;
	struct upconn *c;
	struct transport_cbs cbs;
	void *arg;
	struct evbuffer *head;          /* kept until the end: a pooled connection may be replaced */
	struct evbuffer *body;          /* referenced replayable body, until queued */
	struct evbuffer *decoded;       /* the opener's body_out */
	size_t queued;                  /* see above */
	bool streaming, chunked, is_head, body_ended;
	bool wrote_any, reused, paused, eof;
	SSL_CTX *tls;
	const char *sni;
	bool verify;
	int64_t connect_timeout_us;
	struct loop_timer timer;        /* the connect timer (the loop's, as the attempt's) */
};

/* The one writer of the state (DESIGN rule 2). */
DEFINE_STATE_SETTER(set_state, h1_req, h1_req_state, R_DONE)

/* ---------------------------------------------------------------- the connection */

static void upconn_free_cb(void *p)
{
	struct upconn *c = p;
	if (c->parser)
		http_msg_free(c->parser);
	c->pc.magic = 0;
	free(c);
}

/* The pool's close, and ours: the pool unlinked it first if it was idle. */
static void upconn_close(struct pool_conn *pc)
{
	struct upconn *c = (struct upconn *)pc;
	if (c->closed)
		return;
	c->closed = true;
	if (pc->strm) {
		stream_free(pc->strm);
		pc->strm = NULL;
	}
	loop_defer_free(pc->loop, upconn_free_cb, c);
}

static struct upconn *upconn_new(struct loop *l, struct stream *strm)
{
	struct upconn *c = xcalloc(1, sizeof(*c));
	c->pc.magic = POOL_CONN_MAGIC;
	c->pc.loop = l;
	c->pc.strm = strm;
	c->pc.close = upconn_close;
	return c;
}

static struct evbuffer *out_buf(const struct h1_req *r)
{
	return stream_output(r->c->pc.strm);
}

/* Some of the request left on the connection attached now. */
static bool conn_wrote(const struct h1_req *r)
{
	return r->c && r->c->pc.strm && evbuffer_get_length(out_buf(r)) < r->queued;
}

/* After an add to the connection's output that found it BEFORE long: count what it put. */
static void out_counted(struct h1_req *r, size_t before)
{
	r->queued += evbuffer_get_length(out_buf(r)) - before;
}

static void read_cb(struct stream *strm, void *arg);
static size_t take_cb(struct stream *strm, const char *data, size_t len, void *arg);
static void write_cb(struct stream *strm, void *arg);
static void event_cb(struct stream *strm, short what, void *arg);

static void conn_attach(struct h1_req *r, struct upconn *c, bool reused)
{
	struct stream *strm = c->pc.strm;
	r->c = c;
	r->reused = reused;
	c->pc.ep = r->ep;
	stream_setcb(strm, read_cb, write_cb, event_cb, r);
	stream_set_take(strm, take_cb);
	if (c->parser)
		http_msg_expect(c->parser, r->is_head);
	r->queued = evbuffer_get_length(stream_output(strm));    /* a pooled one's is empty */
	stream_enable(strm, EV_READ | EV_WRITE);
}

/* Let go of the connection: parked in the pool (REUSE) or closed. */
static void conn_detach(struct h1_req *r, bool reuse)
{
	struct upconn *c = r->c;
	if (!c)
		return;
	r->wrote_any = r->wrote_any || conn_wrote(r);
	r->c = NULL;
	r->queued = 0;
	stream_setcb(c->pc.strm, NULL, NULL, NULL, NULL);
	if (reuse)
		pool_put(&c->pc);
	else
		upconn_close(&c->pc);
}

/* Queue the head and the replayable body (a streamed one follows through send_body). */
static void write_request(struct h1_req *r)
{
	struct evbuffer *out = out_buf(r);
	size_t before = evbuffer_get_length(out);
	evbuffer_add_buffer(out, r->head);
	if (r->body)
		evbuffer_add_buffer_reference(out, r->body);
	out_counted(r, before);
}

/* ---------------------------------------------------------------- timer, end */

static void timer_cb(void *arg);

static void timer_arm(struct h1_req *r, int64_t us)
{
	loop_timer_add(r->loop, &r->timer, us, timer_cb, r);
}

static void timer_stop(struct h1_req *r)
{
	loop_timer_del(r->loop, &r->timer);
}

static void req_free_cb(void *p)
{
	struct h1_req *r = p;
	r->magic = 0;
	loop_blk_free(r->loop, r);
}

/* Done with the request: its connection parked (REUSE) or closed, no callback again. */
static void req_finish(struct h1_req *r, bool reuse)
{
	set_state(r, R_DONE);
	timer_stop(r);
	conn_detach(r, reuse);
	loop_buf_put(r->loop, r->head);
	r->head = NULL;
	loop_defer_free(r->loop, req_free_cb, r);
}

/* The end, reported once. The owner may free its attempt (and open others) inside on_close. */
static void req_end(struct h1_req *r, bool reuse, enum outcome out, bool bad, const char *detail)
{
	if (r->state == R_DONE)
		return;
	req_finish(r, reuse);
	r->cbs.on_close(r->arg, out, bad, detail);
}

/* A fresh connection to the endpoint's address, the request queued on it. */
static bool conn_open(struct h1_req *r, const char **err)
{
	SSL *ssl = r->tls ? tls_client_ssl(r->tls, r->sni, r->verify) : NULL;
	struct stream *strm = (!r->tls || ssl) ? stream_new(r->loop, -1, ssl,
	                                                   ssl ? STREAM_TLS_CONNECT : STREAM_PLAIN) : NULL;
	if (!strm) {
		*err = "out of sockets";
		return false;
	}
	set_state(r, R_CONNECTING);
	conn_attach(r, upconn_new(r->loop, strm), false);
	/* the request is queued now; it leaves once connected */
	if (stream_connect(strm, (struct sockaddr *)&r->pe->addr, r->pe->addrlen) < 0) {
		conn_detach(r, false);
		*err = "connect failed";
		return false;
	}
	write_request(r);
	timer_arm(r, r->connect_timeout_us);
	return true;
}

static void timer_cb(void *arg)
{
	struct h1_req *r = arg;
	MAGIC_CHECK(r, H1REQ_MAGIC);
	if (r->state == R_CONNECTING)
		req_end(r, false, OUT_CONNECT_FAILURE, false, "connect timeout");
}

/* Our request went out on a pooled connection the peer had closed: nothing was written
 * (SPEC §4: discarded and replaced, with no outcome). All of it is still in the output: the
 * head, the body reference, the streamed body so far (its last chunk too, if it ended). */
static void conn_replace(struct h1_req *r)
{
	evbuffer_add_buffer(r->head, out_buf(r));    /* the head was moved out when written */
	r->queued = 0;      /* taken back, not written: the detach below must not count it */
	conn_detach(r, false);
	r->body = NULL;
	const char *err;
	if (!conn_open(r, &err))
		req_end(r, false, OUT_CONNECT_FAILURE, false, err);
}

/* ---------------------------------------------------------------- the response */

/* Complete response: park the connection if both directions ended cleanly. */
static void req_complete(struct h1_req *r, bool keep_alive)
{
	bool reuse = keep_alive && !r->eof && r->c && (!r->streaming || r->body_ended) &&
	             evbuffer_get_length(out_buf(r)) == 0;
	req_end(r, reuse, OUT_NONE, false, NULL);
}

/* The connection's response parser, made with its first response */
static struct http_msg *conn_parser(struct h1_req *r)
{
	struct upconn *c = r->c;
	if (!c->parser) {
		struct http_limits lim = { 64 * 1024, 64 * 1024 };
		c->parser = http_msg_new(HTTP_RESPONSE_KIND, &lim);
		http_msg_expect(c->parser, r->is_head);
	}
	return c->parser;
}

static void process(struct h1_req *r)
{
	while (r->state == R_WAITING || r->state == R_BODY) {
		struct upconn *c = r->c;
		conn_parser(r);
		struct evbuffer *in = stream_input(c->pc.strm);
		enum http_event ev = http_msg_feed(c->parser, in, r->decoded, r->paused ? 0 : BODY_CHUNK);
		switch (ev) {
		case HTTP_NEED_MORE:
			if (!r->eof || r->paused)
				return;
			if (evbuffer_get_length(in) > 0)
				continue;
			ev = http_msg_eof(c->parser);
			if (ev == HTTP_DONE && r->state == R_BODY)
				req_complete(r, false);
			else if (r->state == R_WAITING)
				req_end(r, false, OUT_RESET,
				        ev == HTTP_ERROR && http_msg_head_bytes(c->parser) > 0,
				        "connection closed before a complete response head");
			else
				req_end(r, false, OUT_RESET, false, "response body truncated");
			return;
		case HTTP_HEAD: {
			const struct http_head *h = http_msg_head(c->parser);
			if (h->status >= 100 && h->status < 200 && h->status != 101) {
				r->cbs.on_head(r->arg, h);
				if (r->state == R_DONE)
					return;
				http_msg_next(c->parser);
				http_msg_expect(c->parser, r->is_head);
				continue;
			}
			/* SPEC §8: a body on 204/304/HEAD is an invalid response. Bytes already
			 * behind such a head can only be that body (one request per connection at a
			 * time): 502, never relayed. Bytes that come later close the pooled conn. */
			if (h->status != 101 && (r->is_head || h->status == 204 || h->status == 304) &&
			    evbuffer_get_length(in) > 0) {
				req_end(r, false, OUT_RESET, true, "a body on a response that has none");
				return;
			}
			set_state(r, R_BODY);
			r->cbs.on_head(r->arg, h);
			if (r->state == R_DONE || h->status == 101)
				return;
			continue;
		}
		case HTTP_BODY:
			r->cbs.on_data(r->arg);
			continue;
		case HTTP_DONE: {
			bool ka = http_msg_head(c->parser)->keep_alive;
			http_msg_next(c->parser);
			if (evbuffer_get_length(in) > 0)
				ka = false;     /* bytes after the response: never pool (SPEC §8) */
			req_complete(r, ka);
			return;
		}
		case HTTP_ERROR: {
			int st;
			const char *reason, *detail;
			http_msg_error(c->parser, &st, &reason, &detail);
			req_end(r, false, OUT_RESET, r->state == R_WAITING, detail);
			return;
		}
		}
	}
}

/* ---------------------------------------------------------------- socket events */

static void read_cb(struct stream *strm, void *arg)
{
	struct h1_req *r = arg;
	MAGIC_CHECK(r, H1REQ_MAGIC);
	process(r);
}

/* Bytes just read, before they enter the input: the response head waited for is parsed from
 * them (read_cb then finds it complete). */
static size_t take_cb(struct stream *strm, const char *data, size_t len, void *arg)
{
	struct h1_req *r = arg;
	MAGIC_CHECK(r, H1REQ_MAGIC);
	return r->state == R_WAITING ? http_msg_take(conn_parser(r), data, len) : 0;
}

static void write_cb(struct stream *strm, void *arg)
{
	struct h1_req *r = arg;
	MAGIC_CHECK(r, H1REQ_MAGIC);
	if (r->streaming && !r->body_ended && r->state != R_DONE)
		r->cbs.on_drain(r->arg);
}

/* The TLS failure the stream of R holds (TLSF_NONE: none), counted for the endpoint when it is
 * one of the handshake: any, or with REFUSAL only the peer's refusal. A TLS 1.3 server checks
 * our client certificate after we count as connected: its refusal comes as an alert instead of
 * a response (or before we wrote), and the request was never processed. */
static enum tls_failure tls_failed(struct h1_req *r, struct stream *strm, bool refusal)
{
	char detail[160];
	enum tls_failure f = r->tls ? stream_tls_failure(strm, detail, sizeof(detail)) : TLSF_NONE;
	if (f != TLSF_NONE && (!refusal || f == TLSF_PEER_REFUSED))
		pool_tls_failed(r->loop, r->ep, f, detail);
	return f;
}

static void event_cb(struct stream *strm, short what, void *arg)
{
	struct h1_req *r = arg;
	MAGIC_CHECK(r, H1REQ_MAGIC);
	if (r->state == R_DONE)
		return;
	if (what & BEV_EVENT_CONNECTED) {
		int one = 1;
		setsockopt(stream_fd(strm), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		timer_stop(r);
		set_state(r, R_WAITING);
		return;
	}
	if (r->state == R_CONNECTING) {
		if (tls_failed(r, strm, false) != TLSF_NONE) {
			req_end(r, false, OUT_CONNECT_FAILURE, false, "TLS handshake failed");
			return;
		}
		req_end(r, false, OUT_CONNECT_FAILURE, false,
		        (what & BEV_EVENT_ERROR) ? evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR())
		                                 : "closed while connecting");
		return;
	}
	if (!r->wrote_any && !conn_wrote(r)) {
		if (r->reused) {
			/* a pooled connection found closed before our first byte: no outcome */
			conn_replace(r);
			return;
		}
		tls_failed(r, strm, false);     /* a fresh connection: only its handshake can fail */
		req_end(r, false, OUT_CONNECT_FAILURE, false, "closed before the request was written");
		return;
	}
	if ((what & BEV_EVENT_ERROR) && r->state == R_WAITING &&
	    tls_failed(r, strm, true) == TLSF_PEER_REFUSED) {
		req_end(r, false, OUT_CONNECT_FAILURE, false, "TLS handshake refused by the upstream "
		        "(client certificate)");
		return;
	}
	r->eof = true;
	process(r);
}

/* ---------------------------------------------------------------- the transport */

static struct h1_req *req_of(struct transport *t)
{
	struct h1_req *r = (struct h1_req *)t;
	MAGIC_CHECK(r, H1REQ_MAGIC);
	return r;
}

static struct transport *h1_open(struct loop *l, struct ep_state *ep,
                                 const struct transport_req *q, const struct transport_cbs *cbs,
                                 void *arg, const char **err)
{
	struct h1_req *r = loop_blk_alloc(l, sizeof(*r));
	if (!r) {
		loop_buf_put(l, q->head);
		*err = "out of memory";
		return NULL;
	}
	memset(r, 0, sizeof(*r));
	r->t.ops = &h1_transport;
	r->magic = H1REQ_MAGIC;
	r->loop = l;
	r->ep = ep;
	r->pe = pool_ep_get(l, ep);
	r->cbs = *cbs;
	r->arg = arg;
	r->head = q->head;
	r->body = q->body;
	r->decoded = q->body_out;
	r->streaming = q->streaming;
	r->chunked = q->chunked;
	r->is_head = q->is_head;
	r->tls = q->tls;
	r->sni = q->sni;
	r->verify = q->verify;
	r->connect_timeout_us = q->connect_timeout_us;
	struct pool_conn *pc = q->fresh_conn ? NULL : pool_get(r->pe);
	if (pc) {
		/* connected already: only the attempt's head timer runs */
		set_state(r, R_WAITING);
		conn_attach(r, (struct upconn *)pc, true);
		write_request(r);
		return &r->t;
	}
	if (conn_open(r, err))
		return &r->t;
	loop_buf_put(l, r->head);
	r->magic = 0;
	loop_blk_free(l, r);
	return NULL;
}

static void h1_cancel(struct transport *t)
{
	struct h1_req *r = req_of(t);
	if (r->state != R_DONE)
		req_finish(r, false);
}

static bool h1_sent(const struct transport *t)
{
	const struct h1_req *r = (const struct h1_req *)t;
	return r->wrote_any || conn_wrote(r);
}

static size_t h1_pending(const struct transport *t)
{
	const struct h1_req *r = (const struct h1_req *)t;
	return r->c ? evbuffer_get_length(out_buf(r)) : 0;
}

static void h1_send_body(struct transport *t, struct evbuffer *data)
{
	struct h1_req *r = req_of(t);
	size_t n = evbuffer_get_length(data);
	if (r->state == R_DONE) {
		evbuffer_drain(data, n);
		return;
	}
	if (n == 0)
		return;
	/* the output queues bytes until connected */
	struct evbuffer *out = out_buf(r);
	size_t before = evbuffer_get_length(out);
	if (r->chunked)
		h1_chunk_encode(out, data, n);
	else
		evbuffer_add_buffer(out, data);
	out_counted(r, before);
}

static void h1_send_trailers(struct transport *t, const struct http_hdr *f, int n)
{
	/* dropped: SPEC §9 */
}

static void h1_body_end(struct transport *t)
{
	struct h1_req *r = req_of(t);
	if (r->body_ended)
		return;
	r->body_ended = true;
	if (r->state == R_DONE || !r->chunked)
		return;
	size_t before = evbuffer_get_length(out_buf(r));
	h1_chunk_last(out_buf(r));
	out_counted(r, before);
}

static void h1_consume(struct transport *t, size_t n)
{
	/* nothing to open: reading the socket is the only window (h1_pause) */
}

static void h1_pause(struct transport *t, bool paused)
{
	struct h1_req *r = req_of(t);
	r->paused = paused;
	if (r->state == R_DONE)
		return;
	if (paused) {
		stream_disable(r->c->pc.strm, EV_READ);
		return;
	}
	stream_enable(r->c->pc.strm, EV_READ);
	/* bytes (or an EOF) already buffered would get no new read event */
	stream_trigger_read(r->c->pc.strm);
}

static struct stream *h1_take_stream(struct transport *t)
{
	struct h1_req *r = req_of(t);
	if (r->state == R_DONE)
		return NULL;
	struct upconn *c = r->c;
	struct stream *strm = c->pc.strm;
	stream_setcb(strm, NULL, NULL, NULL, NULL);
	c->pc.strm = NULL;
	r->c = NULL;
	upconn_close(&c->pc);
	req_finish(r, false);
	return strm;
}

const struct transport_ops h1_transport = {
	.open = h1_open,
	.cancel = h1_cancel,
	.sent = h1_sent,
	.pending = h1_pending,
	.send_body = h1_send_body,
	.send_trailers = h1_send_trailers,
	.body_end = h1_body_end,
	.consume = h1_consume,
	.pause = h1_pause,
	.take_stream = h1_take_stream,
};
