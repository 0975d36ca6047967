/*
 * gate: a count with a cap that workers take and give back without a lock (an upstream's
 * max_in_flight and max_retries_in_flight, SPEC §4). Invariant: a take that returned true is
 * released exactly once; the count then never exceeds the cap it was taken under.
 */
#ifndef RG_GATE_H
#define RG_GATE_H

#include <stdatomic.h>
#include <stdbool.h>

/* One more in N unless that would pass CAP: true if taken. */
static inline bool gate_take(_Atomic int *n, int cap)
{
	int cur = atomic_load_explicit(n, memory_order_relaxed);
	do {
		if (cur >= cap)
			return false;
	} while (!atomic_compare_exchange_weak(n, &cur, cur + 1));
	return true;
}

static inline void gate_release(_Atomic int *n)
{
	atomic_fetch_sub(n, 1);
}

#endif
