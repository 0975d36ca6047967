/*
 * exchange: one request, its attempts, and the retry loop between them (see exchange.h).
 *
 *   X_WAIT_BODY --body end--> X_ATTEMPT --head/failure--> decide() --retry--> X_BACKOFF
 *        |                        ^                          |                    |
 *        +--(streamed body)-------+                          +--relay--> X_RELAY  |
 *                                  +---------------backoff timer------------------+
 *   and from anywhere: X_DONE (finish(): response queued, on_done reported once).
 *
 * Slots: an attempt holds a max_in_flight slot from when it is sent to when it ends (for a
 * relayed response: its last body byte); a retry holds a max_retries_in_flight slot from the
 * decision, through its wait, to its end. A response that was retried is kept (head and up
 * to retry.max_body of body) so that, if no later attempt produces a response, the client
 * still gets the last one any attempt produced (SPEC §4).
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "accesslog.h"
#include "attempt.h"
#include "clock.h"
#include "config.h"
#include "deadline.h"
#include "exchange.h"
#include "http.h"
#include "idempotency.h"
#include "log.h"
#include "reply.h"
#include "retry.h"
#include "route.h"
#include "stats.h"
#include "upstream.h"
#include "stream.h"
#include "util.h"
#include "loop.h"

#define EXCHANGE_MAGIC 0xe8c4a46eu
#define CLIENT_HIGH   (256 * 1024)    /* client output above this: stop reading the upstream */
#define STREAM_HIGH   (256 * 1024)    /* upstream output above this: stop reading the client */

enum xstate { X_NEW, X_WAIT_BODY, X_CLAIM, X_ATTEMPT, X_BACKOFF, X_RELAY, X_DONE };
enum bmode { B_NONE, B_BUFFER, B_STREAM };

/* a response kept while its request is retried */
struct saved {
	bool valid;
	bool complete;
	struct attempt *a;              /* still collecting its body, or NULL */
	struct http_head h;
	struct http_hdr *hdrs;
	char *strings;
	struct evbuffer *body;
};

struct exchange {
	uint32_t magic;
	enum xstate state;
	struct loop *loop;
	struct runtime *rt;
	struct cfg_listener *l;
	struct client_info ci;
	char peer_ip[64];
	const struct http_head *req;
	struct stream *cbev;
	struct evbuffer *cout;
	struct exchange_cbs cbs;
	void *arg;

	struct cfg_upstream *up;
	struct upstream_binding *ub;
	struct upstream_state *st;
	struct ustats *us;

	int64_t t0_us, deadline_us, given_us;
	bool dl_present[DL_NKINDS];
	bool req_nested, has_key;
	enum method_class mclass;
	const char *key; size_t keylen;

	enum bmode bmode;
	struct evbuffer *body;
	int64_t body_len;
	bool body_done, has_body;

	struct attempt *att;            /* the attempt waiting for its head */
	struct attempt *relay;          /* the attempt whose response goes to the client */
	struct ep_state *att_ep;
	bool slot_in_flight, slot_retry;
	struct ep_state *next_ep;
	int attempts;
	uint64_t tried;
	enum outcome last_out;
	bool last_bad;
	struct saved saved;
	enum refusal refused;

	struct event *deadline_ev, *backoff_ev;
	bool head_sent, resp_chunked, close_after;
	int resp_status;
	char reqid[132];                /* the client's X-Request-Id (truncated), else ours */
	struct access_rec log;

	/* SPEC §6 enforcement at this hop */
	bool idem;                      /* enforced for this request (enabled, method, key) */
	bool idem_claimed;              /* this request owns the key */
	struct idem_store *store;
	struct idem_op *idem_op;        /* a claim waiting for its answer */
	struct idem_key ikey;
	struct evbuffer *idem_hdrs;     /* the relayed head lines, to store */
	struct evbuffer *idem_body;     /* the relayed body, up to max_response */
	bool idem_overflow;
	int last_att_status;            /* the last attempt's response status, 0: none */
	bool reached;                   /* some attempt may have reached the upstream */
	bool resp_complete;             /* a relayed response went out whole */
};

static void decide(struct exchange *ex, enum outcome out, const struct http_head *h, bool bad);
static void start_attempt(struct exchange *ex, struct ep_state *ep, bool retry);
static void deliver_last(struct exchange *ex);
static void exchange_go(struct exchange *ex);
static bool idem_method(const struct cfg_idempotency *ic, const char *method);

static const struct attempt_cbs attempt_callbacks;

/* ------------------------------------------------------------------ helpers */

static bool hdr_is(const struct http_hdr *h, const char *name)
{
	return str_ieq(h->name, h->nlen, name, strlen(name));
}

static int64_t hdr_int(const struct http_head *h, const char *name)
{
	size_t n;
	const char *v = http_head_get(h, name, &n);
	if (!v || n == 0 || n > 18)
		return -1;
	int64_t x = 0;
	for (size_t i = 0; i < n; i++) {
		if (v[i] < '0' || v[i] > '9')
			return -1;
		x = x * 10 + (v[i] - '0');
	}
	return x;
}

/* Header lines are written with memcpy into one stack buffer and one evbuffer_add: this is
 * the per-request path, and printf-style formatting was a visible share of its CPU. */
static size_t fmt_i64(char *p, int64_t v)
{
	char tmp[24];
	size_t n = 0;
	uint64_t u = v < 0 ? (uint64_t)-v : (uint64_t)v;
	do {
		tmp[n++] = (char)('0' + u % 10);
		u /= 10;
	} while (u);
	size_t o = 0;
	if (v < 0)
		p[o++] = '-';
	while (n)
		p[o++] = tmp[--n];
	return o;
}

/* "name: v1v2v3\r\n" in one evbuffer_add when it fits the stack buffer */
static void add_hdr3(struct evbuffer *b, const char *name, size_t nlen, const char *v1, size_t l1,
                     const char *v2, size_t l2, const char *v3, size_t l3)
{
	char tmp[512];
	const char *part[5] = { name, ": ", v1, v2, v3 };
	size_t len[5] = { nlen, 2, l1, l2, l3 };
	if (nlen + l1 + l2 + l3 + 4 > sizeof(tmp)) {
		for (int i = 0; i < 5; i++)
			if (len[i] > 0)
				evbuffer_add(b, part[i], len[i]);
		evbuffer_add(b, "\r\n", 2);
		return;
	}
	size_t n = 0;
	for (int i = 0; i < 5; i++) {
		if (len[i] == 0)
			continue;       /* an absent piece is NULL: memcpy must not see it */
		memcpy(tmp + n, part[i], len[i]);
		n += len[i];
	}
	tmp[n++] = '\r';
	tmp[n++] = '\n';
	evbuffer_add(b, tmp, n);
}

static void add_hdr(struct evbuffer *b, const char *name, size_t nlen, const char *v, size_t vlen)
{
	add_hdr3(b, name, nlen, v, vlen, NULL, 0, NULL, 0);
}

#define ADD_HDR_STR(b, lit, v, vlen) add_hdr((b), lit, sizeof(lit) - 1, (v), (vlen))

static void add_hdr_int(struct evbuffer *b, const char *name, size_t nlen, int64_t v)
{
	char num[24];
	add_hdr(b, name, nlen, num, fmt_i64(num, v));
}

#define ADD_HDR_INT(b, lit, v) add_hdr_int((b), lit, sizeof(lit) - 1, (v))

/* "<a>, <b>": a forwarded header with our hop appended */
static void add_hdr_appended(struct evbuffer *b, const char *name, size_t nlen, const char *v,
                             size_t vlen, const char *ours)
{
	add_hdr3(b, name, nlen, v, vlen, ", ", 2, ours, strlen(ours));
}

static void release_slots(struct exchange *ex)
{
	if (ex->slot_in_flight) {
		upstream_release_in_flight(ex->st);
		ex->slot_in_flight = false;
	}
	if (ex->slot_retry) {
		upstream_release_retry_slot(ex->st);
		ex->slot_retry = false;
	}
}

static void saved_clear(struct saved *s)
{
	if (s->a)
		attempt_free(s->a);
	s->a = NULL;
	if (s->body)
		evbuffer_free(s->body);
	free(s->hdrs);
	free(s->strings);
	memset(s, 0, sizeof(*s));
}

/* Keep a deep copy of H: the attempt that parsed it goes on collecting the body. */
static void saved_keep(struct exchange *ex, const struct http_head *h, struct attempt *a)
{
	struct saved *s = &ex->saved;
	saved_clear(s);
	size_t total = h->reason_len + 1;
	for (int i = 0; i < h->nhdrs; i++)
		total += h->hdrs[i].nlen + h->hdrs[i].vlen + 2;
	s->strings = xmalloc(total);
	s->hdrs = xcalloc((size_t)h->nhdrs + 1, sizeof(*s->hdrs));
	char *p = s->strings;
	s->h = *h;
	memcpy(p, h->reason, h->reason_len);
	s->h.reason = p;
	p += h->reason_len + 1;
	for (int i = 0; i < h->nhdrs; i++) {
		s->hdrs[i] = h->hdrs[i];
		memcpy(p, h->hdrs[i].name, h->hdrs[i].nlen);
		s->hdrs[i].name = p;
		p += h->hdrs[i].nlen + 1;
		memcpy(p, h->hdrs[i].value, h->hdrs[i].vlen);
		s->hdrs[i].value = p;
		p += h->hdrs[i].vlen + 1;
	}
	s->h.hdrs = s->hdrs;
	s->body = evbuffer_new();
	s->valid = true;
	s->a = a;
}

static bool bodyless_response(const struct exchange *ex, int status)
{
	return ex->req->method_head || status == 204 || status == 304 || status < 200;
}

static void count_status(struct exchange *ex, int status)
{
	int c = status / 100;
	if (c >= 1 && c <= 5)
		STAT_INC(g_gstats[ex->loop->id].requests[c]);
}

/* ------------------------------------------------------------------ finishing */

/* SPEC §6: the claim follows the last attempt. Called once, when the exchange ends. */
static void idem_settle(struct exchange *ex)
{
	if (ex->idem_op) {
		idem_cancel(ex->idem_op);
		ex->idem_op = NULL;
	}
	if (!ex->idem_claimed)
		return;
	ex->idem_claimed = false;
	const struct cfg_idempotency *ic = &ex->up->idem;
	int64_t blen = (ex->idem_overflow || !ex->idem_body || !ex->resp_complete)
	               ? -1 : (int64_t)evbuffer_get_length(ex->idem_body);
	switch (idem_disposition(ex->last_att_status, ex->reached, blen, ic->max_response)) {
	case IDEM_AFTER_STORE: {
		struct idem_response resp = {
			.status = ex->last_att_status,
			.headers = (const char *)evbuffer_pullup(ex->idem_hdrs, -1),
			.headers_len = evbuffer_get_length(ex->idem_hdrs),
			.body = (const char *)evbuffer_pullup(ex->idem_body, -1),
			.body_len = (size_t)blen,
		};
		idem_complete(ex->store, &ex->ikey, &resp, ic->ttl_us);
		STAT_INC(ex->us->idem[IS_STORED]);
		break;
	}
	case IDEM_AFTER_KEEP:
		idem_keep_claimed(ex->store, &ex->ikey, ic->ttl_us);
		break;
	case IDEM_AFTER_RELEASE:
		idem_release(ex->store, &ex->ikey);
		break;
	case IDEM_AFTER_EXPIRE:
		break;
	}
}

/* Stop everything the exchange runs: timers, attempts, slots, the kept response, the claim.
 * Used once, by finish() or exchange_abort(). */
static void exchange_end(struct exchange *ex)
{
	ex->state = X_DONE;
	release_slots(ex);
	evtimer_del(ex->deadline_ev);
	evtimer_del(ex->backoff_ev);
	attempt_free(ex->att);
	attempt_free(ex->relay);
	ex->att = ex->relay = NULL;
	saved_clear(&ex->saved);
	idem_settle(ex);
}

/* The access-log line: once per request, however it ended. */
static void log_request(struct exchange *ex, int64_t now)
{
	ex->log.status = ex->resp_status;
	ex->log.attempts = ex->attempts;
	ex->log.refused = ex->refused;
	ex->log.non_idempotent = ex->mclass == MC_OTHER;
	ex->log.last_out = ex->last_out;
	ex->log.duration_us = now - ex->t0_us;
	ex->log.deadline_left_us = ex->deadline_us ? ex->deadline_us - now : 0;
	accesslog_write(&ex->log);
}

static void noop_done(void *arg, bool close)
{
}

static void finish(struct exchange *ex, bool close)
{
	if (ex->state == X_DONE)
		return;
	exchange_end(ex);
	count_status(ex, ex->resp_status);
	int64_t now = clock_now_us();
	if (ex->us && ex->attempts > 0)
		stats_observe_duration(ex->us, now - ex->t0_us);
	if (ex->us && ex->attempts > 0 && ex->mclass == MC_OTHER &&
	    (ex->last_out == OUT_RESET || ex->last_out == OUT_TIMEOUT))
		STAT_INC(ex->us->unknown_outcomes);
	log_request(ex, now);
	ex->cbs.on_done(ex->arg, close || ex->close_after);
}

static void finish_tunnel(struct exchange *ex, struct stream *ubev)
{
	void (*on_done)(void *, bool) = ex->cbs.on_done;
	/* finish() reports on_done; a tunnel reports on_tunnel instead */
	ex->cbs.on_done = noop_done;
	finish(ex, false);
	ex->cbs.on_done = on_done;
	ex->cbs.on_tunnel(ex->arg, ubev);
}

static void finish_error(struct exchange *ex, int status, const char *reason, bool close,
                         const char *extra)
{
	char hdrs[256] = "";
	if (ex->refused != RR_NONE && ex->refused != RR_NOT_LISTED)
		snprintf(hdrs, sizeof(hdrs), "X-Retrygate-Retry-Refused: %s\r\n%s",
		         refusal_name(ex->refused), extra ? extra : "");
	else if (extra)
		snprintf(hdrs, sizeof(hdrs), "%s", extra);
	if (ex->has_body && !ex->body_done)
		close = true;       /* the rest of the request body was not read */
	close = close || ex->close_after || !ex->req->keep_alive || *ex->ci.draining;
	ex->resp_status = status;
	ex->log.reason = reason;
	(ex->req->method_head ? reply_error_head : reply_error)(
	        ex->cout, status, reason, ex->up ? ex->up->name : "", ex->attempts, close,
	        ex->req->version == 10 && ex->req->keep_alive, hdrs);
	finish(ex, close);
}

/* ------------------------------------------------------------------ response to the client */

static void write_head(struct exchange *ex, const struct http_head *h, enum refusal reason)
{
	struct evbuffer *o = ex->cout;
	bool bodyless = bodyless_response(ex, h->status);
	char line[320];
	size_t ln = 9;
	memcpy(line, "HTTP/1.1 ", 9);
	ln += fmt_i64(line + ln, h->status);
	line[ln++] = ' ';
	size_t rl = h->reason_len < 256 ? h->reason_len : 256;
	memcpy(line + ln, h->reason, rl);
	ln += rl;
	line[ln++] = '\r';
	line[ln++] = '\n';
	evbuffer_add(o, line, ln);
	bool own_refusal = reason != RR_NONE && reason != RR_NOT_LISTED;
	for (int i = 0; i < h->nhdrs; i++) {
		const struct http_hdr *x = &h->hdrs[i];
		if (x->hop || hdr_is(x, "X-Retrygate-Attempts"))
			continue;
		if (own_refusal && hdr_is(x, "X-Retrygate-Retry-Refused"))
			continue;
		add_hdr(o, x->name, x->nlen, x->value, x->vlen);
		if (ex->idem_claimed && !hdr_is(x, "X-Retrygate-Retry-Refused")) {
			evbuffer_add(ex->idem_hdrs, x->name, x->nlen);
			evbuffer_add(ex->idem_hdrs, ": ", 2);
			evbuffer_add(ex->idem_hdrs, x->value, x->vlen);
			evbuffer_add(ex->idem_hdrs, "\r\n", 2);
		}
	}
	ADD_HDR_INT(o, "X-Retrygate-Attempts", ex->attempts);
	if (own_refusal)
		evbuffer_add_printf(o, "X-Retrygate-Retry-Refused: %s\r\n", refusal_name(reason));
	ex->resp_chunked = false;
	if (h->status >= 200 && h->status != 204 && h->content_length >= 0 &&
	    (h->status != 304 || ex->req->method_head))
		ADD_HDR_INT(o, "Content-Length", h->content_length);
	else if (h->status == 304 && h->content_length >= 0)
		ADD_HDR_INT(o, "Content-Length", h->content_length);
	else if (!bodyless) {
		if (ex->req->version == 11) {
			evbuffer_add(o, "Transfer-Encoding: chunked\r\n", 28);
			ex->resp_chunked = true;
		} else {
			ex->close_after = true;     /* HTTP/1.0: the body ends with the connection */
		}
	}
	if (ex->has_body && !ex->body_done && ex->bmode != B_STREAM)
		ex->close_after = true;
	if (!ex->req->keep_alive || *ex->ci.draining)
		ex->close_after = true;
	if (ex->close_after)
		evbuffer_add(o, "Connection: close\r\n", 19);
	else if (ex->req->version == 10)
		evbuffer_add(o, "Connection: keep-alive\r\n", 24);
	evbuffer_add(o, "\r\n", 2);
	ex->head_sent = true;
	ex->resp_status = h->status;
	ex->log.ok_response = true;
}

static void relay_body(struct exchange *ex, struct evbuffer *data)
{
	size_t n = evbuffer_get_length(data);
	if (n == 0)
		return;
	if (ex->idem_claimed && !ex->idem_overflow) {
		if (evbuffer_get_length(ex->idem_body) + n > (size_t)ex->up->idem.max_response)
			ex->idem_overflow = true;   /* relayed, not stored: the key stays claimed */
		else
			evbuffer_add(ex->idem_body, evbuffer_pullup(data, -1), n);
	}
	if (ex->resp_chunked)
		http_chunk_encode(ex->cout, data, n);
	else
		evbuffer_add_buffer(ex->cout, data);
}

/* The response of attempt A goes to the client. */
static void relay_from(struct exchange *ex, struct attempt *a, const struct http_head *h,
                       enum refusal reason)
{
	ex->state = X_RELAY;
	ex->relay = a;
	if (ex->att == a)
		ex->att = NULL;
	write_head(ex, h, reason);
}

static void relay_saved(struct exchange *ex, enum refusal reason)
{
	struct saved *s = &ex->saved;
	if (s->complete)
		s->h.content_length = (int64_t)evbuffer_get_length(s->body);
	ex->state = X_RELAY;
	write_head(ex, &s->h, reason);
	relay_body(ex, s->body);
	if (s->complete) {
		if (ex->resp_chunked)
			http_chunk_last(ex->cout);
		ex->resp_complete = true;
		finish(ex, false);
		return;
	}
	/* its attempt is still collecting (or paused, full): from now on it streams to the client */
	ex->relay = s->a;
	s->a = NULL;
	s->valid = false;
	attempt_resume(ex->relay);
}

static void deliver_last(struct exchange *ex)
{
	if (ex->saved.valid) {
		relay_saved(ex, ex->refused);
		return;
	}
	switch (ex->last_out) {
	case OUT_CONNECT_FAILURE:
		finish_error(ex, 502, "connect-failure", false, NULL);
		break;
	case OUT_TIMEOUT:
		finish_error(ex, 504, "timeout", false, NULL);
		break;
	default:
		finish_error(ex, 502, ex->last_bad ? "bad-response" : "reset", false, NULL);
		break;
	}
}

/* ------------------------------------------------------------------ the upstream request */

static bool is_deadline_header(const struct http_hdr *h, int *kind)
{
	for (int k = 0; k < DL_NKINDS; k++)
		if (hdr_is(h, deadline_header_name[k])) {
			*kind = k;
			return true;
		}
	return false;
}

static struct evbuffer *build_request(struct exchange *ex, int64_t wait_us)
{
	const struct http_head *r = ex->req;
	struct evbuffer *b = evbuffer_new();
	evbuffer_expand(b, 1024);
	evbuffer_add(b, r->method, strlen(r->method));
	evbuffer_add(b, " ", 1);
	evbuffer_add(b, r->path, r->path_len);
	evbuffer_add(b, " HTTP/1.1\r\n", 11);
	if (ex->up->host_rewrite && ex->up->host_rewrite[0])
		ADD_HDR_STR(b, "Host", ex->up->host_rewrite, strlen(ex->up->host_rewrite));
	else if (r->host_len > 0)
		ADD_HDR_STR(b, "Host", r->host, r->host_len);
	else
		ADD_HDR_STR(b, "Host", ex->att_ep->name, strlen(ex->att_ep->name));

	const struct http_hdr *xff = NULL, *xfp = NULL;
	bool have_reqid = false;
	for (int i = 0; i < r->nhdrs; i++) {
		const struct http_hdr *h = &r->hdrs[i];
		int kind;
		if (h->hop || hdr_is(h, "Host") || is_deadline_header(h, &kind))
			continue;
		if (hdr_is(h, "Expect"))
			continue;
		if (!ex->req_nested && hdr_is(h, "X-Retrygate-Attempt"))
			continue;
		if (hdr_is(h, "X-Forwarded-For")) {
			if (!xff)
				xff = h;
			else {
				/* several lines: keep them, the last gets our hop appended */
				ADD_HDR_STR(b, "X-Forwarded-For", xff->value, xff->vlen);
				xff = h;
			}
			continue;
		}
		if (hdr_is(h, "X-Forwarded-Proto")) {
			if (xfp)
				ADD_HDR_STR(b, "X-Forwarded-Proto", xfp->value, xfp->vlen);
			xfp = h;
			continue;
		}
		if (hdr_is(h, "X-Request-Id"))
			have_reqid = true;
		add_hdr(b, h->name, h->nlen, h->value, h->vlen);
	}
	if (xff)
		add_hdr_appended(b, "X-Forwarded-For", 15, xff->value, xff->vlen, ex->peer_ip);
	else
		ADD_HDR_STR(b, "X-Forwarded-For", ex->peer_ip, strlen(ex->peer_ip));
	const char *proto = ex->ci.tls ? "https" : "http";
	if (xfp)
		add_hdr_appended(b, "X-Forwarded-Proto", 17, xfp->value, xfp->vlen, proto);
	else
		ADD_HDR_STR(b, "X-Forwarded-Proto", proto, strlen(proto));
	if (!have_reqid)
		ADD_HDR_STR(b, "X-Request-Id", ex->reqid, strlen(ex->reqid));

	char v[32];
	deadline_format(DL_X_TIMEOUT_MS, wait_us, v, sizeof(v));
	ADD_HDR_STR(b, "X-Timeout-Ms", v, strlen(v));
	for (int k = 1; k < DL_NKINDS; k++) {
		if (!ex->dl_present[k])
			continue;
		deadline_format((enum dl_kind)k, wait_us, v, sizeof(v));
		add_hdr(b, deadline_header_name[k], strlen(deadline_header_name[k]), v, strlen(v));
	}
	if (!ex->req_nested)
		ADD_HDR_INT(b, "X-Retrygate-Attempt", ex->attempts);
	if (ex->bmode == B_STREAM && r->expect_continue)
		evbuffer_add(b, "Expect: 100-continue\r\n", 22);
	if (r->upgrade) {
		size_t n;
		const char *u = http_head_get(r, "Upgrade", &n);
		evbuffer_add_printf(b, "Connection: upgrade\r\nUpgrade: %.*s\r\n", (int)n, u ? u : "");
	}
	if (ex->bmode == B_STREAM) {
		if (r->content_length >= 0)
			ADD_HDR_INT(b, "Content-Length", r->content_length);
		else
			evbuffer_add(b, "Transfer-Encoding: chunked\r\n", 28);
	} else if (ex->body_len > 0 || r->content_length >= 0 || r->chunked) {
		ADD_HDR_INT(b, "Content-Length", ex->body_len);
	}
	evbuffer_add(b, "\r\n", 2);
	return b;
}

/* ------------------------------------------------------------------ endpoints */

/* SPEC §4 rule 6, for a retry: unheld before held, then not yet tried before tried, then the
 * hold that ends first; ties go round-robin. A first attempt ignores holds (it is the caller's
 * own traffic, not amplification): plain round-robin. */
static struct ep_state *choose_endpoint(struct exchange *ex, int64_t now, bool retry)
{
	int n = ex->up->nendpoints;
	if (n > MAX_ENDPOINTS)
		n = MAX_ENDPOINTS;
	uint64_t start = atomic_fetch_add_explicit(&ex->st->rr, 1, memory_order_relaxed);
	struct ep_state *best = NULL;
	int best_rank = 0;
	int64_t best_hold = 0;
	for (int i = 0; i < n; i++) {
		struct ep_state *ep = ex->ub->ep[(start + (uint64_t)i) % (uint64_t)n];
		int64_t hold = atomic_load_explicit(&ep->hold_until_us, memory_order_relaxed);
		bool held = retry && hold > now;
		bool tried = (ex->tried >> ep->index) & 1;
		int rank = (held ? 2 : 0) + (tried ? 1 : 0);
		if (!best || rank < best_rank || (held && rank == best_rank && hold < best_hold)) {
			best = ep;
			best_rank = rank;
			best_hold = hold;
		}
	}
	return best;
}

/* ------------------------------------------------------------------ attempts */

static bool may_replay_after_reset(const struct exchange *ex)
{
	if (ex->bmode == B_STREAM || ex->req_nested || ex->body_len > ex->up->retry.max_body)
		return false;
	if (ex->mclass == MC_IDEMPOTENT)
		return true;
	switch (ex->up->retry.non_idempotent) {
	case NI_ALWAYS: return true;
	case NI_REQUIRE_KEY: return ex->has_key;
	default: return false;
	}
}

static void start_attempt(struct exchange *ex, struct ep_state *ep, bool retry)
{
	int64_t now = clock_now_us();
	int64_t remaining = ex->deadline_us - now;
	if (remaining < ex->up->deadline.min_us || remaining < 1000) {
		if (retry) {
			ex->refused = RR_DEADLINE;
			STAT_INC(ex->us->refused[RR_DEADLINE]);
			deliver_last(ex);
		} else {
			STAT_INC(ex->us->rejected[REJ_DEADLINE]);
			finish_error(ex, 504, "deadline-exceeded", false, NULL);
		}
		return;
	}
	if (!upstream_take_in_flight(ex->st, ex->up->max_in_flight)) {
		if (retry) {
			/* SPEC §4 rule 7: the retry ends refused when no slot is free at send time */
			ex->refused = RR_RETRIES_IN_FLIGHT;
			STAT_INC(ex->us->refused[RR_RETRIES_IN_FLIGHT]);
			deliver_last(ex);
		} else {
			STAT_INC(ex->us->rejected[REJ_OVERLOADED]);
			finish_error(ex, 503, "overloaded", false, "Retry-After: 1\r\n");
		}
		return;
	}
	ex->slot_in_flight = true;
	if (!retry) {
		STAT_INC(ex->us->requests);
		budget_deposit(&ex->st->budget, &ex->up->retry, now);
	} else {
		STAT_INC(ex->us->retries);
	}
	ex->attempts++;
	STAT_INC(ex->us->attempts);
	stats_window_add(ex->us, now, retry ? 0 : 1, 1);
	ex->tried |= 1ull << ep->index;
	ex->att_ep = ep;
	ex->last_att_status = 0;

	int64_t per_try = ex->up->retry.per_try_timeout_us;
	int64_t wait = per_try < remaining ? per_try : remaining;
	struct attempt_req rq = {
		.head = build_request(ex, wait),
		.body = (ex->bmode == B_BUFFER && ex->body_len > 0) ? ex->body : NULL,
		.streaming = ex->bmode == B_STREAM,
		.chunked = ex->bmode == B_STREAM && ex->req->content_length < 0,
		.is_head = ex->req->method_head,
		.fresh_conn = !may_replay_after_reset(ex),
		.connect_timeout_us = ex->up->connect_timeout_us,
		.head_timeout_us = per_try < remaining ? per_try : 0,
		.tls = ex->ub->tls,
		.verify = ex->up->tls_verify,
	};
	char sni[256];
	if (rq.tls) {
		int port;
		struct in6_addr ip;
		if (ex->up->tls_sni && ex->up->tls_sni[0])
			rq.sni = ex->up->tls_sni;
		else if (split_host_port(ep->name, sni, sizeof(sni), &port) == 0 &&
		         inet_pton(AF_INET, sni, &ip) != 1 && inet_pton(AF_INET6, sni, &ip) != 1)
			rq.sni = sni;   /* a name, not an address: it is the server's name */
	}
	ex->state = X_ATTEMPT;
	ex->att = attempt_start(ex->loop, ep, &rq, &attempt_callbacks, ex);
	access_add_attempt(&ex->log, ep->name);
	if (ex->bmode == B_STREAM) {
		if (evbuffer_get_length(ex->body) > 0)
			attempt_send_body(ex->att, ex->body);
		if (ex->body_done)
			attempt_send_body_end(ex->att);
	}
}

static void backoff_cb(evutil_socket_t fd, short what, void *arg)
{
	struct exchange *ex = arg;
	if (ex->state != X_BACKOFF)
		return;
	/* another request may have put a hold on the endpoint during our wait */
	int64_t now = clock_now_us();
	int64_t hold = atomic_load(&ex->next_ep->hold_until_us);
	if (hold > now) {
		enum refusal r = RR_NONE;
		if (hold - now > ex->up->retry.retry_after_max_us)
			r = RR_RETRY_AFTER;
		else if (hold + ex->up->deadline.min_us > ex->deadline_us)
			r = RR_DEADLINE;
		if (r == RR_NONE) {
			struct timeval tv = clock_tv(hold - now);
			evtimer_add(ex->backoff_ev, &tv);
			return;
		}
		release_slots(ex);
		ex->refused = r;
		STAT_INC(ex->us->refused[r]);
		deliver_last(ex);
		return;
	}
	start_attempt(ex, ex->next_ep, true);
}

/* SPEC §4: a 429 or 503 with a valid Retry-After (when honored) puts a hold on the endpoint
 * that answered, whether or not a retry follows. Returns the hint in µs, or -1 for none. */
static int64_t retry_after_hint(struct exchange *ex, const struct http_head *h, int64_t now)
{
	size_t n;
	const char *ra = (h->status == 429 || h->status == 503) && ex->up->retry.retry_after_honor
	                 ? http_head_get(h, "Retry-After", &n) : NULL;
	int64_t delay;
	if (!ra || retry_after_parse(ra, n, clock_wall(), &delay) != 0)
		return -1;
	if (delay > 0)
		upstream_hold(ex->att_ep, now + delay);
	return delay;
}

/* An attempt ended (OUT_STATUS: with head H) and its outcome is known: retry or deliver. */
static void decide(struct exchange *ex, enum outcome out, const struct http_head *h, bool bad)
{
	const struct cfg_retry *rc = &ex->up->retry;
	int64_t now = clock_now_us();
	struct attempt *a = ex->att;
	ex->att = NULL;
	ex->last_out = out;
	ex->last_bad = bad;
	release_slots(ex);              /* the failed attempt's slots go before the decision */

	struct retry_facts f = {
		.outcome = out,
		.status = h ? h->status : 0,
		.runtime_enabled = atomic_load_explicit(&ex->st->runtime_enabled, memory_order_relaxed),
		.nested = ex->req_nested,
		.attempts = ex->attempts,
		.method = ex->mclass,
		.has_key = ex->has_key,
		.body_replayable = ex->bmode != B_STREAM && ex->body_len <= rc->max_body,
		.now_us = now,
		.deadline_us = ex->deadline_us,
		.retry_after_us = -1,
		.rand = rand_next(&ex->loop->rng),
	};
	if (h) {
		if (hdr_int(h, "X-Retrygate-Attempts") > 1 || http_head_get(h, "X-Retrygate-Retry-Refused", NULL))
			f.nested = true;
		f.retry_after_us = retry_after_hint(ex, h, now);
	}
	struct ep_state *next = choose_endpoint(ex, now, true);
	int64_t hold = atomic_load(&next->hold_until_us);
	f.hold_until_us = hold > now ? hold : 0;

	int64_t start = 0;
	/* an Upgrade request is tunnelled without retries (SPEC §8) */
	enum refusal reason = ex->req->upgrade ? RR_NOT_LISTED
	                                       : retry_decide(rc, &ex->up->deadline, &f, &start);
	if (reason == RR_NONE) {
		int cap = ex->up->max_retries_in_flight;
		if (!upstream_take_retry_slot(ex->st, cap)) {
			/* both gates may refuse: the budget comes first in SPEC §4's list */
			reason = budget_tokens(&ex->st->budget, rc, now) < 1.0 ? RR_BUDGET
			                                                       : RR_RETRIES_IN_FLIGHT;
		} else if (!budget_take(&ex->st->budget, rc, now)) {
			upstream_release_retry_slot(ex->st);
			reason = RR_BUDGET;
		} else {
			ex->slot_retry = true;
		}
	}
	if (reason == RR_NONE) {
		if (h)
			saved_keep(ex, h, a);   /* it goes on collecting the body */
		else
			attempt_free(a);
		ex->next_ep = next;
		ex->state = X_BACKOFF;
		struct timeval tv = clock_tv(start - now);
		evtimer_add(ex->backoff_ev, &tv);
		return;
	}
	if (reason != RR_NOT_LISTED) {
		STAT_INC(ex->us->refused[reason]);
		ex->refused = reason;
	}
	if (h) {
		saved_clear(&ex->saved);
		relay_from(ex, a, h, reason);
		return;
	}
	attempt_free(a);
	deliver_last(ex);
}

/* ------------------------------------------------------------------ attempt callbacks */

/* 101 to an Upgrade request: relay the head, hand the raw connection to the session. */
static void start_tunnel(struct exchange *ex, struct attempt *a, const struct http_head *h)
{
	struct evbuffer *o = ex->cout;
	STAT_INC(ex->us->responses[1]);
	access_set_status(&ex->log, 101);
	evbuffer_add_printf(o, "HTTP/1.1 101 %.*s\r\n", (int)h->reason_len, h->reason);
	for (int i = 0; i < h->nhdrs; i++) {
		const struct http_hdr *x = &h->hdrs[i];
		if (x->hop || hdr_is(x, "X-Retrygate-Attempts"))
			continue;
		evbuffer_add_printf(o, "%.*s: %.*s\r\n", (int)x->nlen, x->name, (int)x->vlen, x->value);
	}
	size_t n;
	const char *up = http_head_get(h, "Upgrade", &n);
	evbuffer_add_printf(o, "Connection: upgrade\r\nUpgrade: %.*s\r\nX-Retrygate-Attempts: %d\r\n\r\n",
	                    (int)(up ? n : 0), up ? up : "", ex->attempts);
	struct stream *ubev = attempt_take_bev(a);
	ex->att = NULL;
	attempt_free(a);
	ex->resp_status = 101;
	ex->last_out = OUT_STATUS;
	ex->log.ok_response = true;
	ex->head_sent = true;
	finish_tunnel(ex, ubev);
}

static void att_head(void *arg, struct attempt *a, const struct http_head *h)
{
	struct exchange *ex = arg;
	if (ex->state == X_DONE || a != ex->att)
		return;
	if (h->status >= 100 && h->status < 200 && h->status != 101) {
		if (ex->req->version != 11 || ex->head_sent)
			return;
		if ((h->status == 100 && ex->req->expect_continue && ex->bmode == B_STREAM) || h->status == 103) {
			evbuffer_add_printf(ex->cout, "HTTP/1.1 %d %.*s\r\n", h->status, (int)h->reason_len, h->reason);
			for (int i = 0; h->status == 103 && i < h->nhdrs; i++) {
				if (h->hdrs[i].hop)
					continue;
				evbuffer_add_printf(ex->cout, "%.*s: %.*s\r\n", (int)h->hdrs[i].nlen, h->hdrs[i].name,
				                    (int)h->hdrs[i].vlen, h->hdrs[i].value);
			}
			evbuffer_add(ex->cout, "\r\n", 2);
		}
		return;
	}
	if (h->status == 101 && ex->req->upgrade) {
		start_tunnel(ex, a, h);
		return;
	}
	if (h->status == 101) {
		/* an unsolicited 101: an invalid response */
		STAT_INC(ex->us->outcomes[OUT_RESET]);
		access_set_outcome(&ex->log, "bad-response");
		decide(ex, OUT_RESET, NULL, true);
		return;
	}
	STAT_INC(ex->us->responses[h->status / 100]);
	access_set_status(&ex->log, h->status);
	ex->last_out = OUT_STATUS;      /* the last attempt answered (a reset before is history) */
	ex->last_att_status = h->status;
	ex->reached = true;
	if (cfg_retry_on_status(&ex->up->retry, h->status)) {
		decide(ex, OUT_STATUS, h, false);
		return;
	}
	retry_after_hint(ex, h, clock_now_us());    /* not retried, but it may set a hold */
	relay_from(ex, a, h, RR_NONE);
}

static void att_body(void *arg, struct attempt *a, struct evbuffer *data)
{
	struct exchange *ex = arg;
	if (ex->state != X_DONE && a == ex->saved.a) {
		size_t have = evbuffer_get_length(ex->saved.body);
		size_t cap = (size_t)ex->up->retry.max_body;
		size_t n = evbuffer_get_length(data);
		if (have + n > cap) {
			/* Too big to keep in memory: keep what fits, leave the rest unread on its
			 * paused connection. If no later attempt answers, it streams from there. */
			evbuffer_remove_buffer(data, ex->saved.body, cap > have ? cap - have : 0);
			attempt_pause(a);
			return;
		}
		evbuffer_add_buffer(ex->saved.body, data);
		return;
	}
	if (ex->state != X_RELAY || a != ex->relay) {
		evbuffer_drain(data, evbuffer_get_length(data));
		return;
	}
	relay_body(ex, data);
	if (evbuffer_get_length(ex->cout) > CLIENT_HIGH)
		attempt_pause(a);
}

static void att_drain(void *arg, struct attempt *a)
{
	struct exchange *ex = arg;
	if (ex->state != X_DONE && ex->bmode == B_STREAM && !ex->body_done)
		ex->cbs.on_want_body(ex->arg);
}

static void att_end(void *arg, struct attempt *a, enum outcome out, bool bad, const char *detail)
{
	struct exchange *ex = arg;
	if (ex->state == X_DONE)
		return;
	if (a == ex->saved.a) {
		ex->saved.a = NULL;
		if (out == OUT_NONE)
			ex->saved.complete = true;
		else
			saved_clear(&ex->saved);
		attempt_free(a);
		return;
	}
	if (a == ex->relay) {
		ex->relay = NULL;
		attempt_free(a);
		if (out == OUT_NONE) {
			if (ex->resp_chunked)
				http_chunk_last(ex->cout);
			ex->resp_complete = true;
			finish(ex, false);
		} else {
			slog(LOG_WARN, ex->ci.sid, "upstream %s: %s: response cut short", ex->up->name, detail);
			finish(ex, true);   /* never pad or complete a truncated body */
		}
		return;
	}
	if (a != ex->att)
		return;
	if (out != OUT_CONNECT_FAILURE)
		ex->reached = true;
	STAT_INC(ex->us->outcomes[bad ? OUT_RESET : out]);
	access_set_outcome(&ex->log, bad ? "bad-response" : outcome_name(out));
	slog(LOG_DEBUG, ex->ci.sid, "upstream %s attempt %d to %s: %s (%s)", ex->up->name, ex->attempts,
	     attempt_peer(a), bad ? "bad-response" : outcome_name(out), detail ? detail : "");
	decide(ex, bad ? OUT_RESET : out, NULL, bad);
}

static const struct attempt_cbs attempt_callbacks = {
	.on_head = att_head,
	.on_body = att_body,
	.on_drain = att_drain,
	.on_end = att_end,
};

/* ------------------------------------------------------------------ deadline */

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
	struct exchange *ex = arg;
	if (ex->state == X_DONE || ex->state == X_RELAY)
		return;     /* a response whose head arrived in time is not cut off */
	if (!ex->body_done && ex->has_body)
		ex->close_after = true;
	if (ex->att) {
		/* SPEC §4: cut before any byte was written it is a connect-failure, else a timeout */
		enum outcome o = attempt_wrote_any(ex->att) ? OUT_TIMEOUT : OUT_CONNECT_FAILURE;
		STAT_INC(ex->us->outcomes[o]);
		ex->last_out = o;
		access_set_outcome(&ex->log, outcome_name(o));
		attempt_free(ex->att);
		ex->att = NULL;
	}
	release_slots(ex);
	if (ex->saved.valid) {
		ex->refused = RR_DEADLINE;
		STAT_INC(ex->us->refused[RR_DEADLINE]);
		relay_saved(ex, RR_DEADLINE);
		return;
	}
	finish_error(ex, 504, "deadline-exceeded", false, NULL);
}

/* ------------------------------------------------------------------ session side */

struct exchange *exchange_new(struct loop *loop, struct runtime *rt, struct cfg_listener *l,
                              const struct client_info *ci, const struct http_head *req,
                              struct stream *client, const struct exchange_cbs *cbs,
                              void *arg)
{
	struct exchange *ex = xcalloc(1, sizeof(*ex));
	atomic_fetch_add(&g_gstats[loop->id].exchanges_active, 1);
	ex->magic = EXCHANGE_MAGIC;
	ex->loop = loop;
	ex->rt = runtime_ref(rt);
	ex->l = l;
	ex->ci = *ci;
	snprintf(ex->peer_ip, sizeof(ex->peer_ip), "%s", ci->peer_ip ? ci->peer_ip : "");
	ex->ci.peer_ip = ex->peer_ip;
	ex->req = req;
	ex->cbev = client;
	ex->cout = stream_output(client);
	ex->cbs = *cbs;
	ex->arg = arg;
	ex->t0_us = clock_now_us();
	ex->deadline_ev = evtimer_new(loop->base, deadline_cb, ex);
	ex->backoff_ev = evtimer_new(loop->base, backoff_cb, ex);
	ex->body = evbuffer_new();
	ex->has_body = req->chunked || req->content_length > 0;
	ex->body_done = !ex->has_body;
	size_t idlen = 0;
	const char *cid = http_head_get(req, "X-Request-Id", &idlen);
	if (cid && idlen > 0) {
		/* the log names the request by the id it carries upstream (SPEC §8 keeps it) */
		if (idlen > sizeof(ex->reqid) - 1)
			idlen = sizeof(ex->reqid) - 1;
		memcpy(ex->reqid, cid, idlen);
		ex->reqid[idlen] = 0;
	} else {
		request_id_new(ex->reqid, &loop->rng);
	}
	access_begin(&ex->log, ci->sid, ex->peer_ip, req, ex->reqid);
	return ex;
}

static void read_deadline(struct exchange *ex, struct dl_value vals[DL_NKINDS])
{
	const struct http_head *r = ex->req;
	memset(vals, 0, sizeof(struct dl_value) * DL_NKINDS);
	for (int i = 0; i < r->nhdrs; i++) {
		int k;
		if (!is_deadline_header(&r->hdrs[i], &k))
			continue;
		struct dl_value *v = &vals[k];
		if (v->present && (v->len != r->hdrs[i].vlen || memcmp(v->v, r->hdrs[i].value, v->len) != 0))
			v->conflict = 1;
		if (!v->present) {
			v->v = r->hdrs[i].value;
			v->len = r->hdrs[i].vlen;
			v->present = 1;
		}
		ex->dl_present[k] = true;
	}
}

static bool request_marked_retry(const struct http_head *r)
{
	return hdr_int(r, "X-Retrygate-Attempt") > 1 || hdr_int(r, "x-envoy-attempt-count") > 1 ||
	       hdr_int(r, "grpc-previous-rpc-attempts") > 0;
}

void exchange_start(struct exchange *ex)
{
	const struct http_head *r = ex->req;
	struct cfg_route *route = route_match(ex->l, r->host, r->host_len, r->path, r->path_len);
	if (!route) {
		finish_error(ex, 404, "no-route", false, NULL);
		return;
	}
	ex->up = route->upstream;
	ex->ub = runtime_upstream(ex->rt, ex->up);
	ex->st = ex->ub->st;
	ex->us = &ex->st->stats[ex->loop->id];
	access_set_route(&ex->log, route, ex->up->name);

	struct dl_value vals[DL_NKINDS];
	read_deadline(ex, vals);
	int64_t budget;
	int kind;
	if (deadline_resolve(vals, &ex->up->deadline, &budget, &kind) != DL_OK) {
		finish_error(ex, 400, "bad-deadline", true, NULL);
		return;
	}
	ex->given_us = budget;
	ex->deadline_us = ex->t0_us + budget;
	ex->log.deadline_given_us = budget;
	if (budget < ex->up->deadline.min_us || budget < 1000) {
		STAT_INC(ex->us->rejected[REJ_DEADLINE]);
		finish_error(ex, 504, "deadline-exceeded", false, NULL);
		return;
	}
	ex->req_nested = request_marked_retry(r);
	ex->mclass = retry_method_class(r->method);
	size_t klen = 0;
	const char *key = http_head_get(r, ex->up->idem.header, &klen);
	ex->has_key = key && klen > 0;
	if (ex->has_key)
		access_set_key(&ex->log, key, klen);

	int64_t lmax = ex->l->limits.max_body;
	if (lmax > 0 && r->content_length > lmax) {
		finish_error(ex, 413, "body-too-large", true, NULL);
		return;
	}
	const struct cfg_idempotency *ic = &ex->up->idem;
	if (ic->enabled && idem_method(ic, r->method)) {
		if (!ex->has_key && ic->require_key) {
			finish_error(ex, 400, "idempotency-key-required", true, NULL);
			return;
		}
		ex->idem = ex->has_key;
		/* the fingerprint hashes the whole body: it is buffered, up to idempotency.max_body */
		if (ex->idem && r->content_length > ic->max_body) {
			finish_error(ex, 413, "body-too-large", true, NULL);
			return;
		}
	}
	if (!ex->has_body)
		ex->bmode = B_NONE;
	else if (ex->idem || r->chunked || r->content_length <= ex->up->retry.max_body)
		ex->bmode = B_BUFFER;
	else
		ex->bmode = B_STREAM;

	struct timeval tv = clock_tv(budget);
	evtimer_add(ex->deadline_ev, &tv);

	if (ex->bmode == B_BUFFER) {
		/* we want the whole body before the first attempt: say so ourselves */
		if (r->expect_continue && r->version == 11)
			evbuffer_add(ex->cout, "HTTP/1.1 100 Continue\r\n\r\n", 25);
		ex->state = X_WAIT_BODY;
		return;
	}
	exchange_go(ex);
}

/* The claim's answer (from the event loop, never inside idem_claim()). */
static void idem_claimed_cb(void *arg, enum idem_result r, const struct idem_response *stored)
{
	struct exchange *ex = arg;
	ex->idem_op = NULL;
	if (ex->state != X_CLAIM)
		return;
	switch (r) {
	case IDEM_CLAIMED:
		ex->idem_claimed = true;
		ex->idem_hdrs = evbuffer_new();
		ex->idem_body = evbuffer_new();
		start_attempt(ex, choose_endpoint(ex, clock_now_us(), false), false);
		return;
	case IDEM_REPLAY: {
		STAT_INC(ex->us->idem[IS_REPLAYED]);
		bool close = !ex->req->keep_alive || *ex->ci.draining;
		bool bodyless = stored->status == 204 || stored->status == 304 || ex->req->method_head;
		evbuffer_add_printf(ex->cout, "HTTP/1.1 %d %s\r\n", stored->status,
		                    reply_status_text(stored->status));
		evbuffer_add(ex->cout, stored->headers, stored->headers_len);
		evbuffer_add_printf(ex->cout, "Idempotency-Replayed: true\r\nX-Retrygate-Attempts: 0\r\n");
		if (stored->status != 204 && stored->status != 304)
			evbuffer_add_printf(ex->cout, "Content-Length: %zu\r\n", stored->body_len);
		if (close)
			evbuffer_add(ex->cout, "Connection: close\r\n", 19);
		else if (ex->req->version == 10)
			evbuffer_add(ex->cout, "Connection: keep-alive\r\n", 24);
		evbuffer_add(ex->cout, "\r\n", 2);
		if (!bodyless)
			evbuffer_add(ex->cout, stored->body, stored->body_len);
		ex->resp_status = stored->status;
		ex->log.reason = "idempotency-replayed";
		finish(ex, close);
		return;
	}
	case IDEM_MISMATCH:
		STAT_INC(ex->us->idem[IS_MISMATCH]);
		finish_error(ex, 422, "idempotency-key-mismatch", false, NULL);
		return;
	case IDEM_IN_PROGRESS:
		STAT_INC(ex->us->idem[IS_CONFLICT]);
		finish_error(ex, 409, "idempotency-in-progress", false, NULL);
		return;
	case IDEM_UNAVAILABLE:
		finish_error(ex, 503, "idempotency-store-unavailable", false, NULL);
		return;
	}
}

/* The request may go: claim its key first when this hop enforces idempotency. */
static void exchange_go(struct exchange *ex)
{
	if (!ex->idem) {
		start_attempt(ex, choose_endpoint(ex, clock_now_us(), false), false);
		return;
	}
	const struct http_head *r = ex->req;
	const struct cfg_idempotency *ic = &ex->up->idem;
	const char *vals[16];
	size_t lens[16];
	int nv = ic->nscope_headers < 16 ? ic->nscope_headers : 16;
	for (int i = 0; i < nv; i++)
		vals[i] = http_head_get(r, ic->scope_headers[i], &lens[i]);
	size_t klen = 0, ctlen = 0;
	const char *key = http_head_get(r, ic->header, &klen);
	const char *ct = http_head_get(r, "Content-Type", &ctlen);
	idem_scope(ex->ikey.scope, ex->up->name, vals, lens, nv, key, klen);
	idem_fingerprint(ex->ikey.fp, r->method, strlen(r->method), r->path, r->path_len, ct, ctlen,
	                 ex->body);
	const char *err = NULL;
	ex->store = idem_store_get(ic, ex->loop->base, ex->loop->dns, &err);
	if (!ex->store) {
		slog(LOG_ERROR, ex->ci.sid, "idempotency store %s: %s", ic->store, err ? err : "unavailable");
		finish_error(ex, 503, "idempotency-store-unavailable", false, NULL);
		return;
	}
	ex->state = X_CLAIM;
	ex->idem_op = idem_claim(ex->store, &ex->ikey, ic->lock_timeout_us, idem_claimed_cb, ex);
}

static bool idem_method(const struct cfg_idempotency *ic, const char *method)
{
	for (int i = 0; i < ic->nmethods; i++)
		if (strcmp(ic->methods[i], method) == 0)
			return true;
	return false;
}

void exchange_body(struct exchange *ex, struct evbuffer *data)
{
	size_t n = evbuffer_get_length(data);
	ex->body_len += (int64_t)n;
	ex->log.body_bytes = ex->body_len;
	if (ex->state == X_DONE) {
		evbuffer_drain(data, n);
		return;
	}
	int64_t lmax = ex->l->limits.max_body;
	if (lmax > 0 && ex->body_len > lmax) {
		evbuffer_drain(data, n);
		if (ex->head_sent) {
			finish(ex, true);
			return;
		}
		if (ex->att) {
			attempt_free(ex->att);
			ex->att = NULL;
		}
		finish_error(ex, 413, "body-too-large", true, NULL);
		return;
	}
	if (ex->bmode == B_BUFFER) {
		evbuffer_add_buffer(ex->body, data);
		if (ex->idem) {
			if (ex->body_len > ex->up->idem.max_body)
				finish_error(ex, 413, "body-too-large", true, NULL);
			return;
		}
		if (ex->body_len > ex->up->retry.max_body) {
			/* a chunked body outgrew retry.max_body: stream it, it will never be re-sent */
			ex->bmode = B_STREAM;
			start_attempt(ex, choose_endpoint(ex, clock_now_us(), false), false);
		}
		return;
	}
	if (ex->bmode == B_STREAM && ex->att)
		attempt_send_body(ex->att, data);
	else if (ex->bmode == B_STREAM && ex->relay)
		attempt_send_body(ex->relay, data);
	else
		evbuffer_drain(data, n);
}

void exchange_body_end(struct exchange *ex)
{
	ex->body_done = true;
	if (ex->state == X_DONE)
		return;
	if (ex->bmode == B_BUFFER && ex->state == X_WAIT_BODY) {
		exchange_go(ex);
		return;
	}
	if (ex->bmode == B_STREAM) {
		if (ex->att)
			attempt_send_body_end(ex->att);
		else if (ex->relay)
			attempt_send_body_end(ex->relay);
	}
}

size_t exchange_body_room(const struct exchange *ex)
{
	if (ex->state == X_DONE)
		return 64 * 1024;       /* discard what is left, the connection closes after */
	if (ex->bmode != B_STREAM)
		return 64 * 1024;
	const struct attempt *a = ex->att ? ex->att : ex->relay;
	if (!a)
		return 0;
	size_t pending = attempt_send_pending(a);
	return pending < STREAM_HIGH ? STREAM_HIGH - pending : 0;
}

void exchange_client_drained(struct exchange *ex)
{
	if (ex->state == X_RELAY && ex->relay)
		attempt_resume(ex->relay);
}

void exchange_abort(struct exchange *ex)
{
	if (ex->state == X_DONE)
		return;
	if (ex->us && (ex->att || ex->relay || ex->state == X_BACKOFF))
		STAT_INC(ex->us->client_aborts);
	ex->log.client_abort = true;
	if (!ex->head_sent)
		ex->resp_status = 499;  /* nginx's "client closed request", for the log only */
	exchange_end(ex);
	log_request(ex, clock_now_us());
}

static void exchange_free_cb(void *p)
{
	struct exchange *ex = p;
	ex->magic = 0;
	free(ex);
}

void exchange_free(struct exchange *ex)
{
	if (!ex)
		return;
	if (ex->state != X_DONE)
		exchange_abort(ex);
	event_free(ex->deadline_ev);
	event_free(ex->backoff_ev);
	evbuffer_free(ex->body);
	if (ex->idem_hdrs)
		evbuffer_free(ex->idem_hdrs);
	if (ex->idem_body)
		evbuffer_free(ex->idem_body);
	runtime_unref(ex->rt);
	atomic_fetch_sub(&g_gstats[ex->loop->id].exchanges_active, 1);
	loop_defer_free(ex->loop, exchange_free_cb, ex);
}
