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

/* SPEC §4 budget.shared: what one process knows of the fleet's bucket in Redis, shared by its
 * workers (the Redis calls themselves are state/budget_shared.c's). Pure bookkeeping on
 * atomics: which bucket a retry uses, when the first attempts counted so far go to Redis as
 * one batch, and the outage (fallback to the local bucket) and its end. */
#define BUDGET_BATCH_US     100000      /* at most one batch of credits per interval */
#define BUDGET_PROBE_US     1000000     /* in an outage, Redis is tried at least this often: the
                                         * link's longest reconnect backoff */

struct budget_fleet {
	_Atomic int64_t pending;        /* first attempts not yet credited to Redis */
	_Atomic int64_t batch_us;       /* when the last batch was claimed */
	_Atomic int64_t level;          /* the level Redis last answered, BUDGET_ONE units; -1:
	                                 * none yet */
	_Atomic int64_t down_us;        /* 0: the shared bucket is in use; else the outage began
	                                 * then (never 0 itself) and the local bucket is in use */
};

void budget_fleet_init(struct budget_fleet *f);
/* A first attempt at NOW: counted; true when the caller is to send the batch now (one caller
 * per BUDGET_BATCH_US in the process), whose count it takes with budget_fleet_take_pending().
 * In an outage the batches go on: each one tries Redis, and its answer ends the outage. */
bool budget_fleet_credit(struct budget_fleet *f, int64_t now_us);
/* The first attempts counted and not yet sent: now the caller's to send (0 and up). */
int64_t budget_fleet_take_pending(struct budget_fleet *f);
/* A batch that did not reach Redis: its count is owed again. */
void budget_fleet_return_pending(struct budget_fleet *f, int64_t n);
/* Whether a retry at NOW asks Redis (true) or takes from the local bucket (false: in an
 * outage). */
bool budget_fleet_use_shared(const struct budget_fleet *f);
/* Redis answered with LEVEL (BUDGET_ONE units): the shared bucket is in use again. True when
 * this ended an outage (log it). */
bool budget_fleet_answered(struct budget_fleet *f, int64_t level);
/* A Redis call failed or timed out at NOW: the local bucket is in use. True when this began an
 * outage (log it, once). */
bool budget_fleet_failed(struct budget_fleet *f, int64_t now_us);

#endif
