/*
 * admin: a small HTTP/1.1 server for operators. One request at a time per connection,
 * keep-alive. POST /retries, /faults and /unknown/ack need the bearer token when admin.token
 * is set, else a loopback peer (SPEC §7).
 *
 * Pipelined requests are answered in order, but a client that sends and never reads must not
 * make us hold its answers without bound (GETs need no token): above ADMIN_OUT_HIGH bytes of
 * answers no further request is parsed until they drained, and the input buffer's high-water
 * mark then stops reading from the socket.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "app/admin.h"
#include "config/config.h"
#include "policy/faults.h"
#include "http/h1_parser.h"
#include "net/listener.h"
#include "base/log.h"
#include "http/h1_write.h"
#include "obs/reconcile.h"
#include "http/respond.h"
#include "obs/stats.h"
#include "state/runtime.h"
#include "state/upstream.h"
#include "base/util.h"

#define ADMIN_OUT_HIGH (64 * 1024)     /* answers queued for the client: parse no request */
#define ADMIN_IN_HIGH (64 * 1024)      /* requests queued: stop reading (a head always fits) */

struct admin_conn {
	struct bufferevent *strm;
	struct http_msg *req;
	struct evbuffer *sink;
	bool loopback;
	bool peer_done;                 /* the client sent EOF: answer what it sent, then close */
	bool closing;                   /* nothing more is parsed: close once the output drained */
	bool head;                      /* the request answered is a HEAD */
	char peer[64];
	LIST_ENTRY(admin_conn) link;
};

static struct evconnlistener *admin_evl;
static struct event_base *admin_base;
static LIST_HEAD(, admin_conn) admin_conns = LIST_HEAD_INITIALIZER(admin_conns);
static _Atomic int admin_state = ADMIN_STARTING;
static char *admin_token;

void admin_set_state(enum admin_state st)
{
	atomic_store(&admin_state, st);
}

void admin_reconfigure(const struct config *cfg)
{
	free(admin_token);
	admin_token = xstrdup(cfg->admin_token ? cfg->admin_token : "");
}

static int hex_value(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

static void conn_free(struct admin_conn *c)
{
	LIST_REMOVE(c, link);
	bufferevent_free(c->strm);
	http_msg_free(c->req);
	evbuffer_free(c->sink);
	free(c);
}

/* A HEAD answer says the length the GET's would have, without the body (RFC 9110 §9.3.2). */
static void respond(struct admin_conn *c, int status, const char *ctype, struct evbuffer *body)
{
	struct evbuffer *o = bufferevent_get_output(c->strm);
	evbuffer_add_printf(o, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s\r\n",
	                    status, respond_status_text(status), ctype, evbuffer_get_length(body),
	                    c->closing ? "Connection: close\r\n" : "");
	if (c->head)
		evbuffer_drain(body, evbuffer_get_length(body));
	else
		evbuffer_add_buffer(o, body);
}

static void respond_text(struct admin_conn *c, int status, const char *text)
{
	struct evbuffer *b = evbuffer_new();
	evbuffer_add_printf(b, "%s\n", text);
	respond(c, status, "text/plain; charset=utf-8", b);
	evbuffer_free(b);
}

/* 404 for POST /retries?upstream=NAME naming no upstream: JSON like the rest of /retries.
 * NAME comes from the query as sent, so it is escaped. */
static void respond_unknown_upstream(struct admin_conn *c, const char *name)
{
	struct evbuffer *b = evbuffer_new();
	evbuffer_add_printf(b, "{\"error\":\"unknown upstream\",\"upstream\":\"");
	for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
		if (*p == '"' || *p == '\\')
			evbuffer_add_printf(b, "\\%c", *p);
		else if (*p < 0x20 || *p == 0x7f)
			evbuffer_add_printf(b, "\\u%04x", *p);
		else
			evbuffer_add(b, p, 1);
	}
	evbuffer_add(b, "\"}\n", 3);
	respond(c, 404, "application/json", b);
	evbuffer_free(b);
}

static void render_retries(struct evbuffer *b)
{
	evbuffer_add(b, "{", 1);
	bool first = true;
	struct runtime *rt = runtime_current();
	for (int i = 0; i < rt->cfg->nupstreams; i++) {
		struct upstream_state *st = rt->ups[i].st;
		evbuffer_add_printf(b, "%s\"%s\":%s", first ? "" : ",", st->name,
		                    atomic_load(&st->runtime_enabled) ? "true" : "false");
		first = false;
	}
	runtime_unref(rt);
	evbuffer_add(b, "}\n", 2);
}

/* %XX and '+' decoded from RAW into OUT (CAP bytes, NUL-terminated); a bad escape is kept
 * as written. */
static void url_decode(const char *raw, char *out, size_t cap)
{
	size_t k = 0;
	for (const char *p = raw; *p && k + 1 < cap; p++) {
		int hi, lo;
		if (*p == '%' && (hi = hex_value(p[1])) >= 0 && (lo = hex_value(p[2])) >= 0) {
			out[k++] = (char)(hi * 16 + lo);
			p += 2;
		} else {
			out[k++] = *p == '+' ? ' ' : *p;
		}
	}
	out[k] = 0;
}

/* value of query parameter NAME in Q (not decoded: names and booleans need none) */
static bool query_param(const char *q, size_t qlen, const char *name, char *out, size_t cap)
{
	size_t nl = strlen(name);
	const char *p = q, *end = q + qlen;
	while (p < end) {
		const char *amp = memchr(p, '&', (size_t)(end - p));
		const char *e = amp ? amp : end;
		if ((size_t)(e - p) > nl && memcmp(p, name, nl) == 0 && p[nl] == '=') {
			size_t vl = (size_t)(e - p) - nl - 1;
			if (vl >= cap)
				vl = cap - 1;
			memcpy(out, p + nl + 1, vl);
			out[vl] = 0;
			return true;
		}
		p = e + 1;
	}
	return false;
}

/* The rule of every POST: the bearer token when admin.token is set, else a loopback peer.
 * False: the 403 was sent. */
static bool post_allowed(struct admin_conn *c, const struct http_head *h)
{
	if (admin_token && admin_token[0]) {
		size_t n;
		const char *auth = http_head_get(h, "Authorization", &n);
		size_t tl = strlen(admin_token);
		if (!auth || n != tl + 7 || strncasecmp(auth, "Bearer ", 7) != 0 ||
		    memcmp(auth + 7, admin_token, tl) != 0) {
			respond_text(c, 403, "forbidden: bearer token required");
			return false;
		}
	} else if (!c->loopback) {
		respond_text(c, 403, "forbidden: POST only from loopback (or set admin.token)");
		return false;
	}
	return true;
}

/* The enabled=true|false of a switch's POST into *ON; false: the 400 was sent. */
static bool query_enabled(struct admin_conn *c, const char *q, size_t qlen, bool *on)
{
	char en[16];
	if (!query_param(q, qlen, "enabled", en, sizeof(en)) ||
	    (strcmp(en, "true") != 0 && strcmp(en, "false") != 0)) {
		respond_text(c, 400, "enabled=true|false required");
		return false;
	}
	*on = strcmp(en, "true") == 0;
	return true;
}

static void post_retries(struct admin_conn *c, const struct http_head *h, const char *q, size_t qlen)
{
	char up[256];
	bool on;
	if (!post_allowed(c, h) || !query_enabled(c, q, qlen, &on))
		return;
	bool one = query_param(q, qlen, "upstream", up, sizeof(up));
	struct runtime *rt = runtime_current();
	bool found = false;
	for (int i = 0; i < rt->cfg->nupstreams; i++) {
		struct upstream_state *st = rt->ups[i].st;
		if (one && strcmp(st->name, up) != 0)
			continue;
		found = true;
		atomic_store(&st->runtime_enabled, on);
		log_info("admin: retries %s for upstream %s (from %s)", on ? "enabled" : "disabled",
		         st->name, c->peer);
	}
	runtime_unref(rt);
	if (one && !found) {
		respond_unknown_upstream(c, up);
		return;
	}
	struct evbuffer *b = evbuffer_new();
	render_retries(b);
	respond(c, 200, "application/json", b);
	evbuffer_free(b);
}

/* GET /faults (SPEC §11): per upstream (as GET /retries), the switch, since when, why it last
 * stopped by itself, and the faults injected so far by kind. An upstream without rules is
 * never enabled. */
static void render_faults(struct evbuffer *b)
{
	evbuffer_add(b, "{", 1);
	bool first = true;
	struct runtime *rt = runtime_current();
	for (int i = 0; i < rt->cfg->nupstreams; i++) {
		struct upstream_state *st = rt->ups[i].st;
		bool on = atomic_load(&st->faults_on) && rt->cfg->upstreams[i].faults.nrules > 0;
		evbuffer_add_printf(b, "%s\"%s\":{\"enabled\":%s,\"since\":", first ? "" : ",",
		                    st->name, on ? "true" : "false");
		first = false;
		time_t since = (time_t)atomic_load(&st->faults_since_wall);
		struct tm tm;
		char ts[32];
		if (on && gmtime_r(&since, &tm) && strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", &tm))
			evbuffer_add_printf(b, "\"%s\"", ts);
		else
			evbuffer_add(b, "null", 4);
		const char *stopped = on ? NULL : faults_stop_name(atomic_load(&st->faults_stopped));
		if (stopped)
			evbuffer_add_printf(b, ",\"stopped\":\"%s\"", stopped);
		else
			evbuffer_add_printf(b, ",\"stopped\":null");
		evbuffer_add_printf(b, ",\"injected\":{");
		for (int k = 0; k < FAULT_NKINDS; k++) {
			uint64_t n = 0;
			for (int w = 0; w < g_nworkers; w++)
				n += atomic_load_explicit(&st->stats[w].faults_injected[k], memory_order_relaxed);
			evbuffer_add_printf(b, "%s\"%s\":%llu", k ? "," : "", faults_kind_name(k),
			                    (unsigned long long)n);
		}
		evbuffer_add(b, "}}", 2);
	}
	runtime_unref(rt);
	evbuffer_add(b, "}\n", 2);
}

/* POST /faults?upstream=NAME&enabled=true|false: one upstream, which must have rules. */
static void post_faults(struct admin_conn *c, const struct http_head *h, const char *q, size_t qlen)
{
	char up[256];
	bool on, found = false;
	if (!post_allowed(c, h) || !query_enabled(c, q, qlen, &on))
		return;
	if (!query_param(q, qlen, "upstream", up, sizeof(up))) {
		respond_text(c, 400, "upstream=NAME required");
		return;
	}
	struct runtime *rt = runtime_current();
	for (int i = 0; i < rt->cfg->nupstreams; i++) {
		struct upstream_state *st = rt->ups[i].st;
		if (strcmp(st->name, up) != 0 || rt->cfg->upstreams[i].faults.nrules == 0)
			continue;
		found = true;
		upstream_faults_switch(st, on, 0);
		log_info("admin: faults %s for upstream %s (from %s)", on ? "enabled" : "disabled",
		         st->name, c->peer);
	}
	runtime_unref(rt);
	if (!found) {
		respond_unknown_upstream(c, up);
		return;
	}
	struct evbuffer *b = evbuffer_new();
	render_faults(b);
	respond(c, 200, "application/json", b);
	evbuffer_free(b);
}

/* POST /unknown/ack?id=ID (SPEC §12); the id is percent-decoded, so any X-Request-Id can be
 * named. */
static void post_unknown_ack(struct admin_conn *c, const struct http_head *h, const char *q,
                             size_t qlen)
{
	if (!post_allowed(c, h))
		return;
	char raw[512], id[512];
	if (!query_param(q, qlen, "id", raw, sizeof(raw)) || !raw[0]) {
		respond_text(c, 400, "id=ID required");
		return;
	}
	url_decode(raw, id, sizeof(id));
	if (!reconcile_ack(id)) {
		respond_text(c, 404, "no such record");
		return;
	}
	struct evbuffer *b = evbuffer_new();
	evbuffer_add_printf(b, "{\"acked\":true}\n");
	respond(c, 200, "application/json", b);
	evbuffer_free(b);
}

static void handle(struct admin_conn *c, const struct http_head *h)
{
	c->head = h->method_head;
	c->closing = !h->keep_alive;    /* the request's Connection: close (or HTTP/1.0) */
	const char *path = h->path;
	size_t plen = h->path_len;
	const char *q = memchr(path, '?', plen);
	size_t qlen = 0;
	if (q) {
		qlen = plen - (size_t)(q - path) - 1;
		plen = (size_t)(q - path);
		q++;
	}
#define IS(p) (plen == strlen(p) && memcmp(path, p, plen) == 0)
	bool get = strcmp(h->method, "GET") == 0 || strcmp(h->method, "HEAD") == 0;
	struct evbuffer *b = evbuffer_new();
	if (IS("/retries") && strcmp(h->method, "POST") == 0) {
		post_retries(c, h, q ? q : "", qlen);
	} else if (IS("/faults") && strcmp(h->method, "POST") == 0) {
		post_faults(c, h, q ? q : "", qlen);
	} else if (IS("/unknown/ack") && strcmp(h->method, "POST") == 0) {
		post_unknown_ack(c, h, q ? q : "", qlen);
	} else if (!get) {
		respond_text(c, 405, "method not allowed");
	} else if (IS("/healthz")) {
		respond_text(c, 200, "ok");
	} else if (IS("/ready")) {
		int st = atomic_load(&admin_state);
		respond_text(c, st == ADMIN_READY ? 200 : 503,
		             st == ADMIN_READY ? "ready" : st == ADMIN_DRAINING ? "draining" : "starting");
	} else if (IS("/metrics")) {
		stats_render_prometheus(b, runtime_stats_walk);
		respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", b);
	} else if (IS("/stats")) {
		stats_render_json(b, runtime_stats_walk);
		respond(c, 200, "application/json", b);
	} else if (IS("/config")) {
		struct runtime *rt = runtime_current();
		char *json = config_to_json(rt->cfg);
		runtime_unref(rt);
		evbuffer_add(b, json, strlen(json));
		free(json);
		respond(c, 200, "application/json", b);
	} else if (IS("/retries")) {
		render_retries(b);
		respond(c, 200, "application/json", b);
	} else if (IS("/faults")) {
		render_faults(b);
		respond(c, 200, "application/json", b);
	} else if (IS("/unknown")) {
		char raw[256], up[256];
		bool one = q && query_param(q, qlen, "upstream", raw, sizeof(raw));
		if (one)
			url_decode(raw, up, sizeof(up));
		reconcile_render(b, one ? up : NULL);
		respond(c, 200, "application/json", b);
	} else {
		respond_text(c, 404, "not found");
	}
#undef IS
	evbuffer_free(b);
}

/* Answer the requests in the input, in order, while the answers queued stay under
 * ADMIN_OUT_HIGH; admin_write_cb resumes once they drained. */
static void admin_process(struct admin_conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->strm);
	struct evbuffer *out = bufferevent_get_output(c->strm);
	while (!c->closing && evbuffer_get_length(out) <= ADMIN_OUT_HIGH) {
		enum http_event ev = http_msg_feed(c->req, in, c->sink, 64 * 1024);
		switch (ev) {
		case HTTP_NEED_MORE:
			if (c->peer_done)
				c->closing = true;
			return;
		case HTTP_HEAD:
		case HTTP_BODY:
			evbuffer_drain(c->sink, evbuffer_get_length(c->sink));
			if (ev == HTTP_HEAD && !http_msg_head(c->req)->chunked &&
			    http_msg_head(c->req)->content_length <= 0) {
				handle(c, http_msg_head(c->req));
				http_msg_next(c->req);
			}
			continue;
		case HTTP_DONE:
			if (http_msg_head(c->req)->chunked || http_msg_head(c->req)->content_length > 0)
				handle(c, http_msg_head(c->req));
			http_msg_next(c->req);
			continue;
		case HTTP_ERROR: {
			int st;
			const char *reason, *detail;
			http_msg_error(c->req, &st, &reason, &detail);
			struct made_response m;
			respond_error(&m, st, reason, "", 0, NULL, NULL, true);
			h1_response_head(out, &m.head, respond_status_text(st), H1_LENGTH, H1_CONN_CLOSE);
			evbuffer_add(out, m.body, m.body_len);
			bufferevent_disable(c->strm, EV_READ);
			c->closing = true;
			return;
		}
		}
	}
}

/* Frees C when it is closing and everything was written: C is not to be used after. */
static void close_if_done(struct admin_conn *c)
{
	if (c->closing && evbuffer_get_length(bufferevent_get_output(c->strm)) == 0)
		conn_free(c);
}

static void admin_read_cb(struct bufferevent *strm, void *arg)
{
	admin_process(arg);
}

/* The output drained (the write low-water mark is 0): take the requests held back, or
 * close. */
static void admin_write_cb(struct bufferevent *strm, void *arg)
{
	struct admin_conn *c = arg;
	admin_process(c);
	close_if_done(c);
}

static void admin_event_cb(struct bufferevent *strm, short what, void *arg)
{
	struct admin_conn *c = arg;
	if ((what & BEV_EVENT_EOF) && !(what & (BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))) {
		/* a half-close after pipelined requests: they are still answered */
		c->peer_done = true;
		admin_process(c);
		close_if_done(c);
		return;
	}
	conn_free(c);
}

void admin_serve(struct event_base *base, int fd, const struct sockaddr *sa)
{
	struct admin_conn *c = xcalloc(1, sizeof(*c));
	c->strm = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
	struct http_limits lim = { 16 * 1024, 8 * 1024 };
	c->req = http_msg_new(HTTP_REQUEST_KIND, &lim);
	c->sink = evbuffer_new();
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
		inet_ntop(AF_INET, &s4->sin_addr, c->peer, sizeof(c->peer));
		c->loopback = (ntohl(s4->sin_addr.s_addr) >> 24) == 127;
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
		inet_ntop(AF_INET6, &s6->sin6_addr, c->peer, sizeof(c->peer));
		c->loopback = IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr) ||
		              (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr) && s6->sin6_addr.s6_addr[12] == 127);
	}
	LIST_INSERT_HEAD(&admin_conns, c, link);
	bufferevent_setcb(c->strm, admin_read_cb, admin_write_cb, admin_event_cb, c);
	bufferevent_setwatermark(c->strm, EV_READ, 0, ADMIN_IN_HIGH);
	struct timeval tv = { 60, 0 };
	bufferevent_set_timeouts(c->strm, &tv, &tv);
	bufferevent_enable(c->strm, EV_READ | EV_WRITE);
}

static void admin_accept_cb(struct evconnlistener *evl, evutil_socket_t fd, struct sockaddr *sa,
                            int salen, void *arg)
{
	admin_serve(evconnlistener_get_base(evl), fd, sa);
}

static void admin_listen_on(int fd)
{
	admin_evl = evconnlistener_new(admin_base, admin_accept_cb, NULL,
	                               LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, fd);
}

int admin_start(struct event_base *base, const struct config *cfg)
{
	admin_base = base;
	admin_reconfigure(cfg);
	if (!cfg->admin_listen || !cfg->admin_listen[0])
		return 0;
	const char *err = NULL;
	int fd = listener_bind_single(cfg->admin_listen, &err);
	if (fd < 0) {
		fprintf(stderr, "%s: admin: cannot listen on %s: %s\n", cfg->path, cfg->admin_listen, err);
		return -1;
	}
	admin_listen_on(fd);
	log_info("admin listening on %s", cfg->admin_listen);
	return 0;
}

int admin_bind_moved(const struct config *old, const struct config *cfg, int *fd)
{
	const char *err = NULL;
	*fd = -1;
	if (strcmp(old->admin_listen, cfg->admin_listen) == 0 || !cfg->admin_listen[0])
		return 0;
	*fd = listener_bind_single(cfg->admin_listen, &err);
	if (*fd >= 0)
		return 0;
	log_error("reload of %s failed; the old config keeps serving: admin: cannot listen on %s: "
	          "%s", cfg->path, cfg->admin_listen, err);
	return -1;
}

void admin_move(const struct config *old, const struct config *cfg, int fd)
{
	if (strcmp(old->admin_listen, cfg->admin_listen) == 0)
		return;
	if (admin_evl)
		evconnlistener_free(admin_evl);
	admin_evl = NULL;
	/* the old address's connections end as in a drain: after what they are answering */
	struct admin_conn *c, *next;
	for (c = LIST_FIRST(&admin_conns); c; c = next) {
		next = LIST_NEXT(c, link);
		c->closing = true;
		close_if_done(c);
	}
	if (fd >= 0) {
		admin_listen_on(fd);
		log_info("reload: admin listening on %s (was %s)", cfg->admin_listen,
		         old->admin_listen[0] ? old->admin_listen : "off");
	} else {
		log_info("reload: admin listener %s closed", old->admin_listen);
	}
}

void admin_stop(void)
{
	if (admin_evl)
		evconnlistener_free(admin_evl);
	admin_evl = NULL;
	while (!LIST_EMPTY(&admin_conns))
		conn_free(LIST_FIRST(&admin_conns));
	free(admin_token);
	admin_token = NULL;
}
