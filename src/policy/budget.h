/*
 * budget: the per-upstream retry token bucket of SPEC §4, shared by all workers.
 * Lock-free: tokens are fixed-point (BUDGET_ONE units per token) in one atomic, refilled
 * lazily from the monotonic clock on every use. Policy numbers are passed in on each call, so
 * a reload changes them without touching the state.
 */
#ifndef RG_BUDGET_H
#define RG_BUDGET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"

#define BUDGET_ONE 1000000LL

struct budget {
	_Atomic int64_t tokens;     /* in 1/BUDGET_ONE tokens */
	_Atomic int64_t refill_us;  /* monotonic time up to which time-refill was credited */
};

/* Start full: max_tokens. */
void budget_init(struct budget *b, const struct cfg_retry *r, int64_t now_us);
/* A first attempt: adds ratio tokens (capped at max_tokens). */
void budget_deposit(struct budget *b, const struct cfg_retry *r, int64_t now_us);
/* A retry: takes one whole token if there is one. */
bool budget_take(struct budget *b, const struct cfg_retry *r, int64_t now_us);
/* Current tokens (after refill), for the gauge. Refills and clamps the shared state. */
double budget_tokens(struct budget *b, const struct cfg_retry *r, int64_t now_us);
/* The same figure without writing anything: the level plus what the time up to NOW would
 * credit. For the rule-7 snapshot of retry_decide(); a yes from it reserves nothing, the
 * token is still budget_take()'s. */
double budget_peek(const struct budget *b, const struct cfg_retry *r, int64_t now_us);

#endif
