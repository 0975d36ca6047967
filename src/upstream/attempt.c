/*
 * attempt: one try against one endpoint (see attempt.h), over a transport (transport.h) picked
 * once at the start: HTTP/1.1 (h1_conn.c) or an HTTP/2 stream (h2_conn.c). What is the
 * attempt's own: the head timer, the classification of a cut, the order in which the owner
 * hears the response (body bytes it has not taken yet, then trailers, then the end), and
 * reporting once.
 *
 * States: A_WAITING (request under way, no final head yet) -> A_BODY (final head delivered,
 * body streaming) -> A_DONE. Every failure is reported once, through on_end, from a clean
 * stack (a failure noticed inside attempt_start() is delivered from a zero-delay timer), so the
 * owner never sees a callback before attempt_start() returned.
 *
 * Outcome classification (SPEC §4): a failure before any byte of the request left is a
 * connect-failure, whichever timer cut it (a transport's connect timer, or the head timer);
 * once a byte left, no head in time is a timeout; the transport classifies its own closes.
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "upstream/attempt.h"
#include "upstream/h1_conn.h"
#include "upstream/h2_conn.h"
#include "base/clock.h"
#include "http/h1_parser.h"
#include "base/log.h"
#include "state/endpoint.h"
#include "base/util.h"
#include "base/loop.h"

#define ATTEMPT_MAGIC 0xa77e3b71u

enum astate { A_WAITING, A_BODY, A_DONE };

struct attempt {
	uint32_t magic;
	enum astate state;
	struct loop *loop;
	struct ep_state *ep;
	struct transport *t;            /* open: until it closed, was cancelled or gave its stream */
	struct attempt_cbs cbs;
	void *arg;
	struct evbuffer *decoded;       /* response body bytes handed to on_body */
	bool streaming, body_ended;
	bool wrote_any, paused, freed;
	bool complete;                  /* the transport ended cleanly; bytes still wait in decoded */
	int64_t start_us, head_timeout_us;
	struct loop_timer timer;        /* embedded, the loop's (no event per attempt) */
	enum outcome fail_out;          /* a failure waiting for the zero-delay timer */
	const char *fail_detail;
	char sni[256];                  /* the transports read it while open */
	struct http_hdr *tr;            /* trailers that came while body bytes still wait */
	char *trbuf;
	int ntr;
};

/* The one writer of the state (DESIGN rule 2). */
DEFINE_STATE_SETTER(set_state, attempt, astate, A_DONE)

bool attempt_wrote_any(const struct attempt *a)
{
	return a->wrote_any || (a->t && a->t->ops->sent(a->t));
}
const char *attempt_peer(const struct attempt *a) { return a->ep->name; }
size_t attempt_send_pending(const struct attempt *a)
{
	return a->t ? a->t->ops->pending(a->t) : 0;
}

static void attempt_free_cb(void *p)
{
	struct attempt *a = p;
	a->magic = 0;
	loop_obj_put(a->loop, LOOP_ATTEMPT, a);
}

/* Let go of the transport (cut whatever it was doing): no callback from it again. */
static void transport_drop(struct attempt *a)
{
	struct transport *t = a->t;
	if (!t)
		return;
	a->wrote_any = attempt_wrote_any(a);
	a->t = NULL;
	t->ops->cancel(t);
}

static void timer_cb(void *arg);

/* The attempt's one timer (head or a deferred failure) to go off in US. */
static void timer_arm(struct attempt *a, int64_t us)
{
	loop_timer_add(a->loop, &a->timer, us, timer_cb, a);    /* a pending one is moved */
}

static void timer_stop(struct attempt *a)
{
	loop_timer_del(a->loop, &a->timer);
}

/* Finish: report once. Safe against the owner freeing us inside on_end. */
static void attempt_end(struct attempt *a, enum outcome out, bool bad, const char *detail)
{
	if (a->state == A_DONE)
		return;
	set_state(a, A_DONE);
	timer_stop(a);
	transport_drop(a);
	a->cbs.on_end(a->arg, a, out, bad, detail);
}

static void attempt_fail_soon(struct attempt *a, enum outcome out, const char *detail)
{
	a->fail_out = out;
	a->fail_detail = detail;
	timer_arm(a, 0);
}

static void timer_cb(void *arg)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	if (a->state == A_DONE)
		return;
	if (a->fail_out != OUT_NONE)
		attempt_end(a, a->fail_out, false, a->fail_detail);
	else if (!attempt_wrote_any(a))
		attempt_end(a, OUT_CONNECT_FAILURE, false, "connect timeout");
	else
		attempt_end(a, OUT_TIMEOUT, false, "no response head in time");
}

/* ---------------------------------------------------------------- the response, in order */

static void trailers_now(struct attempt *a, const struct http_hdr *t, int n)
{
	log_debug("h2 upstream %s: %d trailer field(s)%s%.*s", a->ep->name, n, n ? ", first " : "",
	          n ? (int)t[0].nlen : 0, n ? t[0].name : "");
	if (a->cbs.on_trailers)
		a->cbs.on_trailers(a->arg, a, t, n);
}

/* Keep trailers (copied) until the body bytes before them went to the owner. */
static void trailers_keep(struct attempt *a, const struct http_hdr *t, int n)
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

/* Hand the owner the body it has room for (the transport learns what it took); once the last
 * byte went, what waited behind it: the trailers, then the end. */
static void deliver(struct attempt *a)
{
	while (!a->paused && a->state == A_BODY && evbuffer_get_length(a->decoded) > 0) {
		size_t before = evbuffer_get_length(a->decoded);
		a->cbs.on_body(a->arg, a, a->decoded);
		if (a->freed || a->state == A_DONE)
			return;
		size_t took = before - evbuffer_get_length(a->decoded);
		if (a->t)
			a->t->ops->consume(a->t, took);
		if (took == 0)
			break;
	}
	if (a->state != A_BODY || evbuffer_get_length(a->decoded) > 0)
		return;
	if (a->tr) {
		struct http_hdr *t = a->tr;
		a->tr = NULL;
		trailers_now(a, t, a->ntr);
		free(t);
		free(a->trbuf);
		a->trbuf = NULL;
		if (a->freed || a->state == A_DONE)
			return;
	}
	if (a->complete) {
		set_state(a, A_DONE);
		timer_stop(a);
		a->cbs.on_end(a->arg, a, OUT_NONE, false, NULL);
	}
}

/* ---------------------------------------------------------------- transport callbacks */

static void tp_head(void *arg, const struct http_head *h)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	if (a->state == A_DONE)
		return;
	/* final: >= 200, or 101 (HTTP/1 only: HTTP/2 has no Upgrade) */
	if (h->status >= 200 || h->status == 101) {
		set_state(a, A_BODY);
		timer_stop(a);
	}
	a->cbs.on_head(a->arg, a, h);
}

static void tp_data(void *arg)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	deliver(a);
}

static void tp_trailers(void *arg, const struct http_hdr *t, int n)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	if (a->state != A_BODY)
		return;
	if (evbuffer_get_length(a->decoded) > 0)
		trailers_keep(a, t, n);         /* after the body the owner has not taken yet */
	else
		trailers_now(a, t, n);
}

static void tp_drain(void *arg)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	if (a->streaming && !a->body_ended && a->state != A_DONE)
		a->cbs.on_drain(a->arg, a);
}

static void tp_close(void *arg, enum outcome out, bool bad, const char *detail)
{
	struct attempt *a = arg;
	MAGIC_CHECK(a, ATTEMPT_MAGIC);
	a->wrote_any = a->wrote_any || out != OUT_CONNECT_FAILURE;
	a->t = NULL;        /* gone: never touched again */
	if (a->state == A_DONE)
		return;
	if (out == OUT_NONE && a->state == A_BODY) {
		a->complete = true;
		deliver(a);     /* or later, from attempt_resume */
		return;
	}
	attempt_end(a, out == OUT_NONE ? OUT_RESET : out, bad && a->state == A_WAITING, detail);
}

static const struct transport_cbs transport_callbacks = {
	.on_head = tp_head,
	.on_data = tp_data,
	.on_trailers = tp_trailers,
	.on_drain = tp_drain,
	.on_close = tp_close,
};

/* ---------------------------------------------------------------- the owner's calls */

struct attempt *attempt_start(struct loop *loop, struct ep_state *ep, struct attempt_req *req,
                              const struct attempt_cbs *cbs, void *arg)
{
	struct attempt *a = loop_obj_get(loop, LOOP_ATTEMPT, sizeof(*a));
	a->magic = ATTEMPT_MAGIC;
	a->loop = loop;
	a->ep = ep;
	upstream_ep_attempt_begin(ep);
	a->cbs = *cbs;
	a->arg = arg;
	a->streaming = req->streaming;
	a->head_timeout_us = req->head_timeout_us;
	size_t snilen = req->sni ? strlen(req->sni) : 0;
	if (snilen >= sizeof(a->sni))
		snilen = 0;     /* no server name is longer than 255 bytes: send none */
	memcpy(a->sni, req->sni ? req->sni : "", snilen);
	a->sni[snilen] = 0;
	a->start_us = clock_now_us();
	a->decoded = loop_buf_get(loop);
	set_state(a, A_WAITING);

	struct transport_req q = {
		.body = req->body,
		.streaming = req->streaming,
		.body_out = a->decoded,
		.connect_timeout_us = req->connect_timeout_us,
		.tls = req->tls,
		.sni = a->sni,
		.verify = req->verify,
		.head = req->head,
		.chunked = req->chunked,
		.is_head = req->is_head,
		.fresh_conn = req->fresh_conn,
		.other_conn = req->other_conn,
		.nv = req->nv,
		.nvlen = req->nvlen,
		.nv_bytes = req->nv_bytes,
		.nv_bytes_len = req->nv_bytes_len,
		.trailers = req->trailers,
		.ntrailers = req->ntrailers,
	};
	const struct transport_ops *ops = req->h2 ? &h2_transport : &h1_transport;
	const char *err = NULL;
	a->t = ops->open(loop, ep, &q, &transport_callbacks, a, &err);
	if (!a->t) {
		attempt_fail_soon(a, OUT_CONNECT_FAILURE, err);
		return a;
	}
	/* the transport keeps its own connect timer; from the start only the per-try time counts
	 * here (none: no timer, the exchange's deadline cuts it) */
	if (a->head_timeout_us > 0)
		timer_arm(a, a->head_timeout_us);
	return a;
}

void attempt_free(struct attempt *a)
{
	if (!a || a->freed)
		return;
	a->freed = true;
	upstream_ep_attempt_end(a->ep);     /* the endpoint's in-flight count (least-request) */
	if (a->state != A_DONE)
		set_state(a, A_DONE);
	transport_drop(a);      /* a connection closed, an HTTP/2 stream reset with CANCEL */
	timer_stop(a);
	free(a->tr);
	free(a->trbuf);
	a->tr = NULL;
	a->trbuf = NULL;
	loop_buf_put(a->loop, a->decoded);
	a->decoded = NULL;
	loop_defer_free(a->loop, attempt_free_cb, a);
}

void attempt_send_body(struct attempt *a, struct evbuffer *data)
{
	if (a->state == A_DONE || !a->t) {
		evbuffer_drain(data, evbuffer_get_length(data));
		return;
	}
	a->t->ops->send_body(a->t, data);
}

void attempt_send_trailers(struct attempt *a, const struct http_hdr *t, int n)
{
	if (a->t && !a->body_ended)
		a->t->ops->send_trailers(a->t, t, n);
}

void attempt_send_body_end(struct attempt *a)
{
	if (a->body_ended)
		return;
	a->body_ended = true;
	if (a->t)
		a->t->ops->body_end(a->t);
}

void attempt_pause(struct attempt *a)
{
	a->paused = true;
	if (a->t)
		a->t->ops->pause(a->t, true);
}

void attempt_resume(struct attempt *a)
{
	if (!a->paused || a->state == A_DONE)
		return;
	a->paused = false;
	/* the bytes the owner left go first */
	deliver(a);
	if (!a->freed && !a->paused && a->t)
		a->t->ops->pause(a->t, false);
}

struct stream *attempt_take_stream(struct attempt *a)
{
	if (!a->t || !a->t->ops->take_stream)
		return NULL;
	a->wrote_any = attempt_wrote_any(a);
	struct stream *strm = a->t->ops->take_stream(a->t);
	if (!strm)
		return NULL;
	a->t = NULL;
	set_state(a, A_DONE);
	timer_stop(a);
	return strm;
}
