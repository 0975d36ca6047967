/*
 * balance: the endpoint for an attempt (see balance.h).
 */
#include <stdatomic.h>
#include <stddef.h>

#include "balance.h"
#include "upstream.h"

struct ep_state *balance_pick(struct ep_state *const *eps, int n, uint64_t start, uint64_t tried,
                              int64_t now_us, bool retry)
{
	struct ep_state *best = NULL;
	int best_rank = 0;
	int64_t best_hold = 0;
	for (int i = 0; i < n; i++) {
		struct ep_state *ep = eps[(start + (uint64_t)i) % (uint64_t)n];
		int64_t hold = atomic_load_explicit(&ep->hold_until_us, memory_order_relaxed);
		bool held = retry && hold > now_us;
		bool was_tried = (tried >> ep->index) & 1;
		int rank = (held ? 2 : 0) + (was_tried ? 1 : 0);
		if (!best || rank < best_rank || (held && rank == best_rank && hold < best_hold)) {
			best = ep;
			best_rank = rank;
			best_hold = hold;
		}
	}
	return best;
}
