/*
 * exchange: one request, its attempts, and the retry loop between them (see exchange.h).
 *
 *   X_WAIT_BODY --body end--> (X_CLAIM) --> X_ATTEMPT --head/failure--> ex_decide() --retry--> X_BACKOFF
 *        |                                     ^                          |                    |
 *        +--(streamed body)--------------------+                          +--relay--> X_RELAY  |
 *                                               +-------------backoff timer--------------------+
 *   and from anywhere: X_DONE (ex_finish(): the responder's end() reported once).
 *
 * This file holds the state machine only: the decision is retry_decide(), the upstream
 * request is forward_h1_head() or, to an HTTP/2 upstream, forward_h2_headers(), every response
 * it makes is respond.c's, the client's wire format is the responder's, the idempotency claim
 * is an idem_job; how the exchange ends and what reaches the client is exchange_reply.c,
 * SPEC §11 faults are exchange_fault.c, SPEC §10 (a gRPC call's outcome) exchange_grpc.c.
 *
 * Slots: an attempt holds a max_in_flight slot from when it is sent to when it ends (for a
 * relayed response: its last body byte); a retry holds a max_retries_in_flight slot from the
 * decision, through its wait, to its end. A response that was retried is kept (head and up
 * to retry.max_body of body) so that, if no later attempt produces a response, the client
 * still gets the last one any attempt produced (SPEC §4).
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>

#include "obs/accesslog.h"
#include "proxy/admit.h"
#include "upstream/attempt.h"
#include "policy/balance.h"
#include "base/clock.h"
#include "config/config.h"
#include "http/deadline.h"
#include "proxy/exchange.h"
#include "proxy/exchange_impl.h"
#include "policy/faults.h"
#include "http/forward.h"
#include "http/h1_parser.h"
#include "proxy/idem_job.h"
#include "base/log.h"
#include "policy/outlier.h"
#include "base/loop.h"
#include "obs/reconcile.h"
#include "proxy/reqbody.h"
#include "http/respond.h"
#include "policy/retry.h"
#include "proxy/saved_response.h"
#include "obs/stats.h"
#include "net/tls.h"
#include "state/runtime.h"
#include "state/upstream.h"
#include "base/util.h"

static void start_attempt(struct exchange *ex, struct ep_state *ep, bool retry);
static void exchange_go(struct exchange *ex);

static const struct attempt_cbs attempt_callbacks;

/* The one writer of the state (DESIGN rule 2). */
void ex_set_state(struct exchange *ex, enum xstate st)
{
	STATE_TERMINAL_CHECK(ex, st, X_DONE);
	ex->state = st;
}

/* ------------------------------------------------------------------ timers */

/* Assign EV (the exchange's timer BIT) the first time it is needed (see exchange_impl.h). */
static void timer_assign(struct exchange *ex, struct event *ev, uint8_t bit, event_callback_fn cb)
{
	if (ex->timers & bit)
		return;
	evtimer_assign(ev, ex->loop->base, cb, ex);
	ex->timers |= bit;
}

/* ------------------------------------------------------------------ endpoints */

/* The address for an attempt, or NULL while no name of the upstream has one (SPEC §13). Only
 * a first attempt advances round-robin: a retry's choice never shifts where the next request
 * goes (otherwise every failure would steer the next first attempt to the failing endpoint). */
static struct ep_state *choose_endpoint(struct exchange *ex, int64_t now, bool retry)
{
	struct ep_state *eps[MAX_ENDPOINTS];
	int n = runtime_endpoints(ex->ub, eps);
	if (n == 0)
		return NULL;
	uint64_t rr = retry ? atomic_load_explicit(&ex->st->rr, memory_order_relaxed)
	                    : atomic_fetch_add_explicit(&ex->st->rr, 1, memory_order_relaxed);
	return upstream_ep_pick(eps, n, ex->up->balance, retry, rr, rand_next(&ex->loop->rng),
	                        ex->tried, now);
}

/* SPEC §13: the attempt's outcome (STATUS with OUT_STATUS; HINTED: it carried a Retry-After,
 * which sets a hold instead), for the passive health of its endpoint. */
void ex_report_health_as(struct exchange *ex, enum outcome out, int status, bool hinted)
{
	struct ep_state *eps[MAX_ENDPOINTS];
	int neps = 0;
	int64_t now = 0;
	/* nearly every report is a success, which only clears the endpoint's count: the other
	 * endpoints and the clock are gathered for a failure alone (outlier.h) */
	if (outlier_is_failure(out, status, hinted)) {
		neps = runtime_endpoints(ex->ub, eps);
		now = clock_now_us();
	}
	if (upstream_ep_report(&ex->up->health, eps, neps, ex->att_ep, out, status, hinted, now))
		slog(LOG_WARN, ex->ci.sid, "upstream %s: endpoint %s ejected for %lld ms after %d "
		     "failures in a row", ex->up->name, ex->att_ep->name,
		     (long long)((atomic_load(&ex->att_ep->eject_until_us) - now) / 1000),
		     ex->up->health.consecutive_failures);
}

void ex_report_health(struct exchange *ex, enum outcome out, const struct http_head *h)
{
	size_t n;
	bool hinted = h && (h->status == 429 || h->status == 503) &&
	              http_head_get(h, "Retry-After", &n);
	ex_report_health_as(ex, out, h ? h->status : 0, hinted);
}

/* ------------------------------------------------------------------ attempts */

/* The facts of SPEC §4 rules 2, 4 and 5 that belong to the request, the same for every
 * question asked of retry.c. */
static void request_facts(const struct exchange *ex, struct retry_facts *f)
{
	f->nested = ex->req_nested;
	f->method = ex->mclass;
	f->has_key = ex->has_key;
	f->idempotent_path = ex->idem_path;
	f->body_replayable = reqbody_replayable(&ex->rb, ex->up->retry.max_body);
}

/* No attempt can start: the deadline is too close, or no in-flight slot is free. */
static void cannot_start(struct exchange *ex, bool retry, enum refusal why)
{
	if (retry) {
		ex->refused = why;
		STAT_INC(ex->us->refused[why]);
		ex_deliver_last(ex);
	} else if (why == RR_DEADLINE) {
		STAT_INC(ex->us->rejected[REJ_DEADLINE]);
		ex_finish_error(ex, 504, "deadline-exceeded", false, NULL);
	} else {
		STAT_INC(ex->us->rejected[REJ_OVERLOADED]);
		ex_finish_error(ex, 503, "overloaded", false, "1");
	}
}

static void start_attempt(struct exchange *ex, struct ep_state *ep, bool retry)
{
	if (!ep) {
		/* no address yet (the first lookup has not answered): nothing was sent */
		ex->last_out = OUT_CONNECT_FAILURE;
		access_set_outcome(&ex->log, "no-address");
		if (retry)
			ex_deliver_last(ex);
		else
			ex_finish_error(ex, 502, "connect-failure", false, NULL);
		return;
	}
	int64_t now = clock_now_us();
	int64_t remaining = ex->deadline_us - now;
	if (remaining < ex->up->deadline.min_us || remaining < 1000) {
		cannot_start(ex, retry, RR_DEADLINE);
		return;
	}
	/* SPEC §4 rule 7: a retry takes its max_in_flight slot when it is sent; none free then:
	 * it ends refused */
	if (!upstream_take_in_flight(ex->st, ex->up->max_in_flight)) {
		cannot_start(ex, retry, RR_RETRIES_IN_FLIGHT);
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
	upstream_ep_keep(&ex->att_ep, ep);
	ex->att_t0_us = now;
	ex->last_att_status = 0;
	ex->att_grpc = -1;
	ex->pushback_us = -1;
	ex_set_state(ex, X_ATTEMPT);
	access_add_attempt(&ex->log, ep->name);
	ex->fault = ex_fault_draw(ex, now);
	if (ex->fault) {
		STAT_INC(ex->us->faults_injected[ex->fault->kind]);
		access_set_fault(&ex->log, faults_kind_name(ex->fault->kind));
		if (ex->fault->kind != FAULT_LOST_RESPONSE) {
			timer_assign(ex, &ex->fault_ev, EX_T_FAULT, ex_fault_cb);
			ex_fault_arm(ex, now);
			return;
		}
	}
	ex_send_attempt(ex, ep);
}

/* The attempt goes out now: its per-try time is what is left of it (a delay fault spent the
 * rest), and X-Timeout-Ms says so. */
void ex_send_attempt(struct exchange *ex, struct ep_state *ep)
{
	int64_t now = clock_now_us();
	int64_t remaining = ex->deadline_us - now;
	/* what a delay spent, in whole milliseconds: the microseconds between the attempt's start
	 * and here would make the header 2999 or 3000 by chance (and never the same twice) */
	int64_t spent = (now - ex->att_t0_us) / 1000 * 1000;
	int64_t per_try = ex->up->retry.per_try_timeout_us - spent;
	if (per_try < 1000)
		per_try = 1000;
	int64_t wait = per_try < remaining ? per_try : remaining;
	struct forward_req fw = {
		.req = ex->req,
		.host_rewrite = ex->up->host_rewrite,
		.endpoint = ep->host,
		.peer_ip = ex->peer_ip,
		.tls = ex->ci.tls,
		.reqid = ex->reqid,
		.dl_present = ex->dl_present,
		.wait_us = wait,
		.attempt = ex->attempts,
		.nested = ex->req_nested,
		.streamed = ex->rb.mode == BODY_STREAM || ex->rb.mode == BODY_TEE,
		.body_len = ex->rb.len,
		.grpc = ex->grpc,
	};
	bool h2 = ex->up->protocol == UP_H2;
	/* HTTP/1's head as bytes (the attempt gives the buffer back); HTTP/2 sends fields */
	struct evbuffer *head = h2 ? NULL : loop_buf_get(ex->loop);
	struct forward_nv nv;
	forward_nv_init(&nv);
	if (h2)
		forward_h2_headers(&fw, ex->ub->tls != NULL, &nv);
	else
		forward_h1_head(&fw, head);
	struct retry_facts rf = { 0 };
	request_facts(ex, &rf);
	char sni[256];
	struct attempt_req rq = {
		.head = head,
		.body = (ex->rb.mode == BODY_BUFFER && ex->rb.len > 0) ? ex->rb.buf : NULL,
		.streaming = ex->rb.mode == BODY_STREAM || ex->rb.mode == BODY_TEE,
		.chunked = ex->rb.mode == BODY_STREAM && ex->req->content_length < 0,
		.is_head = ex->req->method_head,
		.fresh_conn = !retry_may_replay(&ex->up->retry, &rf),
		.connect_timeout_us = ex->up->connect_timeout_us,
		.head_timeout_us = per_try < remaining ? per_try : 0,
		.tls = ex->ub->tls,
		.verify = ex->up->tls_verify,
		.sni = ex->ub->tls ? tls_server_name(ex->up->tls_sni, ep->host, sni, sizeof(sni)) : NULL,
		.h2 = h2,
		.nv = nv.nv,
		.nvlen = nv.n,
		.nv_bytes = nv.arena,
		.nv_bytes_len = nv.used,
		.trailers = ex->req_trailers,
		.ntrailers = ex->nreq_trailers,
	};
	ex->att = attempt_start(ex->loop, ep, &rq, &attempt_callbacks, ex);
	forward_nv_free(&nv);       /* nghttp2 copied the fields */
	reqbody_stream_to(&ex->rb, ex->att);
}

static void backoff_cb(evutil_socket_t fd, short what, void *arg)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state != X_BACKOFF)
		return;
	/* another request may have put a hold on the endpoint during our wait: rule 6 again */
	int64_t now = clock_now_us(), start;
	if (!upstream_ep_usable(ex->next_ep, ex->next_serial)) {
		/* its name no longer resolves to it: no new attempt there (SPEC §13) */
		upstream_ep_keep(&ex->next_ep, choose_endpoint(ex, now, true));
		if (!ex->next_ep) {
			ex_release_slots(ex);
			ex_deliver_last(ex);
			return;
		}
		ex->next_serial = atomic_load(&ex->next_ep->serial);
	}
	enum refusal r = retry_recheck_hold(&ex->up->retry, &ex->up->deadline, now, ex->deadline_us,
	                                    atomic_load(&ex->next_ep->hold_until_us), &start);
	if (r == RR_NONE && start > now) {
		struct timeval tv = clock_tv(start - now);
		evtimer_add(&ex->backoff_ev, &tv);
		return;
	}
	if (r != RR_NONE) {
		ex_release_slots(ex);
		ex->refused = r;
		STAT_INC(ex->us->refused[r]);
		ex_deliver_last(ex);
		return;
	}
	start_attempt(ex, ex->next_ep, true);
}

/* SPEC §4: a 429 or 503 with a valid Retry-After (when honored) puts a hold on the endpoint
 * that answered, whether or not a retry follows. Returns the hint in µs, or -1 for none. */
int64_t ex_retry_after_hint(struct exchange *ex, const struct http_head *h, int64_t now)
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
void ex_decide(struct exchange *ex, enum outcome out, const struct http_head *h, bool bad)
{
	const struct cfg_retry *rc = &ex->up->retry;
	int64_t now = clock_now_us();
	struct attempt *a = ex->att;
	ex->att = NULL;
	ex->last_out = out;
	ex->last_bad = bad;
	ex_release_slots(ex);              /* the failed attempt's slots go before the decision */

	struct retry_facts f = {
		.outcome = out,
		.status = h ? h->status : 0,
		.runtime_enabled = atomic_load_explicit(&ex->st->runtime_enabled, memory_order_relaxed),
		.attempts = ex->attempts,
		.now_us = now,
		.deadline_us = ex->deadline_us,
		.retry_after_us = -1,
		.rand = rand_next(&ex->loop->rng),
		.have_gates = true,
		.gates = {
			.tokens = budget_peek(&ex->st->budget, rc, now),
			.retries_in_flight = atomic_load_explicit(&ex->st->retries_in_flight,
			                                          memory_order_relaxed),
			.max_retries_in_flight = ex->up->max_retries_in_flight,
		},
	};
	request_facts(ex, &f);
	if (h) {
		if (admit_response_nested(h))
			f.nested = true;
		f.retry_after_us = ex_retry_after_hint(ex, h, now);
	}
	if (h && ex->grpc && ex->att_grpc >= 0) {
		/* SPEC §10: the outcome is the grpc-status; pushback is its Retry-After */
		f.grpc = true;
		f.grpc_status = ex->att_grpc;
		f.pushback_refuse = rc->retry_after_honor && ex->pushback_us == -2;
		int64_t pb = ex_grpc_pushback_hold(ex, now);
		if (pb >= 0)
			f.retry_after_us = pb;
	}
	struct ep_state *next = choose_endpoint(ex, now, true);
	int64_t hold = next ? atomic_load(&next->hold_until_us) : 0;
	f.hold_until_us = hold > now ? hold : 0;

	int64_t start = 0;
	/* an Upgrade request is tunnelled without retries (SPEC §8); no address: nowhere to go */
	enum refusal reason = ex->req->upgrade || !next
	                      ? RR_NOT_LISTED : retry_decide(rc, &ex->up->deadline, &f, &start);
	if (reason == RR_NONE) {
		/* rule 7 passed over the snapshot: now take the slot, then the token (a token cannot
		 * be given back); another worker may have won the race meanwhile */
		bool slot = upstream_take_retry_slot(ex->st, ex->up->max_retries_in_flight);
		bool token = slot && budget_take(&ex->st->budget, rc, now);
		if (slot && !token)
			upstream_release_retry_slot(ex->st);
		reason = retry_gate_taken(slot, token);
		ex->slot_retry = reason == RR_NONE;
	}
	if (reason == RR_NONE) {
		if (h) {
			saved_keep(&ex->saved, h, a);   /* it goes on collecting the body */
			ex->saved.complete = a == NULL;     /* a fault's abort has no body to collect */
			if (ex->dec_trailers)
				saved_keep_trailers(&ex->saved, ex->dec_trailers, ex->dec_ntrailers);
			ex->saved.grpc_status = ex->att_grpc;
		} else {
			attempt_free(a);
		}
		upstream_ep_keep(&ex->next_ep, next);
		ex->next_serial = atomic_load(&next->serial);
		ex_set_state(ex, X_BACKOFF);
		struct timeval tv = clock_tv(start - now);
		timer_assign(ex, &ex->backoff_ev, EX_T_BACKOFF, backoff_cb);
		evtimer_add(&ex->backoff_ev, &tv);
		return;
	}
	if (reason != RR_NOT_LISTED) {
		STAT_INC(ex->us->refused[reason]);
		ex->refused = reason;
	}
	if (h) {
		saved_clear(&ex->saved);
		ex_relay_from(ex, a, h, reason);
		if (ex->dec_trailers)
			ex_relay_trailers(ex, ex->dec_trailers, ex->dec_ntrailers);
		if (!a)
			ex_relay_complete(ex);     /* a fault's abort: the whole response was its head */
		return;
	}
	attempt_free(a);
	ex_deliver_last(ex);
}

/* ------------------------------------------------------------------ attempt callbacks */

static void att_head(void *arg, struct attempt *a, const struct http_head *h)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state == X_DONE || a != ex->att)
		return;
	if (h->status >= 100 && h->status < 200 && h->status != 101) {
		ex_relay_informational(ex, h);
		return;
	}
	if (h->status == 101 && ex->req->upgrade) {
		ex_start_tunnel(ex, a, h);
		return;
	}
	if (ex->fault && ex->fault->kind == FAULT_LOST_RESPONSE) {
		/* SPEC §11: the upstream processed it; its response is thrown away and the connection
		 * closed (ex_decide() frees the attempt, which never pools it): a reset */
		STAT_INC(ex->us->outcomes[OUT_RESET]);
		access_set_outcome(&ex->log, outcome_name(OUT_RESET));
		ex->reached = true;
		ex_decide(ex, OUT_RESET, NULL, false);
		return;
	}
	if (h->status == 101) {
		/* an unsolicited 101: an invalid response */
		STAT_INC(ex->us->outcomes[OUT_RESET]);
		access_set_outcome(&ex->log, "bad-response");
		ex_decide(ex, OUT_RESET, NULL, true);
		return;
	}
	STAT_INC(ex->us->responses[h->status / 100]);
	if (!ex->grpc || h->status != 200)
		ex_report_health(ex, OUT_STATUS, h);  /* a gRPC 200 reports once its outcome is known */
	access_set_status(&ex->log, h->status);
	ex->last_out = OUT_STATUS;      /* the last attempt answered (a reset before is history) */
	ex->last_att_status = h->status;
	ex->reached = true;
	if (ex->grpc && h->status == 200 && ex_grpc_head(ex, a, h))
		return;
	if (cfg_retry_on_status(&ex->up->retry, h->status)) {
		ex_decide(ex, OUT_STATUS, h, false);
		return;
	}
	ex_retry_after_hint(ex, h, clock_now_us());    /* not retried, but it may set a hold */
	ex_relay_from(ex, a, h, RR_NONE);
}

static void att_body(void *arg, struct attempt *a, struct evbuffer *data)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->grpc_wait && a == ex->att && ex->state == X_ATTEMPT &&
	    evbuffer_get_length(data) > 0)
		ex_grpc_commit(ex, a);
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
		loop_buf_hold(ex->saved.body, data);
		return;
	}
	if (ex->state != X_RELAY || a != ex->relay) {
		evbuffer_drain(data, evbuffer_get_length(data));
		return;
	}
	ex_relay_body(ex, data);
	if (ex->rsp.queued(ex->rsp.arg) > CLIENT_HIGH)
		attempt_pause(a);
}

static void att_trailers(void *arg, struct attempt *a, const struct http_hdr *t, int n)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state == X_DONE)
		return;
	if (ex->grpc_wait && a == ex->att) {
		ex_grpc_trailers(ex, a, t, n);
		return;
	}
	if (a == ex->saved.a) {
		saved_keep_trailers(&ex->saved, t, n);
		return;
	}
	if (ex->state == X_RELAY && a == ex->relay) {
		if (ex->grpc)
			ex_grpc_outcome(ex, t, n);  /* a committed call's final status, for the count */
		ex_relay_trailers(ex, t, n);
	}
}

static void att_drain(void *arg, struct attempt *a)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state != X_DONE && (ex->rb.mode == BODY_STREAM || ex->rb.mode == BODY_TEE) &&
	    !ex->rb.done)
		ex->rsp.want_body(ex->rsp.arg);
}

static void att_end(void *arg, struct attempt *a, enum outcome out, bool bad, const char *detail)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
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
			ex_relay_complete(ex);
		} else {
			slog(LOG_WARN, ex->ci.sid, "upstream %s: %s: response cut short", ex->up->name, detail);
			ex_finish(ex, false, true);    /* never pad or complete a truncated body */
		}
		return;
	}
	if (a != ex->att)
		return;
	if (ex->grpc_wait && ex_grpc_end(ex, a, out))
		return;
	if (out != OUT_CONNECT_FAILURE)
		ex->reached = true;
	STAT_INC(ex->us->outcomes[bad ? OUT_RESET : out]);
	ex_report_health(ex, bad ? OUT_RESET : out, NULL);
	access_set_outcome(&ex->log, bad ? "bad-response" : outcome_name(out));
	slog(LOG_DEBUG, ex->ci.sid, "upstream %s attempt %d to %s: %s (%s)", ex->up->name, ex->attempts,
	     attempt_peer(a), bad ? "bad-response" : outcome_name(out), detail ? detail : "");
	ex_decide(ex, bad ? OUT_RESET : out, NULL, bad);
}

static const struct attempt_cbs attempt_callbacks = {
	.on_head = att_head,
	.on_body = att_body,
	.on_trailers = att_trailers,
	.on_drain = att_drain,
	.on_end = att_end,
};

/* ------------------------------------------------------------------ deadline */

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state == X_DONE || ex->state == X_RELAY)
		return;     /* a response whose head arrived in time is not cut off */
	if (reqbody_left_unread(&ex->rb, true))
		ex->close_after = true;
	if (ex->att) {
		/* SPEC §4: cut before any byte was written it is a connect-failure, else a timeout */
		enum outcome o = attempt_wrote_any(ex->att) ? OUT_TIMEOUT : OUT_CONNECT_FAILURE;
		STAT_INC(ex->us->outcomes[o]);
		ex->last_out = o;
		access_set_outcome(&ex->log, outcome_name(o));
		attempt_free(ex->att);
		ex->att = NULL;
		ex_grpc_unhold(ex);
	} else if (ex->fault_pending) {
		/* a fault's attempt: a delay cut is a timeout (SPEC §11), the rest sent nothing */
		enum outcome o = ex->fault->kind == FAULT_DELAY ? OUT_TIMEOUT : OUT_CONNECT_FAILURE;
		STAT_INC(ex->us->outcomes[o]);
		ex->last_out = o;
		access_set_outcome(&ex->log, outcome_name(o));
		evtimer_del(&ex->fault_ev);
		ex->fault_pending = false;
	}
	ex_release_slots(ex);
	if (ex->saved.valid) {
		ex->refused = RR_DEADLINE;
		STAT_INC(ex->us->refused[RR_DEADLINE]);
		ex_relay_saved(ex, RR_DEADLINE);
		return;
	}
	ex_finish_error(ex, 504, "deadline-exceeded", false, NULL);
}

/* Stop the timers that were ever armed (ex_end(): once, when the exchange is over). */
void ex_timers_stop(struct exchange *ex)
{
	if (ex->timers & EX_T_DEADLINE)
		evtimer_del(&ex->deadline_ev);
	if (ex->timers & EX_T_BACKOFF)
		evtimer_del(&ex->backoff_ev);
	if (ex->timers & EX_T_FAULT)
		evtimer_del(&ex->fault_ev);
}

/* ------------------------------------------------------------------ the codec's side */

struct exchange *exchange_new(struct loop *loop, struct runtime *rt, struct cfg_listener *l,
                              const struct client_info *ci, const struct http_head *req,
                              const struct responder *rsp)
{
	struct exchange *ex = loop_obj_get(loop, LOOP_EXCHANGE, sizeof(*ex));
	atomic_fetch_add(&g_gstats[loop->id].exchanges_active, 1);
	ex->magic = EXCHANGE_MAGIC;
	ex->loop = loop;
	ex->rt = runtime_ref(rt);
	ex->l = l;
	ex->ci = *ci;
	size_t plen = strlen(ci->peer_ip ? ci->peer_ip : "");
	if (plen >= sizeof(ex->peer_ip))
		plen = sizeof(ex->peer_ip) - 1;
	memcpy(ex->peer_ip, ci->peer_ip ? ci->peer_ip : "", plen);
	ex->ci.peer_ip = ex->peer_ip;
	ex->req = req;
	ex->rsp = *rsp;
	ex->t0_us = clock_now_us();
	ex->att_grpc = ex->client_grpc = -1;
	ex->pushback_us = -1;
	reqbody_init(&ex->rb, loop_buf_get(loop), req->chunked || req->content_length > 0, BODY_NONE);
	forward_request_id(req, ex->reqid, &loop->rng);
	access_begin(&ex->log, ci->sid, ex->peer_ip, req, ex->reqid);
	return ex;
}

void exchange_start(struct exchange *ex)
{
	const struct http_head *r = ex->req;
	struct admission ad;
	admit_request(ex->l, r, &ad);
	if (ad.route) {
		ex->up = ad.route->upstream;
		ex->ub = runtime_upstream(ex->rt, ex->up);
		ex->st = ex->ub->st;
		ex->us = &ex->st->stats[ex->loop->id];
		access_set_route(&ex->log, ad.route, ex->up->name);
	}
	ex->given_us = ad.budget_us;
	ex->deadline_us = ex->t0_us + ad.budget_us;
	ex->log.deadline_given_us = ad.budget_us;
	memcpy(ex->dl_present, ad.dl_present, sizeof(ex->dl_present));
	ex->req_nested = ad.nested;
	ex->mclass = ad.mclass;
	ex->has_key = ad.key != NULL;
	if (ex->has_key)
		access_set_key(&ex->log, ad.key, ad.keylen);
	ex->enforce_idem = ad.idem;
	ex->grpc = ad.grpc;
	ex->idem_path = ad.idempotent_path;
	ex->rb.mode = ex->rb.present ? ad.bmode : BODY_NONE;
	/* SPEC §10: a gRPC call's messages go upstream as they come (a streaming peer may wait
	 * for answers before it sends more), kept for replay while they fit retry.max_body;
	 * enforcement here needs the whole body for its fingerprint, so it still buffers */
	if (ex->grpc && ex->rb.mode == BODY_BUFFER && !ex->enforce_idem)
		ex->rb.mode = BODY_TEE;
	if (ad.status) {
		if (ad.too_late)
			STAT_INC(ex->us->rejected[REJ_DEADLINE]);
		ex_finish_error(ex, ad.status, ad.reason, ad.close, NULL);
		return;
	}
	struct timeval tv = clock_tv(ex->given_us);
	timer_assign(ex, &ex->deadline_ev, EX_T_DEADLINE, deadline_cb);
	evtimer_add(&ex->deadline_ev, &tv);

	if (ex->rb.mode == BODY_BUFFER) {
		/* we want the whole body before the first attempt: say so ourselves */
		if (r->expect_continue) {
			struct resp_head cont = { .status = 100, .content_length = -1 };
			ex->rsp.informational(ex->rsp.arg, &cont);
		}
		ex_set_state(ex, X_WAIT_BODY);
		return;
	}
	exchange_go(ex);
}

/* The claim's answer (from the event loop, never inside the claim call). */
static void idem_claimed_cb(void *arg, enum idem_result r, const struct idem_response *stored)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state != X_CLAIM)
		return;
	switch (r) {
	case IDEM_CLAIMED:
		start_attempt(ex, choose_endpoint(ex, clock_now_us(), false), false);
		return;
	case IDEM_REPLAY: {
		STAT_INC(ex->us->idem[IS_REPLAYED]);
		struct replay_response m;
		respond_replay(&m, stored);
		respond_request_id(&m.head, m.fields, (int)(sizeof(m.fields) / sizeof(m.fields[0])),
		                   ex->reqid);
		ex->resp_status = stored->status;
		ex->log.reason = "idempotency-replayed";
		ex->head_sent = true;
		respond_replay_send(&ex->rsp, &m, stored->body);
		ex_finish(ex, true, false);
		return;
	}
	case IDEM_MISMATCH:
		STAT_INC(ex->us->idem[IS_MISMATCH]);
		ex_finish_error(ex, 422, "idempotency-key-mismatch", false, NULL);
		return;
	case IDEM_IN_PROGRESS:
		STAT_INC(ex->us->idem[IS_CONFLICT]);
		ex_finish_error(ex, 409, "idempotency-in-progress", false, NULL);
		return;
	case IDEM_UNAVAILABLE:
		ex_finish_error(ex, 503, "idempotency-store-unavailable", false, NULL);
		return;
	}
}

/* The request may go: claim its key first when this hop enforces idempotency. */
static void exchange_go(struct exchange *ex)
{
	const struct cfg_idempotency *ic = &ex->up->idem;
	if (!ex->enforce_idem) {
		start_attempt(ex, choose_endpoint(ex, clock_now_us(), false), false);
		return;
	}
	const char *err = NULL;
	ex_set_state(ex, X_CLAIM);
	ex->idem = idem_job_claim(ex->loop, ic, ex->up->name, ex->req, ex->rb.buf, idem_claimed_cb, ex,
	                          &err);
	if (!ex->idem) {
		slog(LOG_ERROR, ex->ci.sid, "idempotency store %s: %s", ic->store, err ? err : "unavailable");
		ex_finish_error(ex, 503, "idempotency-store-unavailable", false, NULL);
	}
}

static struct attempt *streaming_attempt(const struct exchange *ex)
{
	return ex->att ? ex->att : ex->relay;
}

void exchange_body(struct exchange *ex, struct evbuffer *data)
{
	if (ex->state == X_DONE) {
		ex->rb.len += (int64_t)evbuffer_get_length(data);
		ex->log.body_bytes = ex->rb.len;
		evbuffer_drain(data, evbuffer_get_length(data));
		return;
	}
	int64_t keep = ex->enforce_idem ? ex->up->idem.max_body : ex->up->retry.max_body;
	enum reqbody_event e = reqbody_take(&ex->rb, data, ex->l->limits.max_body, keep,
	                                    ex->enforce_idem, streaming_attempt(ex));
	ex->log.body_bytes = ex->rb.len;
	if (e == RB_OUTGREW) {
		start_attempt(ex, choose_endpoint(ex, clock_now_us(), false), false);
	} else if (e == RB_OVER_LIMIT && ex->head_sent) {
		ex_finish(ex, false, true);
	} else if (e == RB_OVER_LIMIT) {
		attempt_free(ex->att);
		ex->att = NULL;
		ex_finish_error(ex, 413, "body-too-large", true, NULL);
	}
}

void exchange_trailers(struct exchange *ex, const struct http_hdr *t, int n)
{
	/* SPEC §9: trailers cross only between HTTP/2 peers; an HTTP/1 upstream gets none (§8).
	 * Kept for every attempt; the one streaming now gets them before the body ends. */
	if (ex->state == X_DONE || n <= 0 || ex->req_trailers || !ex->up ||
	    ex->up->protocol != UP_H2)
		return;
	saved_copy_fields(t, n, &ex->req_trailers, &ex->req_tmem, 0);
	ex->nreq_trailers = n;
	struct attempt *a = streaming_attempt(ex);
	if (a && (ex->rb.mode == BODY_STREAM || ex->rb.mode == BODY_TEE))
		attempt_send_trailers(a, ex->req_trailers, n);
}

void exchange_body_end(struct exchange *ex)
{
	if (ex->state == X_DONE) {
		ex->rb.done = true;
		return;
	}
	reqbody_end(&ex->rb, streaming_attempt(ex));
	if (ex->rb.mode == BODY_BUFFER && ex->state == X_WAIT_BODY)
		exchange_go(ex);
}

size_t exchange_body_room(const struct exchange *ex)
{
	if (ex->state == X_DONE)
		return 64 * 1024;       /* discard what is left, the connection closes after */
	return reqbody_room(&ex->rb, streaming_attempt(ex));
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
	ex_end(ex);
	ex_log_request(ex, clock_now_us());
}

static void exchange_free_cb(void *p)
{
	struct exchange *ex = p;
	ex->magic = 0;
	loop_obj_put(ex->loop, LOOP_EXCHANGE, ex);
}

void exchange_free(struct exchange *ex)
{
	if (!ex)
		return;
	if (ex->state != X_DONE)
		exchange_abort(ex);
	/* its timers were stopped by ex_end(), which ran (X_DONE is terminal and only ex_end()
	 * sets it, and nothing arms a timer without leaving a state first) */
	loop_buf_put(ex->loop, ex->rb.buf);
	free(ex->req_trailers);
	free(ex->req_tmem);
	idem_job_free(ex->idem);
	upstream_ep_keep(&ex->att_ep, NULL);
	upstream_ep_keep(&ex->next_ep, NULL);
	runtime_unref(ex->rt);
	atomic_fetch_sub(&g_gstats[ex->loop->id].exchanges_active, 1);
	loop_defer_free(ex->loop, exchange_free_cb, ex);
}
