/*
 * exchange_hedge: SPEC §14 hedging (see exchange_impl.h). An attempt still without a head
 * `after` its start is joined by another (a hedge), which takes a budget token and a
 * retries-in-flight slot like a retry, and an in-flight slot when sent. The attempts run side
 * by side: ex->att is one of them, ex->hedging->o[] the others. Whichever gets a head first
 * trades places with ex->att and is judged as any attempt is; a response that is relayed
 * cancels the others (exchange_core.c, on entering X_RELAY); a retryable end hands ex->att
 * to one still running (ex_hedge_takeover()), so that the last to end decides as §4 says.
 * Calls go down only: to exchange_retry.c and exchange_core.c.
 */
#include <event2/event.h>

#include "base/clock.h"
#include "base/util.h"
#include "obs/accesslog.h"
#include "obs/stats.h"
#include "policy/retry.h"
#include "proxy/exchange_impl.h"
#include "state/upstream.h"
#include "upstream/attempt.h"

/* The hedge timer: ex->att still has no head. */
void ex_hedge_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	struct hedging *hg = ex->hedging;
	/* a head arrived (X_HELD, X_RELAY), or a fault's wait: no hedge */
	if (ex->state != X_ATTEMPT || !ex->att || hg->n >= HEDGE_MAX_EXTRA || !ex_may_hedge(ex))
		return;
	int64_t now = clock_now_us();
	if (ex->deadline_us - now < ex->deadline->min_us || ex->deadline_us - now < 1000)
		return;
	/* a retry's choice: not ejected, not held, untried first; a tried one over another
	 * connection; none usable: no hedge (not a refusal) */
	struct ep_state *ep = ex_choose_endpoint(ex, now, true);
	if (!ep || atomic_load(&ep->hold_until_us) > now ||
	    atomic_load(&ep->eject_until_us) > now || atomic_load(&ep->probe_down))
		return;
	bool other_conn = (ex->tried >> ep->index) & 1;
	enum refusal r = ex_take_retry_gates(ex, now);
	if (r == RR_NONE && !upstream_take_in_flight(ex->st, ex->up->max_in_flight)) {
		upstream_release_retry_slot(ex->st);
		r = RR_RETRIES_IN_FLIGHT;
	}
	if (r != RR_NONE) {
		/* counted, but the response says nothing: the request was not refused anything */
		STAT_INC(ex->us->refused[r]);
		return;
	}
	struct hedge_try *t = &hg->o[hg->n++];
	*t = (struct hedge_try){ .slot_in_flight = true, .slot_retry = true };
	ex_send_hedge(ex, ep, other_conn, t);
}

static int find(const struct exchange *ex, const struct attempt *a)
{
	const struct hedging *hg = ex->hedging;
	for (int i = 0; hg && i < hg->n; i++)
		if (hg->o[i].a == a)
			return i;
	return -1;
}

/* A head H of A, not ex->att: true when A is now ex->att and H is judged as its head. */
bool ex_hedge_head(struct exchange *ex, struct attempt *a, const struct http_head *h)
{
	int i = find(ex, a);
	if (i < 0 || (h->status >= 100 && h->status < 200 && h->status != 101))
		return false;   /* 1xx of an attempt not (yet) chosen: nobody waits for it */
	if (ex->state != X_ATTEMPT) {
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
	if (ex->state != X_ATTEMPT) {
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
