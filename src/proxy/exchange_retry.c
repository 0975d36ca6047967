/*
 * exchange_retry: an exchange's attempts and the retry loop between them (see exchange_impl.h):
 * an attempt starts (the endpoint, the deadline and slot checks, SPEC §11's draw and its wait),
 * goes out (the upstream request is forward_h1_head() or forward_h2_headers()), and when its
 * outcome is known ex_decide() retries it after a backoff or delivers; the decision itself is
 * retry_decide(). Calls go down only: to exchange_fault.c, exchange_reply.c, exchange_core.c;
 * the attempt's news goes up through the table exchange.c put in ex->att_cbs.
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

#include "base/clock.h"
#include "base/loop.h"
#include "base/util.h"
#include "proxy/forward.h"
#include "net/tls.h"
#include "obs/accesslog.h"
#include "obs/stats.h"
#include "policy/balance.h"
#include "policy/faults.h"
#include "policy/retry.h"
#include "idempotency/idempotency.h"
#include "proxy/admit.h"
#include "proxy/exchange_impl.h"
#include "proxy/reqbody.h"
#include "proxy/saved_response.h"
#include "state/budget_shared.h"
#include "state/runtime.h"
#include "state/upstream.h"
#include "upstream/attempt.h"

static void send_attempt(struct exchange *ex, struct ep_state *ep, int num, bool hedge,
                         bool other_conn);
static struct attempt *attempt_go(struct exchange *ex, struct ep_state *ep, int64_t t0, int num,
                                  bool hedge, bool other_conn);
static void hedge_att_facts(struct exchange *ex);
static void hedge_arm(struct exchange *ex, int64_t now);
static void fault_cb(evutil_socket_t fd, short what, void *arg);
static void hedge_fault_cb(evutil_socket_t fd, short what, void *arg);

/* ------------------------------------------------------------------ attempts */

/* The address for an attempt, or NULL while no name of the upstream has one (SPEC §13). Only
 * a first attempt advances round-robin: a retry's choice never shifts where the next request
 * goes (otherwise every failure would steer the next first attempt to the failing endpoint). */
struct ep_state *ex_choose_endpoint(struct exchange *ex, int64_t now, bool retry)
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


/* The facts of SPEC §4 rules 2, 4 and 5 that belong to the request, the same for every
 * question asked of retry.c. */
static void request_facts(const struct exchange *ex, struct retry_facts *f)
{
	f->nested = ex->req_nested;
	f->method = ex->mclass;
	f->has_key = ex->has_key;
	f->enforced = ex->enforce_idem;
	f->idempotent_path = ex->idem_path;
	f->body_replayable = reqbody_replayable(&ex->rb, ex->retry->max_body);
}

/* No attempt can start: the deadline is too close, or no in-flight slot is free. */
static void cannot_start(struct exchange *ex, bool retry, enum refusal why)
{
	if (retry) {
		ex->refused = why;
		STAT_INC(ex->us->refused[why]);
		ex_note_outage(ex, OUTAGE_REFUSALS, clock_now_us());
		ex_deliver_last(ex);
	} else if (why == RR_DEADLINE) {
		STAT_INC(ex->us->rejected[REJ_DEADLINE]);
		ex_note_outage(ex, OUTAGE_REFUSALS, clock_now_us());
		ex_finish_error(ex, 504, "deadline-exceeded", false, NULL);
	} else {
		STAT_INC(ex->us->rejected[REJ_OVERLOADED]);
		ex_note_outage(ex, OUTAGE_REFUSALS, clock_now_us());
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
	if (remaining < ex->deadline->min_us || remaining < 1000) {
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
		/* shared or not, the local bucket is credited: the fallback is ready at once */
		budget_deposit(&ex->st->budget, &ex->up->retry, now);
		if (ex->up->retry.budget_shared_host)
			budget_shared_credit(&(struct budget_shared_ctx)SHARED_CTX(ex), now);
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
	access_add_attempt(&ex->log, ep->name);
	if (ex->hedging)
		hedge_att_facts(ex);
	ex->fault = ex_fault_draw(ex, now);
	if (ex->fault) {
		STAT_INC(ex->us->faults_injected[ex->fault->kind]);
		access_set_fault(&ex->log, faults_kind_name(ex->fault->kind));
		if (ex->fault->kind != FAULT_LOST_RESPONSE) {
			/* it sends nothing (yet): what it amounts to comes from fault_ev, never from
			 * inside this call */
			ex_set_state(ex, X_FAULT_WAIT);
			ex_timer_assign(ex, &ex->fault_ev, EX_T_FAULT, fault_cb);
			ex_fault_arm(ex, now);
			/* a delayed attempt is hedged as a slow one is (SPEC §14: `after` its start);
			 * the others end at once */
			if (ex->fault->kind == FAULT_DELAY && cfg_hedge_on(ex->retry))
				hedge_arm(ex, now);
			return;
		}
	}
	ex_set_state(ex, X_ATTEMPT);
	send_attempt(ex, ep, ex->attempts, false, false);
	if (cfg_hedge_on(ex->retry))
		hedge_arm(ex, now);
}

/* ex->att goes out now (NUM, HEDGE, OTHER_CONN: as attempt_go() says). */
static void send_attempt(struct exchange *ex, struct ep_state *ep, int num, bool hedge,
                         bool other_conn)
{
	ex->att = attempt_go(ex, ep, ex->att_t0_us, num, hedge, other_conn);
	reqbody_stream_to(&ex->rb, ex->att);
}

/* An attempt to EP, the request's NUMth, started at T0, goes out (HEDGE: as a hedge;
 * OTHER_CONN: not over a connection this request already uses, SPEC §14): its per-try time is
 * what is left of it (a delay fault spent the rest), and X-Timeout-Ms says so. A gRPC attempt
 * is told the call's remaining time instead (SPEC §10): its server enforces grpc-timeout over
 * the whole call, streams included, while the per-try time bounds only the wait for its head. */
static struct attempt *attempt_go(struct exchange *ex, struct ep_state *ep, int64_t t0, int num,
                                  bool hedge, bool other_conn)
{
	int64_t now = clock_now_us();
	int64_t remaining = ex->deadline_us - now;
	/* what a delay spent, in whole milliseconds: the microseconds between the attempt's start
	 * and here would make the header 2999 or 3000 by chance (and never the same twice) */
	int64_t spent = (now - t0) / 1000 * 1000;
	int64_t per_try = ex->retry->per_try_timeout_us - spent;
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
		.wait_us = ex->grpc ? remaining : wait,
		.attempt = num,
		.nested = ex->req_nested,
		.hedge = hedge,
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
		.body = reqbody_ref(&ex->rb),
		.streaming = ex->rb.mode == BODY_STREAM || ex->rb.mode == BODY_TEE,
		.chunked = ex->rb.mode == BODY_STREAM && ex->req->content_length < 0,
		.is_head = ex->req->method_head,
		.fresh_conn = !retry_may_replay(ex->retry, &rf),
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
		.other_conn = other_conn,
	};
	struct attempt *a = attempt_start(ex->loop, ep, &rq, ex->att_cbs, ex);
	forward_nv_free(&nv);       /* nghttp2 copied the fields */
	return a;
}

/* ------------------------------------------------------------------ hedges (SPEC §14) */

/* Rules 1-5 for a hedge: retries on, the request repeatable after an outcome that may have
 * executed (it may: the first attempt is still running), its body all here (a gRPC call's may
 * still be coming when its first attempt starts: asked again when the timer fires), not
 * marked as a retry, attempts and hedges left. */
static bool may_hedge(struct exchange *ex, bool body_now)
{
	const struct cfg_retry *rc = ex->retry;
	if (!rc->enabled || ex->req_nested || ex->req->upgrade ||
	    !atomic_load_explicit(&ex->st->runtime_enabled, memory_order_relaxed))
		return false;
	if ((ex->hedging && ex->hedging->sent >= rc->hedge_max_extra) ||
	    ex->attempts >= rc->max_attempts || (body_now && ex->rb.present && !ex->rb.done))
		return false;
	struct retry_facts f = { 0 };
	request_facts(ex, &f);
	return retry_may_replay(rc, &f);
}

bool ex_may_hedge(struct exchange *ex)
{
	return may_hedge(ex, true);
}

/* retry.hedge.after now: -1 none (a percentile over too few samples) */
int64_t ex_hedge_delay(struct exchange *ex, int64_t now)
{
	const struct cfg_retry *rc = ex->retry;
	if (!rc->hedge_pct)
		return rc->hedge_after_us;
	return latency_hist_pct(&ex->st->head_lat, now, rc->hedge_pct);
}

/* The next hedge's delay from NOW, or -1: the request may not be hedged, or a hedge `after`
 * from now no longer fits the deadline. */
static int64_t hedge_due(struct exchange *ex, int64_t now)
{
	if (!may_hedge(ex, false))
		return -1;
	int64_t d = ex_hedge_delay(ex, now);
	if (d <= 0 || now + d + ex->deadline->min_us > ex->deadline_us)
		return -1;
	return d;
}

static void hedge_timer_add(struct hedging *hg, int64_t d)
{
	struct timeval tv = clock_tv_early_ok(d);
	evtimer_add(&hg->ev, &tv);
}

/* ex->att is the attempt just started (no hedge runs beside it yet): its facts. */
static void hedge_att_facts(struct exchange *ex)
{
	struct hedging *hg = ex->hedging;
	hg->att_log = ex->log.cur;
	hg->att_num = ex->attempts;
	hg->att_hedge = hg->att_other_conn = false;
}

/* An attempt started at NOW: its hedge timer, when one is due. */
static void hedge_arm(struct exchange *ex, int64_t now)
{
	struct hedging *hg = ex->hedging;
	int64_t d = hedge_due(ex, now);
	if (d < 0)
		return;
	if (!hg) {
		hg = ex->hedging = xcalloc(1, sizeof(*hg));
		hedge_att_facts(ex);
		evtimer_assign(&hg->ev, ex->loop->base, ex->hedge_cb, ex);
		evtimer_assign(&hg->fault_ev, ex->loop->base, hedge_fault_cb, ex);
		ex->timers |= EX_T_HEDGE;
	}
	hedge_timer_add(hg, d);
}

/* A hedge goes to EP as T (its slots taken): counted as an attempt, marked in the log. It
 * draws its SPEC §11 fault as any attempt does: one that sends nothing (yet) waits on the
 * hedges' fault timer instead (hedge_fault_cb()). */
void ex_send_hedge(struct exchange *ex, struct ep_state *ep, bool other_conn, struct hedge_try *t)
{
	int64_t now = clock_now_us();
	ex->attempts++;
	ex->hedging->sent++;
	STAT_INC(ex->us->attempts);
	STAT_INC(ex->us->hedges);
	stats_window_add(ex->us, now, 0, 1);
	ex->tried |= 1ull << ep->index;
	upstream_ep_keep(&t->ep, ep);
	t->t0_us = now;
	t->num = ex->attempts;
	t->hedge = true;
	t->other_conn = other_conn;
	access_add_hedge(&ex->log, ep->name);
	t->log_idx = ex->log.cur;
	t->fault = ex_fault_draw(ex, now);
	if (t->fault) {
		STAT_INC(ex->us->faults_injected[t->fault->kind]);
		access_set_fault(&ex->log, faults_kind_name(t->fault->kind));
	}
	access_select(&ex->log, ex->hedging->att_log);
	if (t->fault && t->fault->kind != FAULT_LOST_RESPONSE) {
		t->fault_due_us = ex_fault_due(ex, t->fault, now, &t->fault_cut);
		ex_timer_assign(ex, &ex->fault_ev, EX_T_FAULT, fault_cb);  /* for its turn as ex->att */
		ex_hedge_fault_rearm(ex);
	} else {
		t->a = attempt_go(ex, ep, now, t->num, true, other_conn);
		reqbody_stream_to(&ex->rb, t->a);  /* a gRPC call's messages, all here (BODY_TEE) */
	}
	/* the next hedge, `after` this one */
	int64_t d = hedge_due(ex, now);
	if (d >= 0)
		hedge_timer_add(ex->hedging, d);
}

/* ------------------------------------------------------------------ the retry loop */

/* A retry's token from the shared bucket: none, the retry ends refused `budget` (SPEC §4). */
static void refuse_budget(struct exchange *ex)
{
	evtimer_del(&ex->backoff_ev);
	ex_release_slots(ex);
	ex->refused = RR_BUDGET;
	STAT_INC(ex->us->refused[RR_BUDGET]);
	ex_deliver_last(ex);
}

/* SPEC §4 rule 6: the retry was refused (retry-after) for EP's hold until HOLD, put there by
 * another answer, not for this one's hint: the log line and /stats say which endpoint and for
 * how long, since the response the client gets shows no reason to wait. */
static void refused_by_hold(struct exchange *ex, struct ep_state *ep, int64_t hold, int64_t now)
{
	upstream_ep_hold_refused(ep);
	access_set_held(&ex->log, ep->name, (hold - now) / 1000);
}

static void backoff_cb(evutil_socket_t fd, short what, void *arg)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state != X_BACKOFF)
		return;
	if (ex->bs_op) {
		ex->bs_due = true;      /* the shared bucket's answer goes on from here */
		return;
	}
	/* another request may have put a hold on the endpoint during our wait: rule 6 again */
	int64_t now = clock_now_us(), start;
	if (!upstream_ep_usable(ex->next_ep, ex->next_serial)) {
		/* its name no longer resolves to it: no new attempt there (SPEC §13) */
		upstream_ep_keep(&ex->next_ep, ex_choose_endpoint(ex, now, true));
		if (!ex->next_ep) {
			ex_release_slots(ex);
			ex_deliver_last(ex);
			return;
		}
		ex->next_serial = atomic_load(&ex->next_ep->serial);
	}
	int64_t hold = atomic_load(&ex->next_ep->hold_until_us);
	enum refusal r = retry_recheck_hold(ex->retry, ex->deadline, now, ex->deadline_us,
	                                    hold, &start);
	if (r == RR_NONE && start > now) {
		struct timeval tv = clock_tv(start - now);
		evtimer_add(&ex->backoff_ev, &tv);
		return;
	}
	if (r != RR_NONE) {
		if (r == RR_RETRY_AFTER)
			refused_by_hold(ex, ex->next_ep, hold, now);
		ex_release_slots(ex);
		ex->refused = r;
		STAT_INC(ex->us->refused[r]);
		ex_note_outage(ex, OUTAGE_REFUSALS, now);
		ex_deliver_last(ex);
		return;
	}
	start_attempt(ex, ex->next_ep, true);
}

/* The shared bucket answered the retry's question (or the local one stood in). */
static void shared_answer_cb(void *arg, bool granted)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	ex->bs_op = NULL;
	if (ex->state != X_BACKOFF)
		return;
	if (!granted)
		refuse_budget(ex);
	else if (ex->bs_due)
		backoff_cb(-1, 0, ex);
}

/* A's response (head H; NULL: none) is not relayed now: kept, in case no later attempt
 * produces one (SPEC §4); A goes on collecting its body. */
static void keep_response(struct exchange *ex, struct attempt *a, const struct http_head *h)
{
	if (h) {
		saved_keep(&ex->saved, h, a);   /* it goes on collecting the body */
		ex->saved.complete = a == NULL;     /* a fault's abort has no body to collect */
		if (ex->dec_trailers)
			saved_keep_trailers(&ex->saved, ex->dec_trailers, ex->dec_ntrailers);
		ex->saved.grpc_status = ex->att_grpc;
	} else {
		attempt_free(a);
	}
}

/* An attempt ended (OUT_STATUS: with head H) and its outcome is known: retry or deliver. */
void ex_decide(struct exchange *ex, enum outcome out, const struct http_head *h, bool bad)
{
	const struct cfg_retry *rc = ex->retry;
	int64_t now = clock_now_us();
	struct attempt *a = ex->att;
	ex->att = NULL;
	ex->last_out = out;
	ex->last_bad = bad;
	/* SPEC §14: one attempt's retryable end does not end the others; the last to end
	 * decides. Its response is kept meanwhile, as a retried one is. */
	if (ex->hedging && ex->hedging->n > 0) {
		keep_response(ex, a, h);
		ex_hedge_takeover(ex);
		return;
	}
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
			/* shared and in use, the token is Redis's to give: asked below */
			.tokens = ex->up->retry.budget_shared_host &&
			          budget_fleet_use_shared(&ex->st->fleet)
			          ? (double)ex->up->retry.budget_max_tokens
			          : budget_peek(&ex->st->budget, &ex->up->retry, now),
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
	/* SPEC §6, §4 rule 4: did the service say it did not take the request? */
	f.not_executed = idem_not_executed(&ex->up->idem, out, f.status, f.grpc ? f.grpc_status : -1);
	struct ep_state *next = ex_choose_endpoint(ex, now, true);
	int64_t hold = next ? atomic_load(&next->hold_until_us) : 0;
	f.hold_until_us = hold > now ? hold : 0;

	int64_t start = 0;
	/* an Upgrade request is tunnelled without retries (SPEC §8); no address: nowhere to go */
	enum refusal reason = ex->req->upgrade || !next
	                      ? RR_NOT_LISTED : retry_decide(rc, ex->deadline, &f, &start);
	if (reason == RR_NONE) {
		/* rule 7 passed over the snapshot: now take the slot, then the token (a token cannot
		 * be given back); another worker may have won the race meanwhile */
		bool slot = upstream_take_retry_slot(ex->st, ex->up->max_retries_in_flight);
		bool token = false;
		ex->bs_due = false;
		if (slot && ex->up->retry.budget_shared_host) {
			/* asked of Redis: the wait below goes on until the answer (bounded by
			 * connect_timeout), a refusal ends it as `budget`; in an outage the local
			 * bucket answers now */
			ex->bs_op = budget_shared_take(&(struct budget_shared_ctx)SHARED_CTX(ex),
			                               ex->up->connect_timeout_us, shared_answer_cb, ex,
			                               &token);
			token = token || ex->bs_op;
		} else {
			token = slot && budget_take(&ex->st->budget, &ex->up->retry, now);
		}
		if (slot && !token)
			upstream_release_retry_slot(ex->st);
		reason = retry_gate_taken(slot, token);
		ex->slot_retry = reason == RR_NONE;
	}
	if (out != OUT_STATUS || (h && h->status >= 500) || (f.grpc && outage_grpc_failure(f.grpc_status)))
		ex_note_outage(ex, OUTAGE_FAILURES, now);
	ex_log_decision(ex, out, h, f.grpc ? f.grpc_status : -1, reason, start - now);
	if (reason == RR_NONE) {
		/* the claim (SPEC §6) is released only if no attempt, this one included, may have run */
		ex->executed = ex->executed || !f.not_executed;
		keep_response(ex, a, h);
		upstream_ep_keep(&ex->next_ep, next);
		ex->next_serial = atomic_load(&next->serial);
		ex_set_state(ex, X_BACKOFF);
		struct timeval tv = clock_tv(start - now);
		ex_timer_assign(ex, &ex->backoff_ev, EX_T_BACKOFF, backoff_cb);
		evtimer_add(&ex->backoff_ev, &tv);
		return;
	}
	if (reason != RR_NOT_LISTED) {
		STAT_INC(ex->us->refused[reason]);
		ex->refused = reason;
		ex_note_outage(ex, OUTAGE_REFUSALS, now);
	}
	if (reason == RR_RETRY_AFTER && f.hold_until_us > 0 && !f.pushback_refuse &&
	    !(f.retry_after_us >= 0 && f.retry_after_us > rc->retry_after_max_us))
		refused_by_hold(ex, next, f.hold_until_us, now);
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

/* The request's first attempt (the body, or enough of it, is here; any claim was won). */
void ex_start_first(struct exchange *ex)
{
	start_attempt(ex, ex_choose_endpoint(ex, clock_now_us(), false), false);
}

/* An attempt's (A's; NULL: a fault's abort) response head H whose status is the outcome — for
 * a gRPC call with a grpc-status (ex->att_grpc), that status (SPEC §10), named by H or by the
 * trailers ex->dec_trailers: retried when retry.on lists it, else relayed (its Retry-After or
 * pushback may still set a hold). */
void ex_judge_status(struct exchange *ex, struct attempt *a, const struct http_head *h)
{
	bool grpc = ex->grpc && ex->att_grpc >= 0;
	if (grpc ? cfg_retry_on_grpc(ex->retry, ex->att_grpc)
	         : cfg_retry_on_status(ex->retry, h->status)) {
		ex_decide(ex, OUT_STATUS, h, false);
		return;
	}
	int64_t now = clock_now_us();
	/* not retried, but it may set a hold */
	if (grpc)
		ex_grpc_pushback_hold(ex, now);
	else
		ex_retry_after_hint(ex, h, now);
	if (h->status >= 500 || (grpc && outage_grpc_failure(ex->att_grpc)))
		ex_note_outage(ex, OUTAGE_FAILURES, now);
	ex_log_decision(ex, OUT_STATUS, h, grpc ? ex->att_grpc : -1, RR_NOT_LISTED, 0);
	if (!a && ex->hedging)
		ex_hedge_won(ex);      /* a fault's abort: ex->att's answer, though no attempt made it */
	ex_relay_from(ex, a, h, RR_NONE);
	if (ex->dec_trailers)
		ex_relay_trailers(ex, ex->dec_trailers, ex->dec_ntrailers);
	if (!a)
		ex_relay_complete(ex);     /* a fault's abort: the whole response was its head */
}

/* The fault wait is over: the delayed attempt goes out, or the fault is its outcome. */
static void fault_cb(evutil_socket_t fd, short what, void *arg)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state != X_FAULT_WAIT)
		return;
	const struct http_head *h = NULL;
	enum outcome out = ex_fault_outcome(ex, &h);
	if (out == OUT_NONE) {
		/* as what it started as: a hedge whose delay is over, or not */
		const struct hedging *hg = ex->hedging;
		ex_set_state(ex, X_ATTEMPT);
		if (hg)
			send_attempt(ex, ex->att_ep, hg->att_num, hg->att_hedge, hg->att_other_conn);
		else
			send_attempt(ex, ex->att_ep, ex->attempts, false, false);
	} else if (h) {
		ex_judge_status(ex, NULL, h);
	} else {
		ex_decide(ex, out, NULL, false);
	}
}

/* The hedges' fault timer: a hedge's fault wait is over. It takes ex->att's place (ex->att,
 * sent or in its own wait, runs on as one of the others) and its fault then amounts to what
 * ex->att's would: it goes out, or its outcome is judged (SPEC §11, §14). One per call: the
 * timer is set again for the next. */
static void hedge_fault_cb(evutil_socket_t fd, short what, void *arg)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state != X_ATTEMPT && ex->state != X_FAULT_WAIT)
		return;
	struct hedging *hg = ex->hedging;
	int64_t now = clock_now_us();
	for (int i = 0; i < hg->n; i++) {
		if (hg->o[i].fault_due_us && hg->o[i].fault_due_us <= now) {
			ex_hedge_swap(ex, &hg->o[i]);     /* X_FAULT_WAIT, its wait over */
			fault_cb(-1, 0, ex);
			if (ex->state == X_ATTEMPT || ex->state == X_FAULT_WAIT)
				ex_hedge_fault_rearm(ex);
			return;
		}
	}
	ex_hedge_fault_rearm(ex);
}
