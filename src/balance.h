/*
 * balance: which endpoint an attempt goes to. A first attempt goes round-robin and ignores
 * holds (it is the caller's own traffic, not amplification); a retry follows SPEC §4 rule 6:
 * unheld before held, then not yet tried before tried, then the hold that ends first, ties in
 * round-robin order. Pure over the holds as read now.
 */
#ifndef RG_BALANCE_H
#define RG_BALANCE_H

#include <stdbool.h>
#include <stdint.h>

struct ep_state;

/* EPS[0..N) (N >= 1); START: the round-robin position; TRIED: bit i set when the endpoint of
 * index i (ep_state.index) was tried by this request. */
struct ep_state *balance_pick(struct ep_state *const *eps, int n, uint64_t start, uint64_t tried,
                              int64_t now_us, bool retry);

#endif
