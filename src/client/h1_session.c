/*
 * h1_session: one HTTP/1.x client connection (see h1_session.h), and the HTTP/1 responder
 * its exchanges answer through: it frames each response (Content-Length, chunked, or until
 * close for an HTTP/1.0 client), decides the connection's fate in one place (rsp_head: the
 * request's keep-alive, a drain, the exchange's word), and writes its own refusals with the
 * same writer.
 *
 *   S_HEAD --head--> S_BODY --body end--> S_WAIT --response queued--> S_HEAD (keep-alive)
 *     |                 |                    |
 *     +--refusal / EOF / timeout / close-----+--> S_CLOSING (flush output) --> S_CLOSED
 *
 * While a request is served (S_BODY, S_WAIT) the bytes of the next pipelined request stay in
 * the input buffer; its read high-water mark bounds how much a client can queue. A response
 * is queued by the exchange; when it is done (on_done), the next request is picked up from a
 * zero-delay event, on a clean stack.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "obs/accesslog.h"
#include "base/clock.h"
#include "config/config.h"
#include "proxy/exchange.h"
#include "http/h1_parser.h"
#include "base/log.h"
#include "client/h1_session.h"
#include "http/h1_write.h"
#include "http/respond.h"
#include "http/responder.h"
#include "obs/stats.h"
#include "net/tls.h"
#include "net/tunnel.h"
#include "net/stream.h"
#include "base/util.h"
#include "base/loop.h"
#include "state/runtime.h"

#define SESSION_MAGIC 0x5e5510a1u
#define CLIENT_LOW (64 * 1024)
#define CLIENT_HIGH (256 * 1024)    /* responses queued for the client: take no new request */

enum sstate { S_HEAD, S_BODY, S_WAIT, S_TUNNEL, S_CLOSING, S_CLOSED };

struct h1_session {
	uint32_t magic;
	enum sstate state;
	uint64_t id;
	struct loop *loop;
	struct session_owner own;
	char *lname;                    /* the listener's name: its config is looked up by it */
	struct runtime *rt;             /* the config of the current request */
	struct cfg_listener *lcfg;
	struct stream *strm;
	struct http_msg *req;
	struct exchange *ex;
	struct tunnel *tunnel;
	bool ex_done;                   /* the exchange queued its response */
	struct evbuffer *body_tmp;
	struct loop_timer timer;        /* header or idle timeout (the loop's: one per request) */
	bool head_timer;
	struct loop_soon resume;        /* session_process again, from the loop */
	bool close_after;               /* drain: close after the current response */
	bool resp_started, resp_chunked, resp_bodyless, resp_close;   /* the current response */
	bool tls;
	bool served;                    /* a request was read: HTTP/2 can no longer start */
	bool handed_off;                /* the connection went to an HTTP/2 session */
	char peer_ip[64];
};

static void session_process(struct h1_session *s);

/* The one writer of the state (DESIGN rule 2). */
DEFINE_STATE_SETTER(set_state, h1_session, sstate, S_CLOSED)

static void resume_cb(void *arg)
{
	struct h1_session *s = arg;
	MAGIC_CHECK(s, SESSION_MAGIC);
	session_process(s);
}

/* Look at the input again once the callbacks up the stack have returned. */
static void resume(struct h1_session *s)
{
	if (s->state != S_CLOSED)
		loop_soon_add(s->loop, &s->resume, resume_cb, s);
}

static void session_free_cb(void *p)
{
	struct h1_session *s = p;
	s->magic = 0;
	free(s->lname);
	free(s);
}

void h1_session_close(struct h1_session *s, const char *why)
{
	if (s->state == S_CLOSED)
		return;
	set_state(s, S_CLOSED);
	slog(LOG_DEBUG, s->id, "close: %s", why);
	if (s->ex) {
		exchange_free(s->ex);   /* aborts it if still running */
		s->ex = NULL;
	}
	if (s->tunnel) {
		tunnel_free(s->tunnel);
		s->tunnel = NULL;
	}
	if (s->strm)
		stream_free(s->strm);
	s->strm = NULL;
	loop_timer_del(s->loop, &s->timer);
	loop_soon_del(s->loop, &s->resume);
	http_msg_free(s->req);
	evbuffer_free(s->body_tmp);
	runtime_unref(s->rt);
	s->rt = NULL;
	loop_defer_free(s->loop, session_free_cb, s);
	if (!s->handed_off)
		s->own.on_closed(s->own.closed_arg);
}

/* SPEC §9: an HTTP/2 client. -1: not one; 0: cannot tell yet (a partial preface); 1: one. */
#define H2_PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define H2_PREFACE_LEN 24
static int speaks_h2(struct h1_session *s, struct evbuffer *in)
{
	if (s->served || !s->own.on_h2 || !s->lcfg->http2)
		return -1;
	if (s->tls) {
		const unsigned char *p = NULL;
		unsigned int n = 0;
		SSL_get0_alpn_selected(stream_ssl(s->strm), &p, &n);
		return n == 2 && memcmp(p, "h2", 2) == 0 ? 1 : -1;
	}
	char b[H2_PREFACE_LEN];
	size_t have = evbuffer_get_length(in);
	size_t n = have < sizeof(b) ? have : sizeof(b);
	evbuffer_copyout(in, b, n);
	if (memcmp(b, H2_PREFACE, n) != 0)
		return -1;
	return n == sizeof(b) ? 1 : 0;
}

/* The connection is HTTP/2: its stream goes to the owner, this session ends silently. */
static void hand_off_h2(struct h1_session *s)
{
	struct h2_handoff h = {
		.strm = s->strm, .lname = s->lname, .sid = s->id, .peer_ip = s->peer_ip, .tls = s->tls,
	};
	s->strm = NULL;
	s->handed_off = true;
	h1_session_close(s, "http/2");     /* the strings stay until the deferred free */
	s->own.on_h2(s->own.closed_arg, &h);
}

static void timer_cb(void *arg);

static void timer_set(struct h1_session *s, int64_t us)
{
	loop_timer_add(s->loop, &s->timer, us, timer_cb, s);
}

/* Stop reading; close once the output has been flushed. */
static void session_close_after_flush(struct h1_session *s)
{
	if (s->state == S_CLOSED)
		return;
	set_state(s, S_CLOSING);
	stream_disable(s->strm, EV_READ);
	loop_timer_del(s->loop, &s->timer);
	if (evbuffer_get_length(stream_output(s->strm)) == 0) {
		h1_session_close(s, "done");
		return;
	}
	stream_setwatermark(s->strm, EV_WRITE, 0, 0);
	/* a client that never reads its last response must not hold us forever */
	timer_set(s, s->lcfg ? s->lcfg->limits.idle_timeout_us : 10000000);
}

/* Our own answer (a refusal), written with the same writer; the connection then closes.
 * Once a response has started on the wire a second one cannot follow: its bytes would land
 * in the first one's body, a truncated response that looks complete. Then the close alone
 * (after what was queued) tells the client the response is cut. */
static void refuse_ex(struct h1_session *s, int status, const char *reason, const char *detail,
                      bool log)
{
	if (s->state != S_HEAD && (s->resp_started || s->ex_done)) {
		slog(LOG_INFO, s->id, "%d %s after the response began: closing", status, reason);
		session_close_after_flush(s);
		return;
	}
	slog(LOG_INFO, s->id, "refused %d %s: %s", status, reason, detail ? detail : "");
	if (log)        /* one access log line per request, even one refused here */
		accesslog_write_refusal(s->id, s->peer_ip, &s->loop->rng, status, reason);
	struct made_response m;
	respond_error(&m, status, reason, "", 0, NULL, NULL, true);
	h1_response_head(stream_output(s->strm), &m.head, respond_status_text(status), H1_LENGTH,
	                 H1_CONN_CLOSE);
	evbuffer_add(stream_output(s->strm), m.body, m.body_len);
	int c = status / 100;
	if (c >= 1 && c <= 5)
		STAT_INC(g_gstats[s->loop->id].requests[c]);
	session_close_after_flush(s);
}

static void refuse(struct h1_session *s, int status, const char *reason, const char *detail)
{
	refuse_ex(s, status, reason, detail, true);
}

static void arm_idle(struct h1_session *s)
{
	s->head_timer = false;
	timer_set(s, s->lcfg->limits.idle_timeout_us);
}

/* ------------------------------------------------------------------ the HTTP/1 responder */

static const struct http_head *cur_req(const struct h1_session *s)
{
	return http_msg_head(s->req);
}

static void rsp_informational(void *arg, const struct resp_head *h)
{
	struct h1_session *s = arg;
	MAGIC_CHECK(s, SESSION_MAGIC);
	/* HTTP/1.0 has no interim responses; none after the final head */
	if (s->state == S_CLOSED || cur_req(s)->version != 11 || s->resp_started)
		return;
	h1_response_head(stream_output(s->strm), h, respond_status_text(h->status), H1_NO_BODY,
	                 H1_CONN_NONE);
}

/* The one place that decides framing and whether the connection outlives the response. */
static void rsp_head(void *arg, const struct resp_head *h)
{
	struct h1_session *s = arg;
	MAGIC_CHECK(s, SESSION_MAGIC);
	if (s->state == S_CLOSED)
		return;
	const struct http_head *req = cur_req(s);
	s->resp_started = true;
	s->resp_bodyless = req->method_head || h->status == 204 || h->status == 304 || h->status < 200;
	s->resp_chunked = false;
	s->resp_close = h->close || !req->keep_alive || s->close_after;
	enum h1_framing fr;
	if (h->status >= 200 && h->status != 204 && h->content_length >= 0) {
		fr = H1_LENGTH;         /* a HEAD or 304 answer carries the length it would have */
	} else if (s->resp_bodyless) {
		fr = H1_NO_BODY;
	} else if (req->version == 11) {
		fr = H1_CHUNKED;
		s->resp_chunked = true;
	} else {
		fr = H1_UNTIL_CLOSE;    /* HTTP/1.0: the body ends with the connection */
		s->resp_close = true;
	}
	enum h1_conn conn = s->resp_close ? H1_CONN_CLOSE
	                    : req->version == 10 ? H1_CONN_KEEP_ALIVE : H1_CONN_NONE;
	h1_response_head(stream_output(s->strm), h, respond_status_text(h->status), fr, conn);
}

static void rsp_body(void *arg, struct evbuffer *data)
{
	struct h1_session *s = arg;
	MAGIC_CHECK(s, SESSION_MAGIC);
	size_t n = evbuffer_get_length(data);
	if (s->state == S_CLOSED || s->resp_bodyless || n == 0)
		evbuffer_drain(data, n);
	else if (s->resp_chunked)
		h1_chunk_encode(stream_output(s->strm), data, n);
	else
		evbuffer_add_buffer(stream_output(s->strm), data);
}

static void rsp_trailers(void *arg, const struct http_hdr *t, int n)
{
	/* SPEC §8: trailers are dropped on HTTP/1 (the last chunk carries none) */
}

static void rsp_end(void *arg, bool complete, bool close)
{
	struct h1_session *s = arg;
	MAGIC_CHECK(s, SESSION_MAGIC);
	if (s->state == S_CLOSED)
		return;
	s->ex_done = true;
	if (complete && s->resp_chunked)
		h1_chunk_last(stream_output(s->strm));
	/* a cut response is never completed: the close tells the client it is truncated */
	if (!complete || close || s->resp_close || s->close_after) {
		session_close_after_flush(s);
		return;
	}
	resume(s);
}

static size_t rsp_queued(void *arg)
{
	struct h1_session *s = arg;
	MAGIC_CHECK(s, SESSION_MAGIC);
	return s->strm ? evbuffer_get_length(stream_output(s->strm)) : 0;
}

static void rsp_want_body(void *arg)
{
	struct h1_session *s = arg;
	MAGIC_CHECK(s, SESSION_MAGIC);
	if (s->state == S_BODY)
		resume(s);
}

static void tunnel_closed_cb(void *arg)
{
	h1_session_close(arg, "tunnel closed");
}

static void rsp_tunnel(void *arg, const struct resp_head *h, struct stream *upstream)
{
	struct h1_session *s = arg;
	MAGIC_CHECK(s, SESSION_MAGIC);
	h1_response_head(stream_output(s->strm), h, "Switching Protocols", H1_NO_BODY, H1_CONN_NONE);
	s->ex_done = true;
	set_state(s, S_TUNNEL);
	loop_timer_del(s->loop, &s->timer);
	s->tunnel = tunnel_new(s->loop, s->strm, upstream, s->lcfg->limits.idle_timeout_us,
	                       tunnel_closed_cb, s);
}

/* The config the next request is served with: refreshed per request. */
static bool session_refresh_config(struct h1_session *s)
{
	struct runtime *rt = s->own.runtime(s->own.runtime_arg);
	if (rt == s->rt)
		return s->lcfg != NULL;
	runtime_unref(s->rt);
	s->rt = runtime_ref(rt);
	s->lcfg = config_listener(rt->cfg, s->lname);
	return s->lcfg != NULL;
}

static void start_exchange(struct h1_session *s, const struct http_head *h)
{
	loop_timer_del(s->loop, &s->timer);
	s->head_timer = false;
	if (!session_refresh_config(s)) {
		refuse(s, 404, "no-route", "listener no longer configured");
		return;
	}
	struct client_info ci = {
		.sid = s->id,
		.peer_ip = s->peer_ip,
		.tls = s->tls,
	};
	struct responder rsp = {
		.informational = rsp_informational,
		.head = rsp_head,
		.body = rsp_body,
		.trailers = rsp_trailers,
		.end = rsp_end,
		.queued = rsp_queued,
		.want_body = rsp_want_body,
		.tunnel = rsp_tunnel,
		.arg = s,
	};
	s->ex_done = false;
	s->served = true;
	s->resp_started = s->resp_chunked = s->resp_bodyless = s->resp_close = false;
	set_state(s, S_BODY);      /* even a body-less message ends with HTTP_DONE from the parser */
	s->ex = exchange_new(s->loop, s->rt, s->lcfg, &ci, h, &rsp);
	exchange_start(s->ex);
}

/* The response is queued: forget the exchange and look at the next request. */
static void next_request(struct h1_session *s)
{
	exchange_free(s->ex);
	s->ex = NULL;
	s->ex_done = false;
	http_msg_next(s->req);
	set_state(s, S_HEAD);
	arm_idle(s);
}

static void session_process(struct h1_session *s)
{
	struct evbuffer *in = stream_input(s->strm);
	for (;;) {
		if (s->state == S_CLOSING || s->state == S_CLOSED || s->state == S_TUNNEL)
			return;
		if (s->state == S_WAIT) {
			if (!s->ex_done)
				return;     /* pipelined bytes wait in the input buffer */
			/* a client that pipelines without reading: its responses pile up here, so
			 * take the next request only once they drained (write_cb resumes us) */
			if (evbuffer_get_length(stream_output(s->strm)) > CLIENT_HIGH)
				return;
			next_request(s);
		}
		if (s->state == S_HEAD) {
			/* with a parser, feed even an empty input: take_cb may have parsed a head */
			if (!s->req && evbuffer_get_length(in) == 0)
				return;
			if (!s->req) {
				int h2 = speaks_h2(s, in);
				if (h2 > 0) {
					hand_off_h2(s);
					return;
				}
				if (h2 == 0) {
					if (!s->head_timer) {
						s->head_timer = true;
						timer_set(s, s->lcfg->limits.header_timeout_us);
					}
					return;
				}
				struct http_limits lim = {
					.max_header_bytes = (size_t)s->lcfg->limits.max_header_bytes,
					.max_uri_bytes = (size_t)s->lcfg->limits.max_uri_bytes,
				};
				s->req = http_msg_new(HTTP_REQUEST_KIND, &lim);
			}
			enum http_event ev = http_msg_feed(s->req, in, s->body_tmp, 0);
			switch (ev) {
			case HTTP_NEED_MORE:
			case HTTP_BODY:
			case HTTP_DONE:
				if (!s->head_timer && http_msg_head_bytes(s->req) > 0) {
					s->head_timer = true;
					timer_set(s, s->lcfg->limits.header_timeout_us);
				}
				return;
			case HTTP_HEAD:
				start_exchange(s, http_msg_head(s->req));
				continue;
			case HTTP_ERROR: {
				int st;
				const char *reason, *detail;
				http_msg_error(s->req, &st, &reason, &detail);
				refuse(s, st, reason, detail);
				return;
			}
			}
		}
		if (s->state == S_BODY) {
			size_t room = exchange_body_room(s->ex);
			enum http_event ev = http_msg_feed(s->req, in, s->body_tmp, room);
			switch (ev) {
			case HTTP_NEED_MORE:
			case HTTP_HEAD:     /* not reached: a head comes only after http_msg_next() */
				return;
			case HTTP_BODY:
				exchange_body(s->ex, s->body_tmp);
				continue;
			case HTTP_DONE:
				set_state(s, S_WAIT);
				exchange_body_end(s->ex);
				continue;
			case HTTP_ERROR: {
				int st;
				const char *reason, *detail;
				http_msg_error(s->req, &st, &reason, &detail);
				slog(LOG_INFO, s->id, "bad request body: %s", detail ? detail : reason);
				exchange_free(s->ex);    /* logs the request (as aborted) */
				s->ex = NULL;
				refuse_ex(s, st, reason, detail, false);
				return;
			}
			}
		}
	}
}

static void read_cb(struct stream *strm, void *arg)
{
	session_process(arg);
}

/* Bytes just read, before they enter the input: a request head waited for is parsed from them
 * (read_cb then finds it complete, or the partial head kept). */
static size_t take_cb(struct stream *strm, const char *data, size_t len, void *arg)
{
	struct h1_session *s = arg;
	MAGIC_CHECK(s, SESSION_MAGIC);
	return s->state == S_HEAD && s->req ? http_msg_take(s->req, data, len) : 0;
}

static void write_cb(struct stream *strm, void *arg)
{
	struct h1_session *s = arg;
	MAGIC_CHECK(s, SESSION_MAGIC);
	if (s->state == S_CLOSING) {
		if (evbuffer_get_length(stream_output(strm)) == 0)
			h1_session_close(s, "flushed");
		return;
	}
	if (s->ex && !s->ex_done)
		exchange_client_drained(s->ex);
	else if (s->state == S_WAIT && s->ex_done)
		resume(s);      /* held back by CLIENT_HIGH */
}

/* SPEC §7: a client whose TLS handshake failed is counted by reason, and logged once a minute
 * per client address (a scanner or a client without its certificate repeats itself). */
static void note_tls_failure(struct h1_session *s)
{
	char detail[160], key[80];
	SSL *ssl = stream_ssl(s->strm);
	if (!ssl || SSL_is_init_finished(ssl))
		return;
	enum tls_failure f = stream_tls_failure(s->strm, detail, sizeof(detail));
	if (f == TLSF_NONE)
		return;     /* it closed without a word: not a failed handshake */
	STAT_INC(g_gstats[s->loop->id].tls_handshake_errors[f]);
	snprintf(key, sizeof(key), "client %s", s->peer_ip);
	if (log_keyed_every(key, clock_now_us(), 60 * 1000000LL))
		slog(LOG_WARN, s->id, "TLS handshake with client %s on listener %s failed: %s (%s); "
		     "more from it within a minute are only counted", s->peer_ip, s->lname,
		     tls_failure_name(f), detail);
}

static void event_cb(struct stream *strm, short what, void *arg)
{
	struct h1_session *s = arg;
	MAGIC_CHECK(s, SESSION_MAGIC);
	if (what & BEV_EVENT_CONNECTED)
		return;     /* a TLS handshake completed: nothing to do */
	if (s->tls)
		note_tls_failure(s);
	if (s->state == S_CLOSING && !(what & BEV_EVENT_ERROR) && (what & BEV_EVENT_EOF)) {
		/* the client half-closed while we flush: keep flushing */
		stream_disable(strm, EV_READ);
		return;
	}
	h1_session_close(s, (what & BEV_EVENT_EOF) ? "client closed" : "client error");
}

static void timer_cb(void *arg)
{
	struct h1_session *s = arg;
	MAGIC_CHECK(s, SESSION_MAGIC);
	if (s->state == S_CLOSING) {
		h1_session_close(s, "flush timeout");
		return;
	}
	if (s->state != S_HEAD)
		return;
	if (s->head_timer && s->req && http_msg_head_bytes(s->req) > 0) {
		refuse(s, 408, "header-timeout", "request head not complete in time");
		return;
	}
	h1_session_close(s, "idle");
}

/* A connection that cannot become a session: FD closed, the owner told, nothing left. */
static struct h1_session *abandon(const struct session_owner *own, int fd, uint64_t sid,
                                  enum log_level lvl, const char *why)
{
	slog(lvl, sid, "close: %s", why);
	if (fd >= 0)
		close(fd);
	own->on_closed(own->closed_arg);
	return NULL;
}

struct h1_session *h1_session_new(struct loop *loop, const struct session_owner *own,
                                  const char *lname, uint64_t sid, int fd,
                                  const struct sockaddr *peer, int peerlen)
{
	struct runtime *rt = own->runtime(own->runtime_arg);
	struct cfg_listener *lcfg = config_listener(rt->cfg, lname);
	if (!lcfg)      /* a reload removed the listener since it accepted this connection */
		return abandon(own, fd, sid, LOG_DEBUG, "listener no longer configured");
	/* the TLS objects come from OpenSSL's allocator, not ours: they can fail (and a TLS
	 * listener must never fall back to plaintext) */
	SSL_CTX *tls = rt->ltls[lcfg - rt->cfg->listeners];
	SSL *ssl = tls ? SSL_new(tls) : NULL;
	if (tls && !ssl)
		return abandon(own, fd, sid, LOG_WARN, "cannot start TLS: SSL_new failed");
	struct stream *strm = stream_new(loop, fd, ssl, tls ? STREAM_TLS_ACCEPT : STREAM_PLAIN);
	if (!strm)      /* it closed FD and freed SSL */
		return abandon(own, -1, sid, LOG_WARN, "cannot start TLS on the connection");
	struct h1_session *s = xcalloc(1, sizeof(*s));
	s->magic = SESSION_MAGIC;
	s->loop = loop;
	s->own = *own;
	s->lname = xstrdup(lname);
	s->id = sid;
	s->rt = runtime_ref(rt);
	s->lcfg = lcfg;
	if (peer->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)peer)->sin_addr, s->peer_ip, sizeof(s->peer_ip));
	else if (peer->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)peer)->sin6_addr, s->peer_ip, sizeof(s->peer_ip));
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	s->strm = strm;
	s->tls = tls != NULL;
	/* the request parser (its head arrays are most of a connection's memory) comes with the
	 * first byte: an idle connection costs a few hundred bytes of ours */
	s->body_tmp = evbuffer_new();
	stream_setcb(s->strm, read_cb, write_cb, event_cb, s);
	stream_set_take(s->strm, take_cb);
	/* bounds pipelined input and client-side backpressure (the head itself always fits) */
	stream_setwatermark(s->strm, EV_READ, 0, (size_t)s->lcfg->limits.max_header_bytes + 64 * 1024);
	stream_setwatermark(s->strm, EV_WRITE, CLIENT_LOW, 0);
	/* a client that stops reading its responses holds nothing for longer than idle_timeout */
	stream_set_write_timeout(s->strm, s->lcfg->limits.idle_timeout_us);
	stream_enable(s->strm, EV_READ | EV_WRITE);
	set_state(s, S_HEAD);
	arm_idle(s);
	return s;
}

/* Bytes the client sent that we have not read yet (the kernel's receive buffer). */
static bool unread_input(struct h1_session *s)
{
	char b;
	int fd = stream_fd(s->strm);
	return fd >= 0 && recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

void h1_session_expire(struct h1_session *s)
{
	if (s->state == S_CLOSED)
		return;
	if (s->ex && !s->ex_done && s->state != S_TUNNEL) {
		exchange_expire(s->ex);     /* its end() closes after the flush */
		return;
	}
	if (s->state == S_TUNNEL || !s->strm) {
		h1_session_close(s, "drain timeout");
		return;
	}
	session_close_after_flush(s);
}

void h1_session_drain(struct h1_session *s, bool close_idle)
{
	s->close_after = true;      /* every response from now on says Connection: close */
	if (!close_idle || s->state != S_HEAD || (s->req && http_msg_head_bytes(s->req) > 0) ||
	    evbuffer_get_length(stream_input(s->strm)) > 0)
		return;
	/* a request already on its way is served (with Connection: close), never reset */
	if (unread_input(s)) {
		stream_trigger_read(s->strm);
		return;
	}
	h1_session_close(s, "draining");
}
