/*
 * probe: active health checks (see probe.h). A probe carries its endpoint's (upstream id,
 * index, serial), never a pointer: the address may be forgotten while the probe runs, and then
 * its result is dropped. Results change the endpoint under the registry lock; the request path
 * only reads the probe_down flag.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>

#include "base/clock.h"
#include "config/config.h"
#include "base/log.h"
#include "state/probe.h"
#include "state/runtime.h"
#include "state/upstream.h"
#include "base/util.h"

#define PROBE_MAGIC   0x9a0be000u
#define TICK_US       (100 * 1000LL)
#define MAX_DUE       256
#define MAX_HEAD      4096

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
	bool h2;                        /* protocol: h2 upstream: the probe speaks HTTP/2 too */
	nghttp2_session *ng;
	int status;                     /* HTTP/2: the response's :status, 0 until it came */
	bool ended;                     /* HTTP/2: the stream closed (a verdict is due) */
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
	if (f->hd.type == NGHTTP2_HEADERS && nlen == 7 && memcmp(name, ":status", 7) == 0 &&
	    vlen == 3 && p->status == 0) {
		int st = (value[0] - '0') * 100 + (value[1] - '0') * 10 + (value[2] - '0');
		if (st >= 200 && st <= 999)
			p->status = st;     /* a 1xx is not the answer */
	}
	return 0;
}

static int h2_close_cb(nghttp2_session *ng, int32_t id, uint32_t code, void *arg)
{
	((struct probe *)arg)->ended = true;
	return 0;
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

/* A GET of the path on a prior-knowledge HTTP/2 connection: the same question as the
 * HTTP/1.1 probe, asked in the endpoint's protocol (an h2c server does not read HTTP/1). */
static bool h2_start(struct probe *p)
{
	nghttp2_session_callbacks *cb;
	if (nghttp2_session_callbacks_new(&cb) != 0)
		return false;
	nghttp2_session_callbacks_set_on_header_callback(cb, h2_header_cb);
	nghttp2_session_callbacks_set_on_stream_close_callback(cb, h2_close_cb);
	int rv = nghttp2_session_client_new(&p->ng, cb, p);
	nghttp2_session_callbacks_del(cb);
	if (rv != 0)
		return false;
	const char *auth = p->req + p->pathlen + 1;
	nghttp2_nv nv[] = {
		{ (uint8_t *)":method", (uint8_t *)"GET", 7, 3, NGHTTP2_NV_FLAG_NONE },
		{ (uint8_t *)":scheme", (uint8_t *)"http", 7, 4, NGHTTP2_NV_FLAG_NONE },
		{ (uint8_t *)":authority", (uint8_t *)auth, 10, strlen(auth), NGHTTP2_NV_FLAG_NONE },
		{ (uint8_t *)":path", (uint8_t *)p->req, 5, p->pathlen, NGHTTP2_NV_FLAG_NONE },
		{ (uint8_t *)"user-agent", (uint8_t *)"retrygate-probe", 10, 15, NGHTTP2_NV_FLAG_NONE },
	};
	return nghttp2_submit_settings(p->ng, NGHTTP2_FLAG_NONE, NULL, 0) == 0 &&
	       nghttp2_submit_request(p->ng, NULL, nv, sizeof(nv) / sizeof(nv[0]), NULL, NULL) > 0 &&
	       h2_flush(p);
}

static void h2_read(struct probe *p, struct evbuffer *in)
{
	size_t n = evbuffer_get_length(in);
	ssize_t used = nghttp2_session_mem_recv(p->ng, evbuffer_pullup(in, -1), n);
	evbuffer_drain(in, n);
	if (used < 0) {
		probe_end(p, false, "bad HTTP/2");
		return;
	}
	char why[32];
	snprintf(why, sizeof(why), "status %d", p->status);
	if (p->status) {
		probe_end(p, p->status <= 299, why);        /* the head is the answer */
		return;
	}
	if (p->ended || !h2_flush(p))
		probe_end(p, false, "stream closed without a status");
}

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

static void probe_event_cb(struct bufferevent *strm, short what, void *arg)
{
	struct probe *p = arg;
	MAGIC_CHECK(p, PROBE_MAGIC);
	if (what & BEV_EVENT_CONNECTED)
		return;
	probe_end(p, false, what & BEV_EVENT_EOF ? "closed" : "connect or read error");
}

static void probe_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
	struct probe *p = arg;
	MAGIC_CHECK(p, PROBE_MAGIC);
	probe_end(p, false, "timeout");
}

static void probe_send(struct probe *p)
{
	p->strm = bufferevent_socket_new(p_base, -1, BEV_OPT_CLOSE_ON_FREE);
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

struct due {
	struct probe *p[MAX_DUE];
	int n;
	int64_t now;
};

static void due_cb(void *arg, const struct cfg_upstream *u, struct ep_state *ep)
{
	struct due *d = arg;
	const struct cfg_health *h = &u->health;
	/* probes speak plain HTTP/1.1: a TLS upstream keeps passive health only */
	if (!*h->active_path || u->tls || ep->probing || ep->probe_next_us > d->now || d->n >= MAX_DUE)
		return;
	struct probe *p = xcalloc(1, sizeof(*p));
	p->magic = PROBE_MAGIC;
	p->up_id = ep->up->id;
	p->index = ep->index;
	p->serial = atomic_load(&ep->serial);
	p->unhealthy_after = h->unhealthy_after;
	p->healthy_after = h->healthy_after;
	p->timeout_us = h->active_timeout_us;
	memcpy(&p->addr, &ep->addr, sizeof(p->addr));
	p->addrlen = ep->addrlen;
	const char *host = *u->host_rewrite ? u->host_rewrite : ep->host;
	p->h2 = u->protocol == UP_H2;
	if (p->h2) {
		/* the path, a NUL, the authority */
		int n = snprintf(p->req, sizeof(p->req), "%s%c%s", h->active_path, 0, host);
		p->pathlen = strlen(h->active_path);
		if (n < 0 || (size_t)n >= sizeof(p->req))
			p->req[sizeof(p->req) - 1] = 0;
	} else {
		snprintf(p->req, sizeof(p->req), "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: "
		         "retrygate-probe\r\nConnection: close\r\n\r\n", h->active_path, host);
	}
	ep->probing = true;
	ep->probe_next_us = d->now + h->active_interval_us;
	d->p[d->n++] = p;
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct runtime *rt = runtime_current();
	if (rt) {
		struct due d = { .n = 0, .now = clock_now_us() };
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
