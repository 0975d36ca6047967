/*
 * h2_conn: the HTTP/2 upstream connections (see h2_conn.h; shared parts in h2_conn_impl.h):
 * per worker loop, a table of connections, each picked for new streams while it has room,
 * connected (TLS with ALPN h2, or prior knowledge), read into nghttp2, flushed out of it,
 * closed when idle too long, after a GOAWAY once its last stream ended, or when it fails (then
 * every stream on it learns how far it got).
 *
 * Invariants: a connection in the table is not UC_DEAD; its idle timer runs only while it is
 * UC_READY with no stream; nothing is serialized from inside an nghttp2 callback (busy).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>

#include "upstream/h2_conn.h"
#include "upstream/h2_conn_impl.h"
#include "upstream/pool.h"
#include "base/h2_mem.h"
#include "base/clock.h"
#include "base/loop.h"
#include "net/stream.h"
#include "net/tls.h"
#include "state/endpoint.h"
#include "base/util.h"

#define H2_OUT_HIGH (64 * 1024)         /* serialize no more while this much waits to be written */
#define H2_STREAM_WINDOW (256 * 1024)   /* per stream: what a paused owner may leave unread */
#define H2_CONN_WINDOW (4 * 1024 * 1024)
#define H2_DEFAULT_STREAMS 100          /* assumed until the server's SETTINGS say otherwise */
#define H2_MAX_CONNS_PER_EP 32          /* beyond this, streams queue on the least loaded */
/* Streams queued beyond a limit learnt late wait this long for a slot before they move to
 * another connection: long enough for a connection that fails at once (its queued streams
 * are then never-sent connect-failures), short beside a new connection's round trips. */
#define H2_MOVE_AFTER_US (100 * 1000)

/* The one writer of the state (DESIGN rule 2). */
DEFINE_STATE_SETTER(conn_set_state, h2_conn, h2u_conn_state, UC_DEAD)

static struct h2_table *table(struct loop *l)
{
	if (!l->h2) {
		l->h2 = xcalloc(1, sizeof(*l->h2));
		TAILQ_INIT(&l->h2->conns);
	}
	return l->h2;
}

/* ---------------------------------------------------------------- connection teardown */

static void conn_free_cb(void *p)
{
	struct h2_conn *c = p;
	if (c->ng)
		nghttp2_session_del(c->ng);
	c->magic = 0;
	free(c->hb);
	free(c);
}

static void conn_close(struct h2_conn *c)
{
	if (c->state == UC_DEAD)
		return;
	conn_set_state(c, UC_DEAD);
	TAILQ_REMOVE(&c->t->conns, c, link);
	evtimer_del(&c->timer);
	evtimer_del(&c->kick);
	evtimer_del(&c->move);
	if (c->strm) {
		stream_setcb(c->strm, NULL, NULL, NULL, NULL);
		stream_free(c->strm);
		c->strm = NULL;
	}
	loop_defer_free(c->loop, conn_free_cb, c);
}

/* The connection is gone: every stream learns how far it got. UNPROCESSED: none was (the
 * endpoint never spoke HTTP/2 with us: a failed connect, TLS, or ALPN). */
void h2conn_fail(struct h2_conn *c, const char *detail, bool unprocessed)
{
	if (c->state == UC_DEAD)
		return;
	struct h2_upstream_stream *s;
	/* streams the owners open from on_close go elsewhere; no flush meanwhile */
	conn_set_state(c, UC_GOAWAY);
	c->goaway_seen = false;
	c->busy++;
	while ((s = TAILQ_FIRST(&c->streams)) != NULL) {
		if (s->state == US_BODY)
			h2u_end(s, OUT_RESET, "upstream connection lost after the response head");
		else if (unprocessed || !h2u_sent(s))
			h2u_end(s, OUT_CONNECT_FAILURE, detail);
		else
			h2u_end(s, OUT_RESET, "upstream connection lost before a response head");
	}
	c->busy--;
	conn_close(c);
}

/* A connection that may take no new stream and has none left closes. */
static void conn_maybe_retire(struct h2_conn *c)
{
	if (c->state == UC_GOAWAY && c->nstreams == 0 && c->busy == 0 && c->strm &&
	    evbuffer_get_length(stream_output(c->strm)) == 0)
		conn_close(c);
}

/* ---------------------------------------------------------------- output */

static void deliver_drains(struct h2_conn *c)
{
	for (;;) {
		struct h2_upstream_stream *s, *due = NULL;
		TAILQ_FOREACH(s, &c->streams, link)
			if (s->drain_due) {
				due = s;
				break;
			}
		if (!due)
			return;
		due->drain_due = false;
		due->cbs.on_drain(due->arg);
		if (c->state == UC_DEAD)
			return;
	}
}

void h2conn_flush(struct h2_conn *c)
{
	if (c->state != UC_READY && c->state != UC_GOAWAY)
		return;
	if (!c->strm)
		return;
	if (c->busy) {
		c->want_flush = true;
		return;
	}
	struct evbuffer *out = stream_output(c->strm);
	/* frames are gathered here and appended together: nghttp2 hands them over one at a time,
	 * and an append costs more than the copy (the output's callback) */
	uint8_t stage[8192];
	size_t staged = 0;
	c->busy++;
	do {
		c->want_flush = false;
		while (evbuffer_get_length(out) + staged < H2_OUT_HIGH) {
			const uint8_t *p;
			ssize_t n = nghttp2_session_mem_send(c->ng, &p);
			if (n < 0) {
				c->busy--;
				h2conn_fail(c, nghttp2_strerror((int)n), false);
				return;
			}
			if (n == 0)
				break;
			if (staged + (size_t)n > sizeof(stage)) {
				evbuffer_add(out, stage, staged);
				staged = 0;
			}
			if ((size_t)n <= sizeof(stage)) {
				memcpy(stage + staged, p, (size_t)n);
				staged += (size_t)n;
			} else {
				evbuffer_add(out, p, (size_t)n);
			}
			c->queued += (uint64_t)n;
		}
	} while (c->want_flush && evbuffer_get_length(out) + staged < H2_OUT_HIGH);
	if (staged > 0)
		evbuffer_add(out, stage, staged);
	c->busy--;
	deliver_drains(c);
	if (c->state == UC_DEAD)
		return;
	if (!nghttp2_session_want_read(c->ng) && !nghttp2_session_want_write(c->ng) &&
	    evbuffer_get_length(out) == 0) {
		h2conn_fail(c, "upstream HTTP/2 session ended", false);
		return;
	}
	conn_maybe_retire(c);
}

/* ---------------------------------------------------------------- input and events */

static void conn_read_cb(struct stream *strm, void *arg)
{
	struct h2_conn *c = arg;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	if (c->state == UC_DEAD)
		return;
	struct evbuffer *in = stream_input(strm);
	c->busy++;
	while (evbuffer_get_length(in) > 0 && c->state != UC_DEAD) {
		struct evbuffer_iovec v;
		if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
			break;
		ssize_t n = nghttp2_session_mem_recv(c->ng, v.iov_base, v.iov_len);
		if (n < 0) {
			c->busy--;
			h2conn_fail(c, nghttp2_strerror((int)n), false);
			return;
		}
		evbuffer_drain(in, (size_t)n);
	}
	c->busy--;
	if (c->state == UC_DEAD)
		return;
	h2conn_flush(c);
}

static void conn_write_cb(struct stream *strm, void *arg)
{
	struct h2_conn *c = arg;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	if (c->state != UC_DEAD)
		h2conn_flush(c);
}

static bool alpn_is_h2(struct stream *strm, SSL_CTX *tls)
{
	return !tls || tls_selected_h2(stream_ssl(strm));
}

static void conn_event_cb(struct stream *strm, short what, void *arg)
{
	struct h2_conn *c = arg;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	if (c->state == UC_DEAD)
		return;
	if (what & BEV_EVENT_CONNECTED) {
		int one = 1;
		setsockopt(stream_fd(strm), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (!alpn_is_h2(strm, c->tls)) {
			h2conn_fail(c, "the endpoint did not select h2 (ALPN)", true);
			return;
		}
		evtimer_del(&c->timer);
		if (c->state == UC_CONNECTING)
			conn_set_state(c, UC_READY);
		if (c->nstreams == 0 && c->state == UC_READY) {
			struct timeval tv = clock_tv(POOL_IDLE_US);
			evtimer_add(&c->timer, &tv);
		}
		h2conn_flush(c);
		return;
	}
	if (c->state == UC_CONNECTING) {
		/* a failed handshake counts for the endpoint of the first stream waiting (the
		 * connection itself keeps no endpoint state that could outlive its requests) */
		char detail[160];
		enum tls_failure f = c->tls ? stream_tls_failure(strm, detail, sizeof(detail)) : TLSF_NONE;
		struct h2_upstream_stream *s = TAILQ_FIRST(&c->streams);
		if (f != TLSF_NONE && s)
			pool_tls_failed(c->loop, s->ep, f, detail);
		if (f != TLSF_NONE) {
			h2conn_fail(c, "TLS handshake failed", true);
			return;
		}
		h2conn_fail(c, (what & BEV_EVENT_ERROR) ?
		          evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()) : "closed while connecting",
		          true);
		return;
	}
	/* whatever is still buffered may be the server's last frames (a GOAWAY, a response) */
	conn_read_cb(strm, c);
	if (c->state != UC_DEAD)
		h2conn_fail(c, "upstream closed the HTTP/2 connection", false);
}

static void conn_kick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct h2_conn *c = arg;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	h2conn_flush(c);
}

/* The server's limit came after more streams were queued here than it takes: those whose
 * HEADERS still wait for a slot go to other connections (a new one if none has room). */
static void conn_move_cb(evutil_socket_t fd, short what, void *arg)
{
	struct h2_conn *c = arg;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	if (c->state != UC_READY)
		return;
	struct h2_upstream_stream *s;
	uint32_t open = 0;
	TAILQ_FOREACH(s, &c->streams, link)
		open += s->hdr_queued;
	/* the first that wait take the free slots, if any. Looked for from the head each time:
	 * an owner told of an end (on_close) may cancel or open streams */
	uint32_t keep = c->peer_max > open ? c->peer_max - open : 0;
	c->busy++;
	for (int rounds = c->nstreams; rounds > 0 && c->state == UC_READY; rounds--) {
		uint32_t skip = keep;
		struct h2_upstream_stream *m = NULL;
		TAILQ_FOREACH(s, &c->streams, link) {
			if (s->hdr_queued)
				continue;
			if (skip > 0) {
				skip--;
				continue;
			}
			if (s->nv) {
				m = s;
				break;
			}
		}
		if (!m || !h2u_move(m))
			break;      /* none left, or no other connection: the rest wait here */
	}
	c->busy--;
	if (c->state != UC_DEAD)
		h2conn_flush(c);
}

static void conn_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct h2_conn *c = arg;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	if (c->state == UC_CONNECTING) {
		h2conn_fail(c, "connect timeout", true);
		return;
	}
	if (c->nstreams == 0) {
		/* idle too long: say goodbye */
		nghttp2_submit_goaway(c->ng, NGHTTP2_FLAG_NONE,
		                      nghttp2_session_get_last_proc_stream_id(c->ng), NGHTTP2_NO_ERROR,
		                      NULL, 0);
		conn_set_state(c, UC_GOAWAY);
		h2conn_flush(c);
		if (c->state != UC_DEAD)
			conn_close(c);
	}
}

/* ---------------------------------------------------------------- connecting */

/* Connect to the endpoint's address (resolved once per process: resolve.c). */
static void conn_connect(struct h2_conn *c)
{
	SSL *ssl = NULL;
	if (c->tls) {
		ssl = tls_client_ssl(c->tls, c->sni[0] ? c->sni : NULL, c->verify);
		if (ssl)
			tls_offer_h2(ssl);
	}
	struct stream *strm = (!c->tls || ssl) ?
	        stream_new(c->loop, -1, ssl, ssl ? STREAM_TLS_CONNECT : STREAM_PLAIN) : NULL;
	if (!strm) {
		h2conn_fail(c, "out of sockets", true);
		return;
	}
	c->strm = strm;
	stream_setcb(strm, conn_read_cb, conn_write_cb, conn_event_cb, c);
	stream_enable(strm, EV_READ | EV_WRITE);
	if (stream_connect(strm, (struct sockaddr *)&c->pe->addr, c->pe->addrlen) < 0)
		h2conn_fail(c, "connect failed", true);
}

/* FIRST: the streams sent before the server's SETTINGS came. */
static nghttp2_session *session_new(struct h2_conn *c, uint32_t first)
{
	nghttp2_session_callbacks *cb;
	nghttp2_option *opt;
	nghttp2_session *ng = NULL;
	if (nghttp2_session_callbacks_new(&cb) != 0)
		return NULL;
	h2u_set_callbacks(cb);
	nghttp2_option_new(&opt);
	nghttp2_option_set_no_auto_window_update(opt, 1);
	/* responses are checked by h2_stream.c, which reads every field anyway: nghttp2's own
	 * checks cost ~230 instructions a field on top */
	nghttp2_option_set_no_http_messaging(opt, 1);
	/* one stream (or the limit another connection to the endpoint learnt) until the server's
	 * SETTINGS say how many it takes (then its value, or unlimited): a burst on a new
	 * connection waits one round trip, queued, instead of being refused by a server whose
	 * limit is low */
	nghttp2_option_set_peer_max_concurrent_streams(opt, first);
	nghttp2_mem mem = h2_mem(c->loop);
	if (nghttp2_session_client_new3(&ng, cb, c, opt, &mem) != 0)
		ng = NULL;
	nghttp2_option_del(opt);
	nghttp2_session_callbacks_del(cb);
	if (!ng)
		return NULL;
	nghttp2_settings_entry iv[] = {
		{ NGHTTP2_SETTINGS_ENABLE_PUSH, 0 },
		{ NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, H2_STREAM_WINDOW },
		{ NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1 },
	};
	nghttp2_submit_settings(ng, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0]));
	nghttp2_session_set_local_window_size(ng, NGHTTP2_FLAG_NONE, 0, H2_CONN_WINDOW);
	return ng;
}

/* KNOWN: the limit another connection to the endpoint learnt, or 0. */
static struct h2_conn *conn_new(struct loop *l, struct ep_state *ep, struct pool_ep *pe,
                                const struct transport_req *o, uint32_t known)
{
	struct h2_conn *c = xcalloc(1, sizeof(*c));
	c->magic = H2U_CONN_MAGIC;
	c->loop = l;
	c->t = table(l);
	c->serial = ep->serial;
	c->tls = o->tls;
	c->verify = o->verify;
	size_t n = o->sni ? strlen(o->sni) : 0;
	if (n < sizeof(c->sni))
		memcpy(c->sni, o->sni ? o->sni : "", n);
	c->pe = pe;
	c->peer_max = known ? known : H2_DEFAULT_STREAMS;
	c->connect_timeout_us = o->connect_timeout_us;
	TAILQ_INIT(&c->streams);
	c->ng = session_new(c, known ? known : 1);
	if (!c->ng) {
		free(c);
		return NULL;
	}
	TAILQ_INSERT_TAIL(&c->t->conns, c, link);
	conn_set_state(c, UC_CONNECTING);
	evtimer_assign(&c->timer, l->base, conn_timer_cb, c);
	evtimer_assign(&c->kick, l->base, conn_kick_cb, c);
	evtimer_assign(&c->move, l->base, conn_move_cb, c);
	struct timeval tv = clock_tv(o->connect_timeout_us > 0 ? o->connect_timeout_us : 1000000);
	evtimer_add(&c->timer, &tv);
	conn_connect(c);     /* may fail at once: the connection is then dead */
	return c;
}

/* The connection for a new stream to EP: the first with room, else a new one. Until its
 * SETTINGS come, a connection is assumed to take H2_DEFAULT_STREAMS, or the limit another
 * connection to the endpoint learnt; streams queued beyond the limit it then learns move
 * (conn_move_cb). */
struct h2_conn *h2conn_pick(struct loop *l, struct ep_state *ep, const struct transport_req *o)
{
	struct pool_ep *pe = pool_ep_get(l, ep);
	struct h2_table *t = table(l);
	struct h2_conn *c, *least = NULL;
	int n = 0;
	uint32_t known = 0;
	TAILQ_FOREACH(c, &t->conns, link) {
		if (c->serial != ep->serial || c->tls != o->tls || c->state == UC_DEAD)
			continue;
		if (c->settings_seen)
			known = c->peer_max;
		if (c->state == UC_GOAWAY)
			continue;
		if (o->other_conn && c->nstreams > 0)
			continue;       /* SPEC §14: a hedge goes over another connection */
		if ((uint32_t)c->nstreams < c->peer_max)
			return c;
		n++;
		if (!least || c->nstreams < least->nstreams)
			least = c;
	}
	if (n >= H2_MAX_CONNS_PER_EP && least)
		return least;       /* nghttp2 queues beyond the server's limit */
	return conn_new(l, ep, pe, o, known);
}

/* ---------------------------------------------------------------- streams coming and going */

void h2conn_stream_added(struct h2_conn *c, struct h2_upstream_stream *s)
{
	TAILQ_INSERT_TAIL(&c->streams, s, link);
	c->nstreams++;
	if (c->state == UC_READY && c->nstreams == 1)
		evtimer_del(&c->timer);     /* no longer idle (armed only while no stream is) */
	/* activated rather than a zero timeout (a heap insertion and removal per stream): queued
	 * behind the callbacks of this loop round, it still sends the HEADERS they opened in one
	 * flush */
	event_active(&c->kick, EV_TIMEOUT, 0);
}

void h2conn_stream_removed(struct h2_conn *c, struct h2_upstream_stream *s)
{
	TAILQ_REMOVE(&c->streams, s, link);
	c->nstreams--;
	if (c->last == s)
		c->last = NULL;
	if (c->nstreams == 0 && c->state == UC_READY) {
		/* idle: its lifetime starts (at once when the worker drains) */
		evtimer_del(&c->timer);
		struct timeval tv = clock_tv(c->t->draining ? 0 : POOL_IDLE_US);
		evtimer_add(&c->timer, &tv);
	}
}

/* Frames wait for the end of this loop turn, then leave together: a body, its end and the
 * window updates of one turn in one flush (and one DATA frame with END_STREAM, not two). */
void h2conn_kick(struct h2_conn *c)
{
	event_active(&c->kick, EV_TIMEOUT, 0);
}

void h2conn_peer_frame(struct h2_conn *c, const nghttp2_frame *f)
{
	if (f->hd.type == NGHTTP2_SETTINGS) {
		if (f->hd.flags & NGHTTP2_FLAG_ACK)
			return;
		c->peer_max = nghttp2_session_get_remote_settings(c->ng,
		                      NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
		c->settings_seen = true;
		if ((uint32_t)c->nstreams > c->peer_max && c->state == UC_READY) {
			struct timeval tv = clock_tv(H2_MOVE_AFTER_US);
			evtimer_add(&c->move, &tv);
		}
		return;
	}
	c->goaway_seen = true;
	c->goaway_last = f->goaway.last_stream_id;
	if (c->state != UC_DEAD)
		conn_set_state(c, UC_GOAWAY);
}

/* ---------------------------------------------------------------- worker exit */

void h2_drain(struct loop *l)
{
	struct h2_table *t = l->h2;
	if (!t)
		return;
	/* in-flight streams finish (and may still retry); idle connections say goodbye */
	t->draining = true;
	struct h2_conn *c, *next;
	for (c = TAILQ_FIRST(&t->conns); c; c = next) {
		next = TAILQ_NEXT(c, link);
		if (c->nstreams == 0 && c->state == UC_READY) {
			evtimer_del(&c->timer);
			struct timeval tv = { 0, 0 };
			evtimer_add(&c->timer, &tv);
		} else if (c->nstreams == 0) {
			conn_close(c);
		}
	}
}

void h2_free_all(struct loop *l)
{
	struct h2_table *t = l->h2;
	if (!t)
		return;
	struct h2_conn *c;
	while ((c = TAILQ_FIRST(&t->conns)) != NULL)
		h2conn_fail(c, "worker exiting", false);
	free(t);
	l->h2 = NULL;
}
