/*
 * balance: which endpoint address an attempt goes to (SPEC §13, §4 rule 6). A first attempt
 * goes to an endpoint not ejected, by the upstream's mode (round-robin, least-request: the
 * less loaded of two drawn at random, random) and ignores holds (it is the caller's own
 * traffic, not amplification); when all are ejected, to the one whose ejection ends first. A
 * retry ranks not ejected before ejected, then unheld before held, then not yet tried before
 * tried, then the ejection or hold that ends first, ties in round-robin order. Pure.
 */
#ifndef RG_BALANCE_H
#define RG_BALANCE_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"

/* One candidate as read now. */
struct balance_view {
	int64_t eject_until_us;     /* > now: ejected (INT64_MAX: until probes say healthy) */
	int64_t hold_until_us;      /* > now: held */
	int in_flight;
	bool tried;
};

/* The index in V[0..N) (1 <= N <= CFG_MAX_ENDPOINTS) of the endpoint to use. RR: the round-robin position (only
 * first attempts advance it; a retry passes its current value); RND: random bits. */
int balance_choose(const struct balance_view *v, int n, enum balance_mode mode, bool retry,
                   uint64_t rr, uint64_t rnd, int64_t now_us);

#endif
