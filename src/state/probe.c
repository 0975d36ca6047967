/*
 * probe: active health checks (see probe.h). A probe carries its endpoint's (upstream id,
 * index, serial), never a pointer: the address may be forgotten while the probe runs, and then
 * its result is dropped. Results change the endpoint under the registry lock; the request path
 * only reads the probe_down flag.
 *
 * One connection per probe, closed after its verdict: HTTP/1.1 (Connection: close) or HTTP/2
 * by prior knowledge, each over TLS when the upstream has tls: (a TLS bufferevent from a
 * client SSL of the runtime's context, so SNI, CA and client certificate are the attempts').
 * Over HTTP/2 the verdict waits for the end of the stream, where a gRPC server puts its
 * grpc-status (a 200 with grpc-status 2 is a failing server, not a healthy one).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/x509.h>

#include "base/clock.h"
#include "config/config.h"
#include "base/log.h"
#include "http/grpc.h"
#include "http/grpc_health.h"
#include "net/tls.h"
#include "state/probe.h"
#include "state/runtime.h"
#include "state/upstream.h"
#include "base/util.h"

#define PROBE_MAGIC   0x9a0be000u
#define TICK_US       (100 * 1000LL)
#define MAX_DUE       256
#define MAX_HEAD      4096
#define MAX_REPLY     64                /* a HealthCheckResponse is a few bytes */
#define MAX_REQ       (5 + 3 + 200)     /* a HealthCheckRequest for a service of 200 bytes */

struct probe {
	uint32_t magic;
	int up_id, index;
	uint64_t serial;
	int unhealthy_after, healthy_after;
	int64_t timeout_us;
	struct sockaddr_storage addr;
	int addrlen;
	char req[1024];                 /* HTTP/1.1: the request; HTTP/2: path, then authority */
	size_t pathlen;
	SSL_CTX *tls;                   /* a reference (tls: upstreams), NULL: cleartext */
	char sni[256];                  /* "": none */
	bool verify;
	bool h2;                        /* protocol: h2 upstream: the probe speaks HTTP/2 too */
	bool grpc;                      /* kind grpc: the health service's Check call */
	nghttp2_session *ng;
	int status;                     /* HTTP/2: the response's :status, 0 until it came */
	int grpc_status;                /* HTTP/2: the last grpc-status seen, -1: none */
	uint32_t reset;                 /* HTTP/2: the stream's close code */
	bool ended;                     /* HTTP/2: the stream closed (a verdict is due) */
	uint8_t msg[MAX_REQ];           /* kind grpc: the request body, and how much was sent */
	size_t msglen, msgoff;
	uint8_t reply[MAX_REPLY];       /* kind grpc: the response body */
	size_t replylen;
	bool reply_over;
	struct bufferevent *strm;
	struct event *timer;
	LIST_ENTRY(probe) link;         /* in p_active */
};

static struct event_base *p_base;
static struct event *p_tick;
static LIST_HEAD(, probe) p_active = LIST_HEAD_INITIALIZER(p_active);  /* freed at stop */

int probe_parse_status(const char *line, int len)
{
	if (len < 12 || memcmp(line, "HTTP/1.", 7) != 0 || line[8] != ' ')
		return 0;
	int st = 0;
	for (int i = 9; i < 12; i++) {
		if (line[i] < '0' || line[i] > '9')
			return 0;
		st = st * 10 + (line[i] - '0');
	}
	return (len == 12 || line[12] == ' ' || line[12] == '\r') && st >= 100 ? st : 0;
}

static void probe_free(struct probe *p)
{
	LIST_REMOVE(p, link);
	if (p->ng)
		nghttp2_session_del(p->ng);
	if (p->strm)
		bufferevent_free(p->strm);
	if (p->timer)
		event_free(p->timer);
	if (p->tls)
		SSL_CTX_free(p->tls);
	p->magic = 0;
	free(p);
}

/* The probe's verdict on its endpoint, then it is freed. */
static void probe_end(struct probe *p, bool ok, const char *why)
{
	upstream_lock();
	struct ep_state *ep = upstream_ep_find(p->up_id, p->index, p->serial);
	if (ep) {
		ep->probing = false;
		if (ok) {
			ep->probe_fails = 0;
			if (++ep->probe_oks >= p->healthy_after && atomic_load(&ep->probe_down)) {
				atomic_store(&ep->probe_down, false);
				log_info("upstream %s: endpoint %s healthy again (%d probes passed)",
				         ep->up->name, ep->name, ep->probe_oks);
			}
		} else {
			ep->probe_oks = 0;
			if (++ep->probe_fails >= p->unhealthy_after && !atomic_load(&ep->probe_down)) {
				atomic_store(&ep->probe_down, true);
				atomic_fetch_add(&ep->ejections, 1);
				log_warn("upstream %s: endpoint %s down: %d probes failed (%s)", ep->up->name,
				         ep->name, ep->probe_fails, why);
			}
		}
	}
	upstream_unlock();
	probe_free(p);
}

/* ---------------------------------------------------------------- HTTP/2 probes */

static int h2_header_cb(nghttp2_session *ng, const nghttp2_frame *f, const uint8_t *name,
                        size_t nlen, const uint8_t *value, size_t vlen, uint8_t flags, void *arg)
{
	struct probe *p = arg;
	if (f->hd.type != NGHTTP2_HEADERS)
		return 0;
	if (nlen == 7 && memcmp(name, ":status", 7) == 0 && vlen == 3 && p->status == 0) {
		int st = (value[0] - '0') * 100 + (value[1] - '0') * 10 + (value[2] - '0');
		if (st >= 200 && st <= 999)
			p->status = st;     /* a 1xx is not the answer */
	} else if (nlen == 11 && memcmp(name, "grpc-status", 11) == 0) {
		/* in the head of a trailers-only answer, or in the trailers */
		int code = grpc_status_parse((const char *)value, vlen);
		p->grpc_status = code < 0 ? GRPC_UNKNOWN : code;
	}
	return 0;
}

static int h2_data_cb(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data,
                      size_t len, void *arg)
{
	struct probe *p = arg;
	if (!p->grpc)
		return 0;               /* a health page's body says nothing more than its status */
	if (len > sizeof(p->reply) - p->replylen) {
		p->reply_over = true;
		return 0;
	}
	memcpy(p->reply + p->replylen, data, len);
	p->replylen += len;
	return 0;
}

static int h2_close_cb(nghttp2_session *ng, int32_t id, uint32_t code, void *arg)
{
	struct probe *p = arg;
	p->ended = true;
	p->reset = code;
	return 0;
}

static ssize_t h2_body_cb(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t len,
                          uint32_t *flags, nghttp2_data_source *src, void *arg)
{
	struct probe *p = arg;
	size_t n = p->msglen - p->msgoff;
	if (n > len)
		n = len;
	memcpy(buf, p->msg + p->msgoff, n);
	p->msgoff += n;
	if (p->msgoff == p->msglen)
		*flags |= NGHTTP2_DATA_FLAG_EOF;
	return (ssize_t)n;
}

/* Whatever nghttp2 has to send goes out (the preface, SETTINGS, the request, ACKs). */
static bool h2_flush(struct probe *p)
{
	const uint8_t *data;
	ssize_t n;
	while ((n = nghttp2_session_mem_send(p->ng, &data)) > 0)
		bufferevent_write(p->strm, data, (size_t)n);
	return n == 0;
}

#define NV(n, v, vl) { (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vl), NGHTTP2_NV_FLAG_NONE }

/* Kind http: a GET of the path, the same question as the HTTP/1.1 probe asked in the
 * endpoint's protocol (an h2c server does not read HTTP/1). Kind grpc: the health service's
 * Check, a POST of one HealthCheckRequest, with the probe's timeout as the call's deadline. */
static bool h2_start(struct probe *p)
{
	nghttp2_session_callbacks *cb;
	if (nghttp2_session_callbacks_new(&cb) != 0)
		return false;
	nghttp2_session_callbacks_set_on_header_callback(cb, h2_header_cb);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2_data_cb);
	nghttp2_session_callbacks_set_on_stream_close_callback(cb, h2_close_cb);
	int rv = nghttp2_session_client_new(&p->ng, cb, p);
	nghttp2_session_callbacks_del(cb);
	if (rv != 0)
		return false;
	const char *auth = p->req + p->pathlen + 1;
	const char *scheme = p->tls ? "https" : "http";
	char timeout[16];
	size_t tlen = grpc_timeout_format(p->timeout_us, timeout);
	nghttp2_nv nv[] = {
		NV(":method", p->grpc ? "POST" : "GET", p->grpc ? 4 : 3),
		NV(":scheme", scheme, strlen(scheme)),
		NV(":authority", auth, strlen(auth)),
		NV(":path", p->req, p->pathlen),
		NV("user-agent", "retrygate-probe", 15),
		NV("content-type", "application/grpc", 16),
		NV("te", "trailers", 8),
		NV("grpc-timeout", timeout, tlen),
	};
	nghttp2_data_provider body = { .read_callback = h2_body_cb };
	return nghttp2_submit_settings(p->ng, NGHTTP2_FLAG_NONE, NULL, 0) == 0 &&
	       nghttp2_submit_request(p->ng, NULL, nv, p->grpc ? 8 : 5, p->grpc ? &body : NULL,
	                              NULL) > 0 &&
	       h2_flush(p);
}

/* The verdict of a closed stream. WHY (CAP bytes) says what failed. */
static bool h2_verdict(struct probe *p, char *why, size_t cap)
{
	if (p->reset != NGHTTP2_NO_ERROR) {
		snprintf(why, cap, "stream reset (HTTP/2 error %u)", p->reset);
		return false;
	}
	if (!p->status) {
		snprintf(why, cap, "stream closed without a status");
		return false;
	}
	if (p->grpc_status > 0 || (p->grpc && p->grpc_status < 0)) {
		snprintf(why, cap, "status %d, grpc-status %s", p->status,
		         p->grpc_status < 0 ? "missing" : grpc_status_name(p->grpc_status));
		return false;
	}
	if (!p->grpc)
		return true;
	int health = p->reply_over ? -1 : grpc_health_reply(p->reply, p->replylen);
	if (health == GRPC_HEALTH_SERVING)
		return true;
	if (health < 0)
		snprintf(why, cap, "not a HealthCheckResponse");
	else
		snprintf(why, cap, "health %s (%d)", grpc_health_status_name(health), health);
	return false;
}

static void h2_read(struct probe *p, struct evbuffer *in)
{
	size_t n = evbuffer_get_length(in);
	ssize_t used = nghttp2_session_mem_recv(p->ng, evbuffer_pullup(in, -1), n);
	evbuffer_drain(in, n);
	char why[80];
	if (used < 0) {
		probe_end(p, false, "bad HTTP/2");
	} else if (p->status && (p->status < 200 || p->status > 299)) {
		snprintf(why, sizeof(why), "status %d", p->status);
		probe_end(p, false, why);       /* the head is the answer */
	} else if (p->ended) {
		bool ok = h2_verdict(p, why, sizeof(why));
		probe_end(p, ok, why);
	} else if (!h2_flush(p)) {
		probe_end(p, false, "bad HTTP/2");
	}
}

/* ---------------------------------------------------------------- the connection */

static void probe_read_cb(struct bufferevent *strm, void *arg)
{
	struct probe *p = arg;
	MAGIC_CHECK(p, PROBE_MAGIC);
	struct evbuffer *in = bufferevent_get_input(strm);
	if (p->h2) {
		h2_read(p, in);
		return;
	}
	struct evbuffer_ptr eol = evbuffer_search_eol(in, NULL, NULL, EVBUFFER_EOL_CRLF);
	if (eol.pos < 0) {
		if (evbuffer_get_length(in) > MAX_HEAD)
			probe_end(p, false, "no status line");
		return;
	}
	char line[64];
	int n = (int)(eol.pos < (ssize_t)sizeof(line) - 1 ? eol.pos : (ssize_t)sizeof(line) - 1);
	evbuffer_copyout(in, line, (size_t)n);
	line[n] = '\0';
	int st = probe_parse_status(line, n);
	char why[32];
	snprintf(why, sizeof(why), "status %d", st);
	probe_end(p, st >= 200 && st <= 299, st ? why : "not HTTP");
}

/* The OpenSSL reason of a failed handshake (a certificate that did not verify, an alert),
 * into WHY; false when there is none. */
static bool tls_why(struct bufferevent *strm, char *why, size_t cap)
{
	unsigned long e, last = 0;
	while ((e = bufferevent_get_openssl_error(strm)) != 0)
		last = e;
	SSL *ssl = bufferevent_openssl_get_ssl(strm);
	long vr = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
	if (vr != X509_V_OK) {
		snprintf(why, cap, "TLS: %s", X509_verify_cert_error_string(vr));
		return true;
	}
	if (!last)
		return false;
	char buf[120];
	ERR_error_string_n(last, buf, sizeof(buf));
	snprintf(why, cap, "TLS: %s", buf);
	return true;
}

static void probe_event_cb(struct bufferevent *strm, short what, void *arg)
{
	struct probe *p = arg;
	MAGIC_CHECK(p, PROBE_MAGIC);
	if (what & BEV_EVENT_CONNECTED) {
		if (p->h2 && p->tls && !tls_selected_h2(bufferevent_openssl_get_ssl(strm)))
			probe_end(p, false, "the endpoint did not select h2 (ALPN)");
		return;
	}
	int err = EVUTIL_SOCKET_ERROR();
	char why[200];
	if (what & BEV_EVENT_EOF)
		snprintf(why, sizeof(why), "closed");
	else if (!p->tls || !tls_why(strm, why, sizeof(why)))
		snprintf(why, sizeof(why), "connect or read error: %s",
		         err ? evutil_socket_error_to_string(err) : "unknown");
	probe_end(p, false, why);
}

static void probe_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
	struct probe *p = arg;
	MAGIC_CHECK(p, PROBE_MAGIC);
	probe_end(p, false, "timeout");
}

/* A socket bufferevent, under TLS with a client SSL of the upstream's context when it has
 * one (the SSL is the bufferevent's then). */
static struct bufferevent *probe_bufferevent(struct probe *p)
{
	if (!p->tls)
		return bufferevent_socket_new(p_base, -1, BEV_OPT_CLOSE_ON_FREE);
	SSL *ssl = tls_client_ssl(p->tls, p->sni[0] ? p->sni : NULL, p->verify);
	if (!ssl)
		return NULL;
	if (p->h2)
		tls_offer_h2(ssl);
	struct bufferevent *strm = bufferevent_openssl_socket_new(p_base, -1, ssl,
	                                                          BUFFEREVENT_SSL_CONNECTING,
	                                                          BEV_OPT_CLOSE_ON_FREE);
	if (!strm) {
		SSL_free(ssl);
		return NULL;
	}
	bufferevent_openssl_set_allow_dirty_shutdown(strm, 1);
	return strm;
}

static void probe_send(struct probe *p)
{
	p->strm = probe_bufferevent(p);
	p->timer = evtimer_new(p_base, probe_timeout_cb, p);
	LIST_INSERT_HEAD(&p_active, p, link);
	if (!p->strm || !p->timer) {
		probe_end(p, false, "out of sockets");
		return;
	}
	struct timeval tv = clock_tv(p->timeout_us);
	evtimer_add(p->timer, &tv);
	bufferevent_setcb(p->strm, probe_read_cb, NULL, probe_event_cb, p);
	bufferevent_enable(p->strm, EV_READ);
	if (p->h2) {
		if (!h2_start(p)) {
			probe_end(p, false, "cannot start HTTP/2");
			return;
		}
	} else {
		bufferevent_write(p->strm, p->req, strlen(p->req));
	}
	if (bufferevent_socket_connect(p->strm, (struct sockaddr *)&p->addr, p->addrlen) < 0)
		probe_end(p, false, "connect failed");
}

/* ---------------------------------------------------------------- the schedule */

struct due {
	struct runtime *rt;
	struct probe *p[MAX_DUE];
	int n;
	int64_t now;
};

/* The request of a probe for U: the HTTP/1.1 request, or HTTP/2's path and authority. */
static void probe_request(struct probe *p, const struct cfg_upstream *u, const char *host)
{
	const struct cfg_health *h = &u->health;
	const char *path = p->grpc ? GRPC_HEALTH_PATH : h->active_path;
	if (p->grpc)
		p->msglen = grpc_health_request(h->active_service, strlen(h->active_service), p->msg,
		                                sizeof(p->msg));
	if (p->h2) {
		/* the path, a NUL, the authority */
		int n = snprintf(p->req, sizeof(p->req), "%s%c%s", path, 0, host);
		p->pathlen = strlen(path);
		if (n < 0 || (size_t)n >= sizeof(p->req)) {
			/* cut, but both stay NUL-terminated inside the buffer */
			if (p->pathlen > sizeof(p->req) - 2)
				p->pathlen = sizeof(p->req) - 2;
			p->req[p->pathlen] = 0;
			p->req[sizeof(p->req) - 1] = 0;
		}
	} else {
		snprintf(p->req, sizeof(p->req), "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: "
		         "retrygate-probe\r\nConnection: close\r\n\r\n", path, host);
	}
}

static void due_cb(void *arg, const struct cfg_upstream *u, struct ep_state *ep)
{
	struct due *d = arg;
	const struct cfg_health *h = &u->health;
	if (!cfg_health_active(h) || ep->probing || ep->probe_next_us > d->now || d->n >= MAX_DUE)
		return;
	/* the probe holds the context: a reload may free the runtime while it connects */
	SSL_CTX *tls = runtime_upstream(d->rt, u)->tls;
	if (tls && SSL_CTX_up_ref(tls) != 1)
		return;
	struct probe *p = xcalloc(1, sizeof(*p));
	p->magic = PROBE_MAGIC;
	p->up_id = ep->up->id;
	p->index = ep->index;
	p->serial = atomic_load(&ep->serial);
	p->unhealthy_after = h->unhealthy_after;
	p->healthy_after = h->healthy_after;
	p->timeout_us = h->active_timeout_us;
	p->grpc_status = -1;
	memcpy(&p->addr, &ep->addr, sizeof(p->addr));
	p->addrlen = ep->addrlen;
	p->h2 = u->protocol == UP_H2;
	p->grpc = h->active_kind == PROBE_GRPC;
	if (tls) {
		/* as the attempts do: tls.sni, else the endpoint's name (not an address) */
		char name[256];
		const char *sni = tls_server_name(u->tls_sni, ep->host, name, sizeof(name));
		snprintf(p->sni, sizeof(p->sni), "%s", sni ? sni : "");
		p->tls = tls;
		p->verify = u->tls_verify;
	}
	probe_request(p, u, *u->host_rewrite ? u->host_rewrite : ep->host);
	ep->probing = true;
	ep->probe_next_us = d->now + h->active_interval_us;
	d->p[d->n++] = p;
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct runtime *rt = runtime_current();
	if (rt) {
		struct due d = { .rt = rt, .n = 0, .now = clock_now_us() };
		runtime_eps_walk(rt, due_cb, &d);
		runtime_unref(rt);
		for (int i = 0; i < d.n; i++)
			probe_send(d.p[i]);
	}
	struct timeval tv = clock_tv(TICK_US);
	evtimer_add(p_tick, &tv);
}

int probe_start(struct event_base *base)
{
	p_base = base;
	p_tick = evtimer_new(base, tick_cb, NULL);
	if (!p_tick)
		return -1;
	struct timeval tv = clock_tv(TICK_US);
	evtimer_add(p_tick, &tv);
	return 0;
}

void probe_stop(void)
{
	while (!LIST_EMPTY(&p_active))
		probe_free(LIST_FIRST(&p_active));
	if (p_tick)
		event_free(p_tick);
	p_tick = NULL;
}
