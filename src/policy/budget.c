/*
 * budget: the retry token bucket of SPEC §4, shared lock-free by every worker.
 *
 * Invariant: over any interval of length t, successful takes <= max_tokens
 * + ratio * deposits + min_per_second * t (plus sub-token rounding). What keeps it:
 *  - every change of `tokens` is one CAS that also applies the cap (max_tokens * BUDGET_ONE,
 *    read from the current policy, so a reload that lowers max_tokens clamps on next use);
 *  - time is credited lazily, and each stretch of time at most once: a caller first claims
 *    [refill_us, t) by a CAS on refill_us, then adds what that stretch earned;
 *  - that credit is also capped by the room the bucket had *before* the claim, so takes that
 *    race between the claim and the add cannot draw the credit of a long idle stretch on
 *    top of the tokens that were already there (after an idle hour, a burst of concurrent
 *    retries gets max_tokens, not the leftover plus a full bucket).
 * The only slack is time credited while another caller sits between its claim and its add:
 * that credit arrives late, never twice, and is paid for by real elapsed time.
 * Policy numbers come with every call; the struct holds only the state.
 */
#include "policy/budget.h"

#include <math.h>

static int64_t cap_of(const struct cfg_retry *r)
{
	if (r->budget_max_tokens <= 0)
		return 0;
	if (r->budget_max_tokens > INT64_MAX / BUDGET_ONE)
		return INT64_MAX;
	return r->budget_max_tokens * BUDGET_ONE;
}

/* tokens = min(tokens + delta, cap) for delta >= 0, in one CAS; a level above cap (after a
 * reload lowered max_tokens) comes down to cap. */
static void tokens_add(struct budget *b, int64_t delta, int64_t cap)
{
	int64_t cur = atomic_load(&b->tokens);
	for (;;) {
		int64_t next = cur > cap - delta ? cap : cur + delta;
		if (next == cur)
			return;
		if (atomic_compare_exchange_weak(&b->tokens, &cur, next))
			return;
	}
}

/* What the stretch [LAST, NOW) earns at min_per_second into ROOM free units: the credit in
 * units, and in *paid_to the time up to which that credit is paid for (LAST: nothing earned
 * yet, keep the time for later). Pure: refill() applies it, budget_peek() only reads it. */
static int64_t refill_credit(const struct cfg_retry *r, int64_t last, int64_t now_us,
                             int64_t room, int64_t *paid_to)
{
	int64_t dt;
	if (__builtin_sub_overflow(now_us, last, &dt))
		dt = INT64_MAX;
	double rate = r->budget_min_per_second;     /* tokens/s = BUDGET_ONE units per µs */
	*paid_to = now_us;  /* by default the whole interval is used up */
	if (rate <= 0 || room <= 0)
		return 0;
	double earned = (double)dt * rate;
	if (earned >= (double)room)
		return room;    /* the bucket fills up: the rest of the interval is worth nothing,
		                 * as time always is while a bucket is full */
	int64_t credit = (int64_t)earned;   /* floor: never credit more than earned */
	/* charge only the time this whole-unit credit is worth and keep the remainder for
	 * later, or a fractional rate called often would never earn anything */
	double paid = ceil((double)credit / rate);
	if (paid < (double)dt)
		*paid_to = last + (int64_t)paid;
	return credit;
}

/* Credit min_per_second tokens per second for the time since refill_us, up to NOW. */
static void refill(struct budget *b, const struct cfg_retry *r, int64_t now_us, int64_t cap)
{
	int64_t last = atomic_load(&b->refill_us);
	if (now_us <= last)
		return;     /* nothing new, or another worker's clock read is ahead of ours */
	/* the room is read before the claim: takes between here and the add only make it an
	 * overestimate of the level, i.e. the credit an underestimate, never the reverse */
	int64_t before = atomic_load(&b->tokens);
	int64_t paid_to;
	int64_t credit = refill_credit(r, last, now_us, before < cap ? cap - before : 0, &paid_to);
	if (paid_to == last)
		return;     /* less than one unit earned yet: leave the time for a later call */
	/* claim [last, paid_to): only one caller can move refill_us from LAST, so no interval
	 * is credited twice */
	if (!atomic_compare_exchange_strong(&b->refill_us, &last, paid_to))
		return;
	if (credit > 0)
		tokens_add(b, credit, cap);
}

void budget_init(struct budget *b, const struct cfg_retry *r, int64_t now_us)
{
	atomic_init(&b->tokens, cap_of(r));
	atomic_init(&b->refill_us, now_us);
}

void budget_deposit(struct budget *b, const struct cfg_retry *r, int64_t now_us)
{
	int64_t cap = cap_of(r);
	refill(b, r, now_us, cap);
	double add = r->budget_ratio * (double)BUDGET_ONE;
	/* rounded, not floored: 0.2 * 1e6 is 199999.99999999997 in binary */
	int64_t units = add > 0 ? (add >= (double)cap ? cap : llround(add)) : 0;
	tokens_add(b, units, cap);
}

bool budget_take(struct budget *b, const struct cfg_retry *r, int64_t now_us)
{
	int64_t cap = cap_of(r);
	refill(b, r, now_us, cap);
	int64_t cur = atomic_load(&b->tokens);
	for (;;) {
		int64_t avail = cur < cap ? cur : cap;
		if (avail < BUDGET_ONE) {
			if (cur != avail)   /* clamp a level left above a lowered cap */
				atomic_compare_exchange_strong(&b->tokens, &cur, avail);
			return false;
		}
		if (atomic_compare_exchange_weak(&b->tokens, &cur, avail - BUDGET_ONE))
			return true;
	}
}

double budget_tokens(struct budget *b, const struct cfg_retry *r, int64_t now_us)
{
	int64_t cap = cap_of(r);
	refill(b, r, now_us, cap);
	tokens_add(b, 0, cap);
	int64_t cur = atomic_load(&b->tokens);
	return (double)(cur < cap ? cur : cap) / (double)BUDGET_ONE;
}

double budget_peek(const struct budget *b, const struct cfg_retry *r, int64_t now_us)
{
	int64_t cap = cap_of(r);
	int64_t last = atomic_load(&b->refill_us);
	int64_t cur = atomic_load(&b->tokens);
	int64_t level = cur < cap ? cur : cap;
	if (now_us > last) {
		int64_t paid_to;
		level += refill_credit(r, last, now_us, cap - level, &paid_to);
	}
	return (double)level / (double)BUDGET_ONE;
}

/* ------------------------------------------------------------------ the fleet's bucket */

void budget_fleet_init(struct budget_fleet *f)
{
	atomic_init(&f->pending, 0);
	atomic_init(&f->batch_us, INT64_MIN / 2);
	atomic_init(&f->level, -1);
	atomic_init(&f->down_us, 0);
}

bool budget_fleet_credit(struct budget_fleet *f, int64_t now_us)
{
	atomic_fetch_add_explicit(&f->pending, 1, memory_order_relaxed);
	int64_t last = atomic_load_explicit(&f->batch_us, memory_order_relaxed);
	if (now_us - last < BUDGET_BATCH_US)
		return false;   /* the common case: one load, one add */
	/* one caller per interval wins the CAS; the others' counts ride with its batch */
	return atomic_compare_exchange_strong(&f->batch_us, &last, now_us);
}

int64_t budget_fleet_take_pending(struct budget_fleet *f)
{
	return atomic_exchange(&f->pending, 0);
}

void budget_fleet_return_pending(struct budget_fleet *f, int64_t n)
{
	if (n > 0)
		atomic_fetch_add(&f->pending, n);
}

bool budget_fleet_use_shared(const struct budget_fleet *f)
{
	return atomic_load_explicit(&f->down_us, memory_order_relaxed) == 0;
}

bool budget_fleet_answered(struct budget_fleet *f, int64_t level)
{
	atomic_store(&f->level, level < 0 ? 0 : level);
	return atomic_exchange(&f->down_us, 0) != 0;
}

bool budget_fleet_failed(struct budget_fleet *f, int64_t now_us)
{
	int64_t none = 0;
	return atomic_compare_exchange_strong(&f->down_us, &none, now_us ? now_us : 1);
}
