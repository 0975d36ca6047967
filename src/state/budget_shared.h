/*
 * budget_shared: the retry budget of SPEC §4 when budget.shared names a Redis — one bucket,
 * key "retrygate:budget:UPSTREAM", for every retrygate naming the same Redis and upstream.
 *
 * No Redis call per request: first attempts are counted (policy/budget.h, struct
 * budget_fleet) and go to Redis as one batch at most every BUDGET_BATCH_US per process. A
 * retry asks Redis for its token (one script: refill by the server's clock, credit, cap,
 * take) and its caller waits for the answer, never longer than the upstream's
 * connect_timeout. A failed, timed-out or late answer switches the upstream to the local
 * bucket (kept credited all along, so it is ready at once): the retry is answered from it,
 * the outage is logged once and every such call counted; the next answer from Redis (a batch
 * goes on trying it) switches back.
 *
 * Threads: call on a worker's loop; the links are per (Redis, event_base), like the
 * idempotency store's. budget_shared_release_base() at the worker's exit.
 */
#ifndef RG_BUDGET_SHARED_H
#define RG_BUDGET_SHARED_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"

struct event_base;
struct loop;
struct runtime;
struct upstream_state;
struct ustats;
struct budget_shared_op;

/* The answer to a retry's question: GRANTED, a token was taken. */
typedef void (*budget_shared_fn)(void *arg, bool granted);

/* What every call names: the upstream's state, its policy R (its budget.shared set), the
 * runtime RT they come from (referenced while a call is in Redis, so the state outlives it),
 * and the worker's counters US. */
struct budget_shared_ctx {
	struct loop *loop;
	struct runtime *rt;
	struct upstream_state *st;
	const struct cfg_retry *r;
	const char *upstream;
	struct ustats *us;
};

/* A first attempt at NOW (the caller credited the local bucket): counted, and the batch sent
 * when one is due. */
void budget_shared_credit(const struct budget_shared_ctx *c, int64_t now_us);
/* A retry's token. In an outage the local bucket answers at once: NULL, with *GRANTED. Else
 * the question is in Redis: FN(ARG, granted) runs later from the loop, exactly once unless
 * cancelled, within TIMEOUT_US. */
struct budget_shared_op *budget_shared_take(const struct budget_shared_ctx *c, int64_t timeout_us,
                                            budget_shared_fn fn, void *arg, bool *granted);
/* FN will not run. */
void budget_shared_cancel(struct budget_shared_op *op);
/* The worker owning BASE is ending: its links go (calls in flight end). */
void budget_shared_release_base(struct event_base *base);

#endif
