/*
 * exchange_hedge: SPEC §14 hedging (see exchange_impl.h). An attempt still without a head
 * `after` its start is joined by another (a hedge), which takes a budget token and a
 * retries-in-flight slot like a retry, and an in-flight slot when sent. The attempts run side
 * by side: ex->att is one of them, ex->hedging->o[] the others. With budget.shared the token
 * is Redis's to give: the hedge goes when it answers. Whichever gets a head first
 * trades places with ex->att and is judged as any attempt is; a response that is relayed
 * cancels the others (exchange_core.c, on entering X_RELAY); a retryable end hands ex->att
 * to one still running (ex_hedge_takeover()), so that the last to end decides as §4 says.
 * A hedge draws its SPEC §11 fault as any attempt does (ex_send_hedge()), and ex->att still in
 * its fault's wait (X_FAULT_WAIT: a delay) is hedged as one sent.
 * Calls go down only: to exchange_retry.c and exchange_core.c.
 */
#include <event2/event.h>

#include "base/clock.h"
#include "base/util.h"
#include "obs/accesslog.h"
#include "obs/stats.h"
#include "policy/retry.h"
#include "proxy/exchange_impl.h"
#include "policy/budget.h"
#include "state/budget_shared.h"
#include "state/upstream.h"
#include "upstream/attempt.h"

/* A hedge not sent for want of a token or a slot: counted, but the response says nothing
 * (the request was refused nothing). */
static void refused(struct exchange *ex, enum refusal r)
{
	STAT_INC(ex->us->refused[r]);
}

/* Where a hedge may go now: a retry's choice among endpoints not ejected and not held,
 * untried first, else a tried one (over another connection); NULL: nowhere, no hedge. */
static struct ep_state *hedge_endpoint(struct exchange *ex, int64_t now)
{
	struct ep_state *ep = ex_choose_endpoint(ex, now, true);
	if (!ep || atomic_load(&ep->hold_until_us) > now ||
	    atomic_load(&ep->eject_until_us) > now || atomic_load(&ep->probe_down))
		return NULL;
	return ep;
}

/* Its retries-in-flight slot and token in hand: the hedge goes to EP with a max_in_flight
 * slot, or is refused. */
static void hedge_send(struct exchange *ex, struct ep_state *ep)
{
	struct hedging *hg = ex->hedging;
	if (!upstream_take_in_flight(ex->st, ex->up->max_in_flight)) {
		upstream_release_retry_slot(ex->st);
		refused(ex, RR_RETRIES_IN_FLIGHT);
		return;
	}
	struct hedge_try *t = &hg->o[hg->n++];
	*t = (struct hedge_try){ .slot_in_flight = true, .slot_retry = true };
	ex_send_hedge(ex, ep, (ex->tried >> ep->index) & 1, t);
}

/* May a hedge go now (ex->att still without a head, or not sent yet for its fault's delay;
 * the deadline not too close)? */
static bool hedge_due(struct exchange *ex, int64_t now)
{
	return ((ex->state == X_ATTEMPT && ex->att) || ex->state == X_FAULT_WAIT) &&
	       ex->hedging->n < HEDGE_MAX_EXTRA &&
	       ex_may_hedge(ex) && ex->deadline_us - now >= ex->deadline->min_us &&
	       ex->deadline_us - now >= 1000;
}

/* budget.shared answered the hedge's token question (or the local bucket stood in). */
static void shared_token_cb(void *arg, bool granted)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	int64_t now = clock_now_us();
	struct ep_state *ep;
	ex->hedging->bs_op = NULL;
	if (!granted) {
		upstream_release_retry_slot(ex->st);
		refused(ex, RR_BUDGET);
	} else if (!hedge_due(ex, now) || !(ep = hedge_endpoint(ex, now))) {
		upstream_release_retry_slot(ex->st);     /* a head came meanwhile: too late */
	} else {
		hedge_send(ex, ep);
	}
}

/* The hedge timer: ex->att still has no head (SPEC §14). The slot, then the token (a token
 * cannot be given back), as for a retry (SPEC §4 rule 7), once every other rule passed. */
void ex_hedge_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	struct hedging *hg = ex->hedging;
	int64_t now = clock_now_us();
	/* a head arrived (X_HELD, X_RELAY), a token still asked: no hedge */
	if (hg->bs_op || !hedge_due(ex, now))
		return;
	struct ep_state *ep = hedge_endpoint(ex, now);
	if (!ep)
		return;
	if (!upstream_take_retry_slot(ex->st, ex->up->max_retries_in_flight)) {
		refused(ex, RR_RETRIES_IN_FLIGHT);
		return;
	}
	bool token = false;
	if (ex->up->retry.budget_shared_host) {
		/* asked of Redis (bounded by connect_timeout); in an outage the local bucket
		 * answers now */
		hg->bs_op = budget_shared_take(&(struct budget_shared_ctx)SHARED_CTX(ex),
		                               ex->up->connect_timeout_us, shared_token_cb, ex, &token);
		if (hg->bs_op)
			return;
	} else {
		token = budget_take(&ex->st->budget, &ex->up->retry, now);
	}
	if (!token) {
		upstream_release_retry_slot(ex->st);
		refused(ex, RR_BUDGET);
		return;
	}
	hedge_send(ex, ep);
}

static int find(const struct exchange *ex, const struct attempt *a)
{
	const struct hedging *hg = ex->hedging;
	for (int i = 0; hg && i < hg->n; i++)
		if (hg->o[i].a == a)
			return i;
	return -1;
}

/* Is ex->att's place open to the others' news: ex->att sent (X_ATTEMPT) or its fault's wait
 * (X_FAULT_WAIT: it goes on as the other's, ex_hedge_swap())? */
static bool may_swap(const struct exchange *ex)
{
	return ex->state == X_ATTEMPT || ex->state == X_FAULT_WAIT;
}

/* A head H of A, not ex->att: true when A is now ex->att and H is judged as its head. */
bool ex_hedge_head(struct exchange *ex, struct attempt *a, const struct http_head *h)
{
	int i = find(ex, a);
	if (i < 0 || (h->status >= 100 && h->status < 200 && h->status != 101))
		return false;   /* 1xx of an attempt not (yet) chosen: nobody waits for it */
	if (!may_swap(ex)) {
		/* ex->att's gRPC head is held (X_HELD): its call goes on, this one is cancelled */
		ex_hedge_drop(ex, i);
		return false;
	}
	ex_hedge_swap(ex, &ex->hedging->o[i]);
	return true;
}

/* A, not ex->att, ended with OUT before any head: true when A is now ex->att and its end is
 * judged (ex_decide() hands ex->att on to the one still running). */
bool ex_hedge_end(struct exchange *ex, struct attempt *a, enum outcome out)
{
	int i = find(ex, a);
	if (i < 0)
		return false;
	if (!may_swap(ex)) {
		STAT_INC(ex->us->outcomes[out]);
		access_select(&ex->log, ex->hedging->o[i].log_idx);
		access_set_outcome(&ex->log, outcome_name(out));
		access_select(&ex->log, ex->hedging->att_log);
		ex_hedge_drop(ex, i);
		return false;
	}
	ex_hedge_swap(ex, &ex->hedging->o[i]);
	return true;
}
