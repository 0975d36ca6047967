/*
 * attempt: one try against one endpoint (see attempt.h).
 *
 * States: A_CONNECTING -> A_WAITING (request written or being written, no
 * final head yet) -> A_BODY (final head delivered, body streaming) -> A_DONE.
 * Every failure is reported once, through on_end, from a clean stack (a failure noticed inside
 * attempt_start() is delivered from a zero-delay timer), so the owner never sees a callback
 * before attempt_start() returned.
 *
 * Outcome classification (SPEC §4): a failure before any byte of the request left is a
 * connect-failure, whichever timer cut it; a pooled connection found closed before writing is
 * replaced with a fresh one, silently; once a byte was written, a close is a reset.
 */
#include <errno.h>
#include <stdio.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/event_struct.h>

#include "upstream/attempt.h"
#include "base/clock.h"
#include "http/h1_parser.h"
#include "http/h1_write.h"
#include "base/log.h"
#include "upstream/h2_conn.h"
#include "upstream/pool.h"
#include "net/tls.h"
#include "state/upstream.h"
#include "net/stream.h"
#include "base/util.h"
#include "base/loop.h"

#define ATTEMPT_MAGIC 0xa77e3b71u
#define BODY_CHUNK (64 * 1024)

enum astate { A_CONNECTING, A_WAITING, A_BODY, A_DONE };

struct attempt {
	uint32_t magic;
	enum astate state;
	struct loop *loop;
	struct ep_state *ep;
	struct pool_ep *pe;
	struct upconn *c;
	struct attempt_cbs cbs;
	void *arg;
	struct evbuffer *head;          /* kept until written: a reused connection may be replaced */
	struct evbuffer *body;
	struct evbuffer *pending;       /* streamed body received before the connection was ready */
	struct evbuffer *decoded;       /* response body bytes handed to on_body */
	/* What the connection's output would hold had none of it left: the bytes of ours it holds
	 * are fewer once some were written (counted at each add, so no evbuffer callback, which
	 * cost an allocation per attempt and a call per change of the buffer). */
	size_t queued;
	bool streaming, chunked, is_head, body_ended;
	bool wrote_any, reused, paused, eof, freed;
	int64_t start_us, connect_timeout_us, head_timeout_us;
	/* Embedded: no allocation per attempt. Assigned when first armed, deleted only while
	 * armed (timer_stop()): an event_del() takes the base's lock even for an idle event, and
	 * an attempt passes several places that stop its timer. */
	struct event timer;
	bool timer_set, timer_on;       /* assigned; added and not yet fired or deleted */
	enum outcome fail_out;          /* a failure waiting for the zero-delay timer */
	const char *fail_detail;
	SSL_CTX *tls;
	char sni[256];
	bool verify;
	bool h2;                        /* the transport is the HTTP/2 stream h2s */
	bool h2_complete;               /* END_STREAM came while body bytes still wait in decoded */
	struct h2_upstream_stream *h2s;
	struct http_hdr *tr;            /* trailers that came while body bytes still wait */
	char *trbuf;
	int ntr;
};

static void attempt_process(struct attempt *a);

/* The one writer of the state (DESIGN rule 2). */
DEFINE_STATE_SETTER(set_state, attempt, astate, A_DONE)

/* Some of the request left on the HTTP/1 connection attached now. */
static bool conn_wrote(const struct attempt *a)
{
	return a->c && a->c->strm && evbuffer_get_length(stream_output(a->c->strm)) < a->queued;
}

/* Around an add to the connection's output: its length before, then count what the add put
 * on it (see queued). */
static size_t out_len(const struct attempt *a)
{
	return evbuffer_get_length(stream_output(a->c->strm));
}

static void out_counted(struct attempt *a, size_t before)
{
	a->queued += out_len(a) - before;
}

bool attempt_wrote_any(const struct attempt *a)
{
	return a->wrote_any || conn_wrote(a) || (a->h2s && h2_upstream_sent(a->h2s));
}
const char *attempt_peer(const struct attempt *a) { return a->ep->name; }
size_t attempt_send_pending(const struct attempt *a)
{
	if (a->h2)
		return a->h2s ? h2_upstream_pending(a->h2s) : 0;
	size_t n = a->pending ? evbuffer_get_length(a->pending) : 0;
	if (a->c && a->c->strm)
		n += evbuffer_get_length(stream_output(a->c->strm));
	return n;
}

static void attempt_free_cb(void *p)
{
	struct attempt *a = p;
	a->magic = 0;
	loop_obj_put(a->loop, LOOP_ATTEMPT, a);
}

static void conn_detach(struct attempt *a, bool reuse)
{
	struct upconn *c = a->c;
	if (!c)
		return;
	a->wrote_any = a->wrote_any || conn_wrote(a);
	a->c = NULL;
	a->queued = 0;
	stream_setcb(c->strm, NULL, NULL, NULL, NULL);
	if (reuse)
		pool_put(c);
	else
		upconn_close(c);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg);

/* The attempt's one timer (connect, head or a deferred failure) to go off in US. */
static void timer_arm(struct attempt *a, int64_t us)
{
	if (!a->timer_set) {
		evtimer_assign(&a->timer, a->loop->base, timer_cb, a);
		a->timer_set = true;
	}
	struct timeval tv = clock_tv(us);
	evtimer_add(&a->timer, &tv);    /* a pending one is moved, not doubled */
	a->timer_on = true;
}

static void timer_stop(struct attempt *a)
{
	if (!a->timer_on)
		return;
	evtimer_del(&a->timer);
	a->timer_on = false;
}

/* Finish: report once. Safe against the owner freeing us inside on_end. */
static void attempt_end(struct attempt *a, enum outcome out, bool bad, const char *detail)
{
	if (a->state == A_DONE)
		return;
	set_state(a, A_DONE);
	timer_stop(a);
	conn_detach(a, false);
	h2_upstream_cancel(a->h2s);
	a->h2s = NULL;
	a->cbs.on_end(a->arg, a, out, bad, detail);
}

static void attempt_fail_soon(struct attempt *a, enum outcome out, const char *detail)
{
	a->fail_out = out;
	a->fail_detail = detail;
	timer_arm(a, 0);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	a->timer_on = false;
	if (a->state == A_DONE)
		return;
	if (a->fail_out != OUT_NONE) {
		attempt_end(a, a->fail_out, false, a->fail_detail);
		return;
	}
	if (a->state == A_CONNECTING || !attempt_wrote_any(a))
		attempt_end(a, OUT_CONNECT_FAILURE, false, "connect timeout");
	else
		attempt_end(a, OUT_TIMEOUT, false, "no response head in time");
}

/* From now on only the per-try time counts (none: no timer, the deadline cuts it). */
static void arm_head_timer(struct attempt *a)
{
	if (a->head_timeout_us <= 0) {
		timer_stop(a);
		return;
	}
	timer_arm(a, a->start_us + a->head_timeout_us - clock_now_us());
}

static void read_cb(struct stream *strm, void *arg)
{
	attempt_process(arg);
}

static void write_cb(struct stream *strm, void *arg)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	if (a->streaming && !a->body_ended && a->state != A_DONE)
		a->cbs.on_drain(a->arg, a);
}

static void replace_conn(struct attempt *a);

/* A TLS 1.3 server checks our client certificate after we count as connected: its refusal
 * comes as an alert instead of a response, and the request was never processed. */
static bool peer_refused_tls(struct stream *strm)
{
	bool refused = false;
	for (unsigned long e; (e = stream_tls_error(strm)) != 0;)
		refused = refused || tls_error_is_peer_refusal(e);
	return refused;
}

static void event_cb(struct stream *strm, short what, void *arg)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	if (a->state == A_DONE)
		return;
	if (what & BEV_EVENT_CONNECTED) {
		int one = 1;
		setsockopt(stream_fd(strm), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		set_state(a, A_WAITING);
		arm_head_timer(a);
		return;
	}
	if (a->state == A_CONNECTING) {
		attempt_end(a, OUT_CONNECT_FAILURE, false,
		            (what & BEV_EVENT_ERROR) ? evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR())
		                                     : "closed while connecting");
		return;
	}
	if (!attempt_wrote_any(a)) {
		if (a->reused) {
			/* a pooled connection found closed before our first byte: no outcome */
			replace_conn(a);
			return;
		}
		attempt_end(a, OUT_CONNECT_FAILURE, false, "closed before the request was written");
		return;
	}
	if ((what & BEV_EVENT_ERROR) && a->state == A_WAITING && peer_refused_tls(strm)) {
		attempt_end(a, OUT_CONNECT_FAILURE, false, "TLS handshake refused by the upstream "
		            "(client certificate)");
		return;
	}
	a->eof = true;
	attempt_process(a);
}

static void conn_setup(struct attempt *a)
{
	struct stream *strm = a->c->strm;
	stream_setcb(strm, read_cb, write_cb, event_cb, a);
	if (a->c->parser)
		http_msg_expect(a->c->parser, a->is_head);
	a->queued = evbuffer_get_length(stream_output(strm));    /* a pooled one's is empty */
	stream_enable(strm, EV_READ | EV_WRITE);
}

/* Queue the head and whatever body we have. */
static void conn_write_request(struct attempt *a)
{
	struct evbuffer *out = stream_output(a->c->strm);
	size_t before = out_len(a);
	evbuffer_add_buffer(out, a->head);
	if (a->body)
		evbuffer_add_buffer_reference(out, a->body);
	if (a->pending && evbuffer_get_length(a->pending) > 0)
		evbuffer_add_buffer(out, a->pending);
	if (a->streaming && a->body_ended && a->chunked)
		h1_chunk_last(out);
	out_counted(a, before);
}

/* A new connection to the endpoint's address (resolved once per process: resolve.c). */
static void attempt_connect(struct attempt *a)
{
	set_state(a, A_CONNECTING);
	SSL *ssl = a->tls ? tls_client_ssl(a->tls, a->sni, a->verify) : NULL;
	struct stream *strm = (!a->tls || ssl) ? stream_new(a->loop, -1, ssl,
	                                                   ssl ? STREAM_TLS_CONNECT : STREAM_PLAIN) : NULL;
	if (!strm) {
		attempt_fail_soon(a, OUT_CONNECT_FAILURE, "out of sockets");
		return;
	}
	struct upconn *c = xcalloc(1, sizeof(*c));
	c->magic = UPCONN_MAGIC;
	c->loop = a->loop;
	c->ep = a->ep;
	c->strm = strm;
	a->c = c;
	a->reused = false;
	conn_setup(a);
	/* the request is queued now; it leaves once connected */
	if (stream_connect(strm, (struct sockaddr *)&a->pe->addr, a->pe->addrlen) < 0) {
		conn_detach(a, false);
		attempt_fail_soon(a, OUT_CONNECT_FAILURE, "connect failed");
		return;
	}
	conn_write_request(a);
}

/* Our head went out on a pooled connection the peer had closed: nothing was written
 * (SPEC §4: discarded and replaced, with no outcome). The head is still ours: rebuild. */
static void replace_conn(struct attempt *a)
{
	struct evbuffer *out = stream_output(a->c->strm);
	struct evbuffer *again = evbuffer_new();
	a->queued = 0;      /* taken back, not written: the detach below must not count it */
	evbuffer_add_buffer(again, out);    /* nothing was drained: the whole request is here */
	conn_detach(a, false);
	evbuffer_add_buffer(a->head, again);
	evbuffer_free(again);
	/* the body reference and pending bytes were moved into the head buffer above */
	a->body = NULL;
	attempt_connect(a);
}

/* ---------------------------------------------------------------- HTTP/2 transport */

/* Hand the owner the DATA it has room for; open the windows by what it took. After
 * END_STREAM, the end is reported once the last byte went. */
static void h2_trailers_now(struct attempt *a, const struct http_hdr *t, int n)
{
	log_debug("h2 upstream %s: %d trailer field(s)%s%.*s", a->ep->name, n, n ? ", first " : "",
	          n ? (int)t[0].nlen : 0, n ? t[0].name : "");
	if (a->cbs.on_trailers)
		a->cbs.on_trailers(a->arg, a, t, n);
}

/* Keep trailers (copied) until the body bytes before them went to the owner. */
static void h2_trailers_keep(struct attempt *a, const struct http_hdr *t, int n)
{
	size_t total = 1;
	for (int i = 0; i < n; i++)
		total += t[i].nlen + t[i].vlen;
	free(a->tr);
	free(a->trbuf);
	a->tr = xcalloc((size_t)n + 1, sizeof(*a->tr));
	a->trbuf = xmalloc(total);
	char *p = a->trbuf;
	for (int i = 0; i < n; i++) {
		a->tr[i] = t[i];
		memcpy(p, t[i].name, t[i].nlen);
		a->tr[i].name = p;
		p += t[i].nlen;
		memcpy(p, t[i].value, t[i].vlen);
		a->tr[i].value = p;
		p += t[i].vlen;
	}
	a->ntr = n;
}

static void h2_deliver(struct attempt *a)
{
	while (!a->paused && a->state == A_BODY && evbuffer_get_length(a->decoded) > 0) {
		size_t before = evbuffer_get_length(a->decoded);
		a->cbs.on_body(a->arg, a, a->decoded);
		if (a->freed || a->state == A_DONE)
			return;
		size_t took = before - evbuffer_get_length(a->decoded);
		h2_upstream_consume(a->h2s, took);
		if (took == 0)
			break;
	}
	if (a->tr && a->state == A_BODY && evbuffer_get_length(a->decoded) == 0) {
		struct http_hdr *t = a->tr;
		a->tr = NULL;
		h2_trailers_now(a, t, a->ntr);
		free(t);
		free(a->trbuf);
		a->trbuf = NULL;
		if (a->freed || a->state == A_DONE)
			return;
	}
	if (a->h2_complete && a->state == A_BODY && evbuffer_get_length(a->decoded) == 0) {
		set_state(a, A_DONE);
		timer_stop(a);
		a->cbs.on_end(a->arg, a, OUT_NONE, false, NULL);
	}
}

static void h2_head_cb(void *arg, const struct http_head *h)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	if (a->state == A_DONE)
		return;
	if (h->status >= 200) {
		set_state(a, A_BODY);
		timer_stop(a);
	}
	a->cbs.on_head(a->arg, a, h);
}

static void h2_data_cb(void *arg, const uint8_t *data, size_t len)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	if (a->state != A_BODY)
		return;
	evbuffer_add(a->decoded, data, len);
	h2_deliver(a);
}

static void h2_trailers_cb(void *arg, const struct http_hdr *t, int n)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	if (a->state != A_BODY)
		return;
	if (evbuffer_get_length(a->decoded) > 0)
		h2_trailers_keep(a, t, n);      /* after the body the owner has not taken yet */
	else
		h2_trailers_now(a, t, n);
}

static void h2_drain_cb(void *arg)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	if (a->streaming && !a->body_ended && a->state != A_DONE)
		a->cbs.on_drain(a->arg, a);
}

static void h2_close_cb(void *arg, enum outcome out, bool bad, const char *detail)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	a->wrote_any = a->wrote_any || (a->h2s && h2_upstream_sent(a->h2s)) ||
	               out != OUT_CONNECT_FAILURE;
	a->h2s = NULL;      /* gone: never touched again */
	if (a->state == A_DONE)
		return;
	if (out == OUT_NONE && a->state == A_BODY) {
		a->h2_complete = true;
		h2_deliver(a);  /* or later, from attempt_resume */
		return;
	}
	attempt_end(a, out == OUT_NONE ? OUT_RESET : out, bad && a->state == A_WAITING, detail);
}

static const struct h2_upstream_cbs h2_callbacks = {
	.on_head = h2_head_cb,
	.on_data = h2_data_cb,
	.on_trailers = h2_trailers_cb,
	.on_drain = h2_drain_cb,
	.on_close = h2_close_cb,
};

static void attempt_start_h2(struct attempt *a, const struct attempt_req *req)
{
	a->h2 = true;
	set_state(a, A_WAITING);
	struct h2_open o = {
		.nv = req->nv,
		.nvlen = req->nvlen,
		.nv_bytes = req->nv_bytes,
		.nv_bytes_len = req->nv_bytes_len,
		.body = a->body,
		.streaming = a->streaming,
		.trailers = req->trailers,
		.ntrailers = req->ntrailers,
		.connect_timeout_us = a->connect_timeout_us,
		.tls = a->tls,
		.sni = a->sni[0] ? a->sni : NULL,
		.verify = a->verify,
	};
	a->h2s = h2_upstream_open(a->loop, a->ep, a->pe, &o, &h2_callbacks, a);
	if (!a->h2s) {
		attempt_fail_soon(a, OUT_CONNECT_FAILURE, "cannot open an HTTP/2 connection");
		return;
	}
	/* a stream cut before its HEADERS left is a connect-failure, whichever timer cut it */
	arm_head_timer(a);
	if (a->pending && evbuffer_get_length(a->pending) > 0)
		h2_upstream_send_body(a->h2s, a->pending);
}

struct attempt *attempt_start(struct loop *loop, struct ep_state *ep, struct attempt_req *req,
                              const struct attempt_cbs *cbs, void *arg)
{
	struct attempt *a = loop_obj_get(loop, LOOP_ATTEMPT, sizeof(*a));
	a->magic = ATTEMPT_MAGIC;
	a->loop = loop;
	a->ep = ep;
	upstream_ep_attempt_begin(ep);
	a->pe = pool_ep_get(loop, ep);
	a->cbs = *cbs;
	a->arg = arg;
	a->head = req->head;
	a->body = req->body;
	a->streaming = req->streaming;
	a->chunked = req->chunked;
	a->is_head = req->is_head;
	a->connect_timeout_us = req->connect_timeout_us;
	a->head_timeout_us = req->head_timeout_us;
	a->tls = req->tls;
	a->verify = req->verify;
	size_t snilen = req->sni ? strlen(req->sni) : 0;
	if (snilen >= sizeof(a->sni))
		snilen = 0;     /* no server name is longer than 255 bytes: send none */
	memcpy(a->sni, req->sni ? req->sni : "", snilen);
	a->sni[snilen] = 0;
	a->start_us = clock_now_us();
	a->decoded = loop_buf_get(loop);
	if (a->streaming)
		a->pending = loop_buf_get(loop);

	if (req->h2) {
		attempt_start_h2(a, req);   /* an HTTP/2 connection keeps its own connect timer */
		return a;
	}
	struct upconn *c = req->fresh_conn ? NULL : pool_get(a->pe);
	if (c) {
		/* connected already: only the head timer, from the start */
		a->c = c;
		a->reused = true;
		set_state(a, A_WAITING);
		conn_setup(a);
		conn_write_request(a);
		arm_head_timer(a);
	} else {
		int64_t t = a->connect_timeout_us;
		if (a->head_timeout_us > 0 && a->head_timeout_us < t)
			t = a->head_timeout_us;
		timer_arm(a, t);
		attempt_connect(a);
	}
	return a;
}

void attempt_free(struct attempt *a)
{
	if (!a || a->freed)
		return;
	a->freed = true;
	upstream_ep_attempt_end(a->ep);     /* the endpoint's in-flight count (least-request) */
	if (a->state != A_DONE) {
		set_state(a, A_DONE);
		conn_detach(a, false);
	}
	h2_upstream_cancel(a->h2s);   /* in flight: RST_STREAM CANCEL, its slot released */
	a->h2s = NULL;
	timer_stop(a);
	free(a->tr);
	free(a->trbuf);
	a->tr = NULL;
	a->trbuf = NULL;
	loop_buf_put(a->loop, a->head);
	loop_buf_put(a->loop, a->pending);
	loop_buf_put(a->loop, a->decoded);
	a->head = a->pending = a->decoded = NULL;
	loop_defer_free(a->loop, attempt_free_cb, a);
}

void attempt_send_body(struct attempt *a, struct evbuffer *data)
{
	size_t n = evbuffer_get_length(data);
	if (a->state == A_DONE || (a->h2 && !a->h2s)) {
		evbuffer_drain(data, n);
		return;
	}
	if (a->h2) {
		h2_upstream_send_body(a->h2s, data);
		return;
	}
	/* once a connection exists its output queues bytes until connected */
	struct evbuffer *dst = a->c ? stream_output(a->c->strm) : a->pending;
	if (n == 0)
		return;
	size_t before = a->c ? out_len(a) : 0;
	if (a->chunked)
		h1_chunk_encode(dst, data, n);
	else
		evbuffer_add_buffer(dst, data);
	if (a->c)
		out_counted(a, before);
}

void attempt_send_trailers(struct attempt *a, const struct http_hdr *t, int n)
{
	if (a->h2 && a->h2s && !a->body_ended)
		h2_upstream_send_trailers(a->h2s, t, n);
}

void attempt_send_body_end(struct attempt *a)
{
	if (a->body_ended)
		return;
	a->body_ended = true;
	if (a->h2) {
		if (a->h2s)
			h2_upstream_body_end(a->h2s);
		return;
	}
	if (a->state == A_DONE || !a->chunked)
		return;
	if (!a->c) {
		h1_chunk_last(a->pending);
		return;
	}
	size_t before = out_len(a);
	h1_chunk_last(stream_output(a->c->strm));
	out_counted(a, before);
}

void attempt_pause(struct attempt *a)
{
	a->paused = true;
	if (a->c && a->c->strm)
		stream_disable(a->c->strm, EV_READ);
}

void attempt_resume(struct attempt *a)
{
	if (!a->paused || a->state == A_DONE)
		return;
	a->paused = false;
	if (a->h2) {
		h2_deliver(a);
		return;
	}
	if (a->c && a->c->strm) {
		stream_enable(a->c->strm, EV_READ);
		/* bytes (or an EOF) already buffered would get no new read event */
		stream_trigger_read(a->c->strm);
	}
}

struct stream *attempt_take_stream(struct attempt *a)
{
	if (!a->c || a->h2)
		return NULL;
	struct upconn *c = a->c;
	struct stream *strm = c->strm;
	a->wrote_any = a->wrote_any || conn_wrote(a);
	a->queued = 0;
	stream_setcb(strm, NULL, NULL, NULL, NULL);
	c->strm = NULL;
	a->c = NULL;
	upconn_close(c);
	set_state(a, A_DONE);
	timer_stop(a);
	return strm;
}

/* Complete response: pool the connection if both directions ended cleanly. */
static void attempt_complete(struct attempt *a, bool keep_alive)
{
	bool reuse = keep_alive && !a->eof && a->c &&
	             (!a->streaming || a->body_ended) &&
	             evbuffer_get_length(stream_output(a->c->strm)) == 0 &&
	             (!a->pending || evbuffer_get_length(a->pending) == 0);
	set_state(a, A_DONE);
	timer_stop(a);
	conn_detach(a, reuse);
	a->cbs.on_end(a->arg, a, OUT_NONE, false, NULL);
}

static void attempt_process(struct attempt *a)
{
	while (a->state == A_WAITING || a->state == A_BODY) {
		struct upconn *c = a->c;
		if (!c)
			return;
		/* body bytes the owner left while it paused us go first */
		if (a->state == A_BODY && !a->paused && evbuffer_get_length(a->decoded) > 0) {
			a->cbs.on_body(a->arg, a, a->decoded);
			if (a->freed || a->state == A_DONE)
				return;
			if (a->paused)
				return;
			continue;
		}
		if (!c->parser) {
			struct http_limits lim = { 64 * 1024, 64 * 1024 };
			c->parser = http_msg_new(HTTP_RESPONSE_KIND, &lim);
			http_msg_expect(c->parser, a->is_head);
		}
		struct evbuffer *in = stream_input(c->strm);
		enum http_event ev = http_msg_feed(c->parser, in, a->decoded, a->paused ? 0 : BODY_CHUNK);
		switch (ev) {
		case HTTP_NEED_MORE:
			if (!a->eof || a->paused)
				return;
			if (evbuffer_get_length(in) > 0 && !a->paused)
				continue;
			ev = http_msg_eof(c->parser);
			if (ev == HTTP_DONE && a->state == A_BODY) {
				attempt_complete(a, false);
				return;
			}
			if (a->state == A_WAITING)
				attempt_end(a, OUT_RESET, ev == HTTP_ERROR && http_msg_head_bytes(c->parser) > 0,
				            "connection closed before a complete response head");
			else
				attempt_end(a, OUT_RESET, false, "response body truncated");
			return;
		case HTTP_HEAD: {
			const struct http_head *h = http_msg_head(c->parser);
			if (h->status >= 100 && h->status < 200 && h->status != 101) {
				a->cbs.on_head(a->arg, a, h);
				if (a->freed || a->state == A_DONE)
					return;
				http_msg_next(c->parser);
				http_msg_expect(c->parser, a->is_head);
				continue;
			}
			/* SPEC §8: a body on 204/304/HEAD is an invalid response. Bytes already
			 * behind such a head can only be that body (one request per connection at a
			 * time): 502, never relayed. Bytes that come later close the pooled conn. */
			if (h->status != 101 && (a->is_head || h->status == 204 || h->status == 304) &&
			    evbuffer_get_length(in) > 0) {
				attempt_end(a, OUT_RESET, true, "a body on a response that has none");
				return;
			}
			set_state(a, A_BODY);
			timer_stop(a);
			a->cbs.on_head(a->arg, a, h);
			if (a->freed || a->state == A_DONE || h->status == 101)
				return;
			continue;
		}
		case HTTP_BODY:
			a->cbs.on_body(a->arg, a, a->decoded);
			if (a->freed || a->state == A_DONE)
				return;
			continue;
		case HTTP_DONE: {
			bool ka = http_msg_head(c->parser)->keep_alive;
			http_msg_next(c->parser);
			if (evbuffer_get_length(in) > 0)
				ka = false;     /* bytes after the response: never pool (SPEC §8) */
			attempt_complete(a, ka);
			return;
		}
		case HTTP_ERROR: {
			int st;
			const char *reason, *detail;
			http_msg_error(c->parser, &st, &reason, &detail);
			if (a->state == A_WAITING)
				attempt_end(a, OUT_RESET, true, detail);
			else
				attempt_end(a, OUT_RESET, false, detail);
			return;
		}
		}
	}
}
