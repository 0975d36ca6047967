/*
 * balance: the endpoint for an attempt (see balance.h).
 */
#include <stddef.h>

#include "policy/balance.h"

static int first_attempt(const struct balance_view *v, int n, enum balance_mode mode,
                         uint64_t rr, uint64_t rnd, int64_t now_us)
{
	int up[CFG_MAX_ENDPOINTS], m = 0, soonest = 0;
	for (int i = 0; i < n && i < CFG_MAX_ENDPOINTS; i++) {
		if (v[i].eject_until_us <= now_us)
			up[m++] = i;
		else if (v[i].eject_until_us < v[soonest].eject_until_us)
			soonest = i;
	}
	if (m == 0)
		return soonest;     /* health never turns an upstream off */
	switch (mode) {
	case BAL_RANDOM:
		return up[rnd % (uint64_t)m];
	case BAL_LEAST_REQUEST: {
		if (m == 1)
			return up[0];
		int a = (int)(rnd % (uint64_t)m);
		int b = (int)((rnd >> 32) % (uint64_t)(m - 1));
		if (b >= a)
			b++;            /* two distinct draws */
		return v[up[b]].in_flight < v[up[a]].in_flight ? up[b] : up[a];
	}
	case BAL_ROUND_ROBIN:
	default:
		return up[rr % (uint64_t)m];
	}
}

int balance_choose(const struct balance_view *v, int n, enum balance_mode mode, bool retry,
                   uint64_t rr, uint64_t rnd, int64_t now_us)
{
	if (!retry)
		return first_attempt(v, n, mode, rr, rnd, now_us);
	int best = -1, best_rank = 0;
	int64_t best_end = 0;
	for (int k = 0; k < n; k++) {
		int i = (int)((rr + (uint64_t)k) % (uint64_t)n);
		bool ejected = v[i].eject_until_us > now_us;
		bool held = v[i].hold_until_us > now_us;
		int rank = (ejected ? 4 : 0) + (held ? 2 : 0) + (v[i].tried ? 1 : 0);
		/* among ejected ones the ejection that ends first, among held ones the hold */
		int64_t end = ejected ? v[i].eject_until_us : held ? v[i].hold_until_us : 0;
		if (best < 0 || rank < best_rank || (rank == best_rank && end < best_end)) {
			best = i;
			best_rank = rank;
			best_end = end;
		}
	}
	return best;
}
