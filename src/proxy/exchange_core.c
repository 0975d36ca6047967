/*
 * exchange_core: the bottom of the exchange (see exchange_impl.h): the one writer of its
 * state, its timers, its in-flight slots, the passive health of the attempt's endpoint
 * (SPEC §13) and the holds an answer's Retry-After or gRPC pushback puts on it (SPEC §4, §10).
 * Every other exchange file calls down into this one; it calls none of them.
 *
 * Invariant: the two waits inside an attempt are states, and leaving one undoes it here:
 * X_FAULT_WAIT's fault_ev is deleted, X_HELD's head is freed (a path that
 * still needs the held head takes it out of ex->held first).
 */
#include <stdio.h>
#include <stdlib.h>

#include <event2/event.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/loop.h"
#include "base/util.h"
#include "http/grpc.h"
#include "http/h1_parser.h"
#include "obs/stats.h"
#include "policy/budget.h"
#include "policy/faults.h"
#include "policy/outlier.h"
#include "policy/retry.h"
#include "proxy/exchange_impl.h"
#include "proxy/saved_response.h"
#include "state/budget_shared.h"
#include "state/runtime.h"
#include "state/upstream.h"
#include "upstream/attempt.h"

DEFINE_STATE_SETTER(set_state, exchange, xstate, X_DONE)

void ex_held_free(struct grpc_held *held)
{
	if (!held)
		return;
	loop_blk_free(held->loop, held);
}

/* The one writer of the state (DESIGN rule 2). */
void ex_set_state(struct exchange *ex, enum xstate st)
{
	if (ex->state == X_FAULT_WAIT && st != X_FAULT_WAIT) {
		evtimer_del(&ex->fault_ev);
	} else if (ex->state == X_HELD && st != X_HELD) {
		ex_held_free(ex->held);
		ex->held = NULL;
	}
	/* SPEC §14: a response relayed (ex->att its winner) or the end: the others are cancelled */
	if (ex->hedging && (st == X_RELAY || st == X_DONE)) {
		if (st == X_RELAY && ex->att)
			ex_hedge_won(ex);
		ex_hedge_cancel_all(ex);
	}
	set_state(ex, st);
}

/* ------------------------------------------------------------------ timers */

int64_t ex_fault_due(const struct exchange *ex, const struct cfg_fault_rule *r, int64_t t0,
                     enum outcome *cut)
{
	bool c;
	int64_t wait = faults_wait_us(r, ex->retry->per_try_timeout_us, ex->deadline_us - t0, &c);
	*cut = c ? OUT_TIMEOUT : OUT_NONE;
	return t0 + wait;
}

/* Assign EV (the exchange's timer BIT) the first time it is needed (see exchange_impl.h). */
void ex_timer_assign(struct exchange *ex, struct event *ev, uint8_t bit, event_callback_fn cb)
{
	if (ex->timers & bit)
		return;
	evtimer_assign(ev, ex->loop->base, cb, ex);
	ex->timers |= bit;
}

/* Stop the timers that were ever armed (ex_end(): once, when the exchange is over). */
void ex_timers_stop(struct exchange *ex)
{
	loop_timer_del(ex->loop, &ex->deadline_t);
	if (ex->timers & EX_T_BACKOFF)
		evtimer_del(&ex->backoff_ev);
	if (ex->timers & EX_T_FAULT)
		evtimer_del(&ex->fault_ev);
	if (ex->timers & EX_T_HEDGE)
		evtimer_del(&ex->hedging->ev);
	if (ex->timers & EX_T_HFAULT)
		evtimer_del(&ex->hedging->fault_ev);
}

/* ------------------------------------------------------------------ slots */

void ex_release_slots(struct exchange *ex)
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

/* ------------------------------------------------------------------ hedges (SPEC §14) */

void ex_hedge_swap(struct exchange *ex, struct hedge_try *t)
{
	struct hedging *hg = ex->hedging;
	struct hedge_try mine = {
		.a = ex->att, .ep = ex->att_ep, .t0_us = ex->att_t0_us, .log_idx = hg->att_log,
		.num = hg->att_num, .hedge = hg->att_hedge, .other_conn = hg->att_other_conn,
		.slot_in_flight = ex->slot_in_flight, .slot_retry = ex->slot_retry,
		.fault = ex->fault, .fault_cut = ex->fault_cut,
	};
	/* ex->att's fault wait, not over yet, goes on as the try's */
	if (ex->state == X_FAULT_WAIT && ex->fault)
		mine.fault_due_us = ex_fault_due(ex, ex->fault, ex->att_t0_us, &mine.fault_cut);
	int64_t due = t->fault_due_us;
	ex->att = t->a;
	ex->att_ep = t->ep;
	ex->att_t0_us = t->t0_us;
	ex->slot_in_flight = t->slot_in_flight;
	ex->slot_retry = t->slot_retry;
	ex->fault = t->fault;
	ex->fault_cut = t->fault_cut;
	hg->att_log = t->log_idx;
	hg->att_num = t->num;
	hg->att_hedge = t->hedge;
	hg->att_other_conn = t->other_conn;
	*t = mine;
	/* the per-attempt facts an answer sets belong to the one now in ex->att */
	ex->att_grpc = -1;
	ex->pushback_us = -1;
	access_select(&ex->log, hg->att_log);
	if (due) {
		/* its fault's wait: fault_ev (assigned when it was drawn) ends it */
		int64_t now = clock_now_us();
		if (ex->state != X_FAULT_WAIT)
			ex_set_state(ex, X_FAULT_WAIT);
		struct timeval tv = clock_tv(due - now);
		evtimer_add(&ex->fault_ev, &tv);
	} else if (ex->state != X_ATTEMPT) {
		ex_set_state(ex, X_ATTEMPT);
	}
	/* a wait among the others, new or one whose end passed while no try could take ex->att's
	 * place (X_HELD) */
	if (mine.fault_due_us || (ex->timers & EX_T_HFAULT))
		ex_hedge_fault_rearm(ex);
}

void ex_hedge_won(struct exchange *ex)
{
	if (ex->hedging->att_hedge) {
		STAT_INC(ex->us->hedges_won);
		access_set_won(&ex->log, ex->hedging->att_log);
	}
}

void ex_hedge_fault_rearm(struct exchange *ex)
{
	struct hedging *hg = ex->hedging;
	int64_t due = 0;
	for (int i = 0; i < hg->n; i++)
		if (hg->o[i].fault_due_us && (!due || hg->o[i].fault_due_us < due))
			due = hg->o[i].fault_due_us;
	if (!due) {
		if (ex->timers & EX_T_HFAULT)
			evtimer_del(&hg->fault_ev);
		return;
	}
	/* assigned with the hedging (exchange_retry.c), added only now: ex_timers_stop() */
	ex->timers |= EX_T_HFAULT;
	struct timeval tv = clock_tv(due - clock_now_us());
	evtimer_add(&hg->fault_ev, &tv);
}

/* Cancel O[I] (HTTP/1.1: its connection closed; HTTP/2: RST_STREAM CANCEL) and free its
 * slots. */
void ex_hedge_drop(struct exchange *ex, int i)
{
	struct hedging *hg = ex->hedging;
	struct hedge_try *t = &hg->o[i];
	attempt_free(t->a);
	if (t->slot_in_flight)
		upstream_release_in_flight(ex->st);
	if (t->slot_retry)
		upstream_release_retry_slot(ex->st);
	upstream_ep_keep(&t->ep, NULL);
	hg->o[i] = hg->o[--hg->n];
}

bool ex_hedge_takeover(struct exchange *ex)
{
	struct hedging *hg = ex->hedging;
	if (!hg || hg->n == 0)
		return false;
	attempt_free(ex->att);      /* NULL when the exchange kept it (its response) */
	ex->att = NULL;
	ex_release_slots(ex);
	upstream_ep_keep(&ex->att_ep, NULL);
	ex->fault = NULL;           /* the ended attempt's: nothing of it goes on */
	ex_hedge_swap(ex, &hg->o[hg->n - 1]);
	hg->n--;            /* the swap left the ended attempt's nothing there */
	return true;
}

void ex_hedge_cancel_all(struct exchange *ex)
{
	struct hedging *hg = ex->hedging;
	if (hg->bs_op) {
		budget_shared_cancel(hg->bs_op);
		hg->bs_op = NULL;
		upstream_release_retry_slot(ex->st);
	}
	while (ex->hedging->n > 0)
		ex_hedge_drop(ex, ex->hedging->n - 1);
}

/* ------------------------------------------------------------------ the endpoint's health */

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

/* SPEC §4: a 429 or 503 with a valid Retry-After (when honored) puts a hold on the endpoint
 * that answered, whether or not a retry follows. Returns the hint in µs, or -1 for none. */
int64_t ex_retry_after_hint(struct exchange *ex, const struct http_head *h, int64_t now)
{
	size_t n;
	const char *ra = (h->status == 429 || h->status == 503) && ex->retry->retry_after_honor
	                 ? http_head_get(h, "Retry-After", &n) : NULL;
	int64_t delay;
	if (!ra || retry_after_parse(ra, n, clock_wall(), &delay) != 0)
		return -1;
	if (delay > 0)
		upstream_hold(ex->att_ep, now + delay);
	return delay;
}

/* SPEC §10: with retry_after.honor, a non-negative grpc-retry-pushback-ms puts a hold on the
 * endpoint that answered, whether or not a retry follows. Returns it in µs, or -1 for none. */
int64_t ex_grpc_pushback_hold(struct exchange *ex, int64_t now)
{
	if (!ex->retry->retry_after_honor || ex->pushback_us < 0)
		return -1;
	if (ex->pushback_us > 0)
		upstream_hold(ex->att_ep, now + ex->pushback_us);
	return ex->pushback_us;
}

/* ------------------------------------------------------------------ what the log says */

void ex_note_outage(struct exchange *ex, enum outage_kind k, int64_t now)
{
	if (!outage_due(&ex->st->outage, k, now))
		return;
	struct outage_subject u = {
		.name = ex->up->name,
		.per_worker = ex->st->stats,
		.tokens = budget_peek(&ex->st->budget, &ex->up->retry, now),
		.max_tokens = (double)ex->up->retry.budget_max_tokens,
	};
	outage_write(&ex->st->outage, k, &u, now);
}

void ex_log_decision(const struct exchange *ex, enum outcome out, const struct http_head *h,
                     int grpc, enum refusal reason, int64_t wait_us)
{
	char what[64];
	if (log_min_level > LOG_DEBUG)
		return;
	if (!h)
		snprintf(what, sizeof(what), "%s", ex->last_bad ? "bad-response" : outcome_name(out));
	else if (grpc >= 0)
		snprintf(what, sizeof(what), "status %d, grpc-status %s", h->status,
		         grpc_status_name(grpc));
	else
		snprintf(what, sizeof(what), "status %d", h->status);
	if (reason == RR_NONE)
		slog(LOG_DEBUG, ex->ci.sid, "upstream %s attempt %d: %s; decision: retry (outcome in "
		     "retry.on, every rule passed), backoff %.1f ms", ex->up->name, ex->attempts, what,
		     (double)wait_us / 1e3);
	else
		slog(LOG_DEBUG, ex->ci.sid, "upstream %s attempt %d: %s; decision: no retry, reason %s",
		     ex->up->name, ex->attempts, what,
		     reason == RR_NOT_LISTED ? "not-listed (outcome not in retry.on)" : refusal_name(reason));
}
