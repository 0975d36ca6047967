/*
 * test_budget: the SPEC §4 retry budget. It starts full with max_tokens; every first attempt
 * adds ratio tokens; time adds min_per_second tokens per second; it never holds more than
 * max_tokens; a retry takes one whole token or does not happen. So over any interval of
 * length t: retries <= max_tokens + ratio * (first attempts) + min_per_second * t, which the
 * threaded tests check with several workers hammering one bucket under a fake clock. A peek
 * (the rule-7 snapshot) reads the same figure and writes nothing.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "policy/budget.h"

#define MS 1000LL
#define S  1000000LL

static struct cfg_retry policy(double ratio, double min_per_second, int64_t max_tokens)
{
	struct cfg_retry r;
	memset(&r, 0, sizeof(r));
	r.enabled = true;
	r.max_attempts = 3;
	r.budget_ratio = ratio;
	r.budget_min_per_second = min_per_second;
	r.budget_max_tokens = max_tokens;
	return r;
}

static int take_all(struct budget *b, const struct cfg_retry *r, int64_t now)
{
	int n = 0;
	while (budget_take(b, r, now))
		n++;
	return n;
}

static void test_starts_full_and_empties(void **state)
{
	struct cfg_retry r = policy(0.2, 10, 100);
	struct budget b;
	budget_init(&b, &r, 5 * S);
	assert_true(budget_tokens(&b, &r, 5 * S) == 100.0);
	/* with the clock standing still, exactly max_tokens retries, then none */
	assert_int_equal(take_all(&b, &r, 5 * S), 100);
	assert_false(budget_take(&b, &r, 5 * S));
	assert_true(budget_tokens(&b, &r, 5 * S) == 0.0);
}

static void test_deposit_adds_ratio(void **state)
{
	struct cfg_retry r = policy(0.2, 0, 100);
	struct budget b;
	budget_init(&b, &r, 0);
	take_all(&b, &r, 0);
	/* 4 first attempts give 0.8 of a token: no retry */
	for (int i = 0; i < 4; i++)
		budget_deposit(&b, &r, 0);
	assert_false(budget_take(&b, &r, 0));
	/* the 5th makes a whole token: one retry */
	budget_deposit(&b, &r, 0);
	assert_true(budget_take(&b, &r, 0));
	assert_false(budget_take(&b, &r, 0));
	/* 1000 first attempts at ratio 0.2: 200 tokens earned, but the bucket holds 100 */
	for (int i = 0; i < 1000; i++)
		budget_deposit(&b, &r, 0);
	assert_true(budget_tokens(&b, &r, 0) == 100.0);
	assert_int_equal(take_all(&b, &r, 0), 100);
}

static void test_time_refill(void **state)
{
	struct cfg_retry r = policy(0, 10, 100);
	struct budget b;
	budget_init(&b, &r, 0);
	take_all(&b, &r, 0);
	/* 10 per second: 100 ms is one token */
	assert_false(budget_take(&b, &r, 99 * MS));
	assert_true(budget_take(&b, &r, 100 * MS));
	assert_false(budget_take(&b, &r, 100 * MS));
	/* half a token, then the other half */
	assert_false(budget_take(&b, &r, 150 * MS));
	assert_true(budget_take(&b, &r, 200 * MS));
	/* 2 s give 20 tokens */
	assert_int_equal(take_all(&b, &r, 2200 * MS), 20);
	/* an hour gives max_tokens, not 36000 */
	assert_int_equal(take_all(&b, &r, 3600 * S), 100);
}

/* Time credited while the bucket is full is lost, as in any token bucket: a full bucket
 * left alone for a minute still holds max_tokens, and refills from there. */
static void test_time_while_full_is_not_banked(void **state)
{
	struct cfg_retry r = policy(0, 10, 5);
	struct budget b;
	budget_init(&b, &r, 0);
	assert_true(budget_tokens(&b, &r, 60 * S) == 5.0);
	assert_int_equal(take_all(&b, &r, 60 * S), 5);
	assert_false(budget_take(&b, &r, 60 * S + 99 * MS));
	assert_true(budget_take(&b, &r, 60 * S + 100 * MS));
}

/* A fractional rate called very often must still earn: 0.5 token/s over 2 s, looked at every
 * 3 µs, is one token. */
static void test_fractional_rate_called_often(void **state)
{
	struct cfg_retry r = policy(0, 0.5, 10);
	struct budget b;
	budget_init(&b, &r, 0);
	take_all(&b, &r, 0);
	int64_t t = 0;
	int got = 0;
	for (; t < 2 * S - 3; t += 3)
		got += budget_take(&b, &r, t);
	assert_int_equal(got, 0);
	assert_true(budget_take(&b, &r, 2 * S));
	assert_false(budget_take(&b, &r, 2 * S));
}

/* A reload may lower max_tokens: the level is clamped on next use. Raising it again does not
 * conjure tokens: they come back with time and deposits. */
static void test_reload_changes_max_tokens(void **state)
{
	struct cfg_retry big = policy(0.2, 10, 100);
	struct cfg_retry small = policy(0.2, 10, 10);
	struct budget b;
	budget_init(&b, &big, 0);
	assert_true(budget_tokens(&b, &small, 0) == 10.0);
	assert_int_equal(take_all(&b, &small, 0), 10);
	assert_int_equal(take_all(&b, &big, 0), 0);
	assert_int_equal(take_all(&b, &big, 1 * S), 10);
	/* a take under a lowered cap clamps too */
	budget_init(&b, &big, 0);
	assert_true(budget_take(&b, &small, 0));
	assert_true(budget_tokens(&b, &big, 0) == 9.0);
	/* a deposit under a lowered cap clamps too */
	budget_init(&b, &big, 0);
	budget_deposit(&b, &small, 0);
	assert_true(budget_tokens(&b, &big, 0) == 10.0);
}

/* Time during which min_per_second was 0 earns nothing, even after a reload raises it. */
static void test_zero_rate_earns_nothing(void **state)
{
	struct cfg_retry none = policy(0, 0, 100);
	struct cfg_retry ten = policy(0, 10, 100);
	struct budget b;
	budget_init(&b, &none, 0);
	take_all(&b, &none, 0);
	assert_int_equal(take_all(&b, &none, 3600 * S), 0);
	assert_int_equal(take_all(&b, &ten, 3600 * S), 0);
	assert_int_equal(take_all(&b, &ten, 3600 * S + 1 * S), 10);
}

static void test_zero_max_tokens_never_retries(void **state)
{
	struct cfg_retry r = policy(1.0, 1000, 0);
	struct budget b;
	budget_init(&b, &r, 0);
	budget_deposit(&b, &r, 0);
	assert_false(budget_take(&b, &r, 10 * S));
	assert_true(budget_tokens(&b, &r, 10 * S) == 0.0);
}

/* Workers read one monotonic clock, but each at its own moment: an older "now" than the
 * last refill credits nothing and breaks nothing. */
static void test_clock_seen_out_of_order(void **state)
{
	struct cfg_retry r = policy(0, 10, 100);
	struct budget b;
	budget_init(&b, &r, 10 * S);
	take_all(&b, &r, 10 * S);
	assert_false(budget_take(&b, &r, 9 * S));
	assert_false(budget_take(&b, &r, 10 * S + 50 * MS));
	assert_false(budget_take(&b, &r, 10 * S));
	assert_true(budget_take(&b, &r, 10 * S + 100 * MS));
}

/* Single-threaded, with an integer rate and a ratio exact in fixed point, the bucket is an
 * ideal token bucket to the micro-token: compare every take with a model. */
static uint64_t xorshift(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ULL;
}

static void test_matches_ideal_bucket(void **state)
{
	struct cfg_retry r = policy(0.25, 7, 20);
	const int64_t cap = 20 * BUDGET_ONE;
	struct budget b;
	budget_init(&b, &r, 0);
	int64_t level = cap, now = 0;
	uint64_t seed = 12345;
	for (int i = 0; i < 200000; i++) {
		uint64_t x = xorshift(&seed);
		int64_t dt = (int64_t)(x % 100000);     /* up to 100 ms */
		now += dt;
		level = level + dt * 7 > cap ? cap : level + dt * 7;
		if (x >> 63) {
			budget_deposit(&b, &r, now);
			level = level + BUDGET_ONE / 4 > cap ? cap : level + BUDGET_ONE / 4;
		} else {
			bool want = level >= BUDGET_ONE;
			if (want)
				level -= BUDGET_ONE;
			assert_int_equal(budget_take(&b, &r, now), want);
		}
	}
	assert_true(budget_tokens(&b, &r, now) == (double)level / BUDGET_ONE);
}

/* budget_peek() is budget_tokens() without the writes: at every step of a random life (takes,
 * deposits, time, a fractional rate, a reload lowering the cap), the two agree, a peek
 * changes neither atomic, and peek >= 1 is exactly when the next take succeeds. */
static void test_peek_reads_without_writing(void **state)
{
	struct cfg_retry big = policy(0.2, 0.7, 20);
	struct cfg_retry small = policy(0.2, 0.7, 5);
	struct budget b, shadow;
	budget_init(&b, &big, 0);
	budget_init(&shadow, &big, 0);
	uint64_t seed = 777;
	int64_t now = 0;
	for (int i = 0; i < 100000; i++) {
		uint64_t x = xorshift(&seed);
		const struct cfg_retry *r = (x >> 8) % 16 == 0 ? &small : &big;
		now += (int64_t)(x % 700000);   /* up to 0.7 s: half a token at most */
		int64_t tokens = atomic_load(&b.tokens), refill = atomic_load(&b.refill_us);
		double peek = budget_peek(&b, r, now);
		assert_true(budget_peek(&b, r, now) == peek);
		assert_int_equal(atomic_load(&b.tokens), tokens);
		assert_int_equal(atomic_load(&b.refill_us), refill);
		/* the shadow bucket lives the same life but is looked at by budget_tokens() */
		assert_true(budget_tokens(&shadow, r, now) == peek);
		switch (x >> 62) {
		case 0:
			budget_deposit(&b, r, now);
			budget_deposit(&shadow, r, now);
			break;
		default:
			assert_int_equal(budget_take(&b, r, now), peek >= 1.0);
			assert_int_equal(budget_take(&shadow, r, now), peek >= 1.0);
			break;
		}
	}
}

/* A peek sees the refill that time has earned, capped, and an older "now" adds nothing. */
static void test_peek_sees_refill(void **state)
{
	struct cfg_retry r = policy(0, 10, 100);
	struct budget b;
	budget_init(&b, &r, 10 * S);
	assert_true(budget_peek(&b, &r, 10 * S) == 100.0);
	take_all(&b, &r, 10 * S);
	assert_true(budget_peek(&b, &r, 10 * S) == 0.0);
	assert_true(budget_peek(&b, &r, 9 * S) == 0.0);
	assert_true(budget_peek(&b, &r, 10 * S + 50 * MS) == 0.5);
	assert_true(budget_peek(&b, &r, 10 * S + 100 * MS) == 1.0);
	assert_true(budget_peek(&b, &r, 3600 * S) == 100.0);
	/* none of it was taken: the bucket is still empty at 10 s */
	assert_false(budget_take(&b, &r, 10 * S));
}

/* ---------------------------------------------------------------- threads */

#define NTHREADS 4

struct hammer {
	struct budget *b;
	const struct cfg_retry *r;
	_Atomic int64_t *clock;
	uint64_t seed;
	int iterations;
	long deposits;
	long takes;
	pthread_barrier_t *go;
};

static void *hammer_thread(void *arg)
{
	struct hammer *h = arg;
	pthread_barrier_wait(h->go);
	for (int i = 0; i < h->iterations; i++) {
		uint64_t x = xorshift(&h->seed);
		int64_t now;
		if ((x & 7) == 0)   /* time moves on by up to 64 µs now and then */
			now = atomic_fetch_add(h->clock, (int64_t)(x >> 58)) + (int64_t)(x >> 58);
		else
			now = atomic_load(h->clock);
		if ((x >> 8) % 3 == 0) {
			budget_deposit(h->b, h->r, now);
			h->deposits++;
		} else {
			h->takes += budget_take(h->b, h->r, now);
		}
	}
	return NULL;
}

/* 4 workers deposit and take as fast as they can while the clock moves: the retries never
 * exceed max_tokens + ratio * first attempts + min_per_second * t. */
static void test_threads_respect_bound(void **state)
{
	struct cfg_retry r = policy(0.1, 50, 10);
	struct budget b;
	_Atomic int64_t clock = 1 * S;
	budget_init(&b, &r, 1 * S);
	pthread_barrier_t go;
	pthread_barrier_init(&go, NULL, NTHREADS);
	struct hammer h[NTHREADS];
	pthread_t th[NTHREADS];
	for (int i = 0; i < NTHREADS; i++) {
		h[i] = (struct hammer){ .b = &b, .r = &r, .clock = &clock,
		                        .seed = 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1),
		                        .iterations = 300000, .go = &go };
		assert_int_equal(pthread_create(&th[i], NULL, hammer_thread, &h[i]), 0);
	}
	long deposits = 0, takes = 0;
	for (int i = 0; i < NTHREADS; i++) {
		pthread_join(th[i], NULL);
		deposits += h[i].deposits;
		takes += h[i].takes;
	}
	pthread_barrier_destroy(&go);
	double t = (double)(atomic_load(&clock) - 1 * S) / S;
	double bound = 10 + 0.1 * (double)deposits + 50 * t;
	double left = budget_tokens(&b, &r, atomic_load(&clock));
	print_message("threads: %ld takes, %ld deposits, %.3f s: bound %.3f, left %.3f\n", takes,
	              deposits, t, bound, left);
	assert_true((double)takes <= bound + 1);
	/* and the test is not vacuous: takes were asked for far more often than tokens came,
	 * so all that was earned was taken or is still there, but for the few deposits that
	 * found the bucket full before the first takes */
	assert_true((double)takes + left >= bound - 1);
}

struct burst {
	struct budget *b;
	const struct cfg_retry *r;
	int64_t now;
	long takes;
	pthread_barrier_t *go;
};

static void *burst_thread(void *arg)
{
	struct burst *s = arg;
	pthread_barrier_wait(s->go);
	/* a failed take may be a refill in progress elsewhere: try a few more times */
	for (int misses = 0; misses < 64;) {
		if (budget_take(s->b, s->r, s->now))
			s->takes++;
		else
			misses++;
	}
	return NULL;
}

/* The racy case of a lazy refill: a half-empty bucket left alone for an hour, then several
 * workers take at the same instant. The bucket is full at that instant (100 tokens), and an
 * interval of length ~0 allows 100 retries, not the 50 left plus a full bucket of credit. */
static void test_threads_stale_refill_burst(void **state)
{
	struct cfg_retry r = policy(0.2, 10, 100);
	uint64_t seed = 777;
	for (int round = 0; round < 300; round++) {
		struct budget b;
		budget_init(&b, &r, 0);
		int drain = (int)(xorshift(&seed) % 101);
		for (int i = 0; i < drain; i++)
			assert_true(budget_take(&b, &r, 0));
		int64_t now = 3600 * S + (int64_t)(xorshift(&seed) % S);

		pthread_barrier_t go;
		pthread_barrier_init(&go, NULL, NTHREADS);
		struct burst s[NTHREADS];
		pthread_t th[NTHREADS];
		for (int i = 0; i < NTHREADS; i++) {
			s[i] = (struct burst){ .b = &b, .r = &r, .now = now, .go = &go };
			assert_int_equal(pthread_create(&th[i], NULL, burst_thread, &s[i]), 0);
		}
		long takes = 0;
		for (int i = 0; i < NTHREADS; i++) {
			pthread_join(th[i], NULL);
			takes += s[i].takes;
		}
		pthread_barrier_destroy(&go);
		if (takes > 100)
			print_error("round %d: drained %d, then %ld takes in one instant\n", round, drain,
			            takes);
		assert_true(takes <= 100);
		/* nothing was lost either: what was not taken is still there */
		assert_true((double)takes + budget_tokens(&b, &r, now) == 100.0);
	}
}

/* budget.shared (SPEC §4): first attempts go to Redis in batches, at most one per
 * BUDGET_BATCH_US per process, carrying every count since the last one. A table of first
 * attempts at given times: whether each one sends the batch, and the count it carries. */
static void test_fleet_batches(void **state)
{
	static const struct { int64_t at; bool sends; int64_t carries; } rows[] = {
		{ 0 * MS, true, 1 },        /* the first one ever sends at once */
		{ 10 * MS, false, 0 },
		{ 50 * MS, false, 0 },
		{ 99 * MS, false, 0 },
		{ 100 * MS, true, 4 },      /* the three held back ride with it */
		{ 150 * MS, false, 0 },
		{ 199 * MS, false, 0 },
		{ 700 * MS, true, 3 },      /* after a quiet spell, at once */
		{ 701 * MS, false, 0 },
	};
	struct budget_fleet f;
	budget_fleet_init(&f);
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		bool sends = budget_fleet_credit(&f, rows[i].at);
		int64_t n = sends ? budget_fleet_take_pending(&f) : 0;
		if (sends != rows[i].sends || n != rows[i].carries)
			fail_msg("row %zu: sends %d carries %lld", i, sends, (long long)n);
	}
	/* a batch that failed is owed again, with the next one */
	budget_fleet_return_pending(&f, 5);
	assert_true(budget_fleet_credit(&f, 800 * MS));
	assert_int_equal(budget_fleet_take_pending(&f), 1 + 5 + 1);
}

/* Concurrent first attempts: every count reaches a batch exactly once, and no two batches are
 * claimed in one interval. */
struct fleet_run {
	struct budget_fleet *f;
	_Atomic int64_t *clock, *sent, *batches;
	int n;
};

static void *fleet_worker(void *arg)
{
	struct fleet_run *r = arg;
	for (int i = 0; i < r->n; i++) {
		int64_t now = atomic_fetch_add(r->clock, 37);      /* µs: ~1.5 batches per 4000 */
		if (budget_fleet_credit(r->f, now)) {
			atomic_fetch_add(r->batches, 1);
			atomic_fetch_add(r->sent, budget_fleet_take_pending(r->f));
		}
	}
	return NULL;
}

static void test_fleet_batches_threads(void **state)
{
	struct budget_fleet f;
	_Atomic int64_t clock = 0, sent = 0, batches = 0;
	struct fleet_run run = { &f, &clock, &sent, &batches, 20000 };
	pthread_t t[4];
	budget_fleet_init(&f);
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, fleet_worker, &run);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	int64_t total = atomic_load(&sent) + budget_fleet_take_pending(&f);
	assert_int_equal(total, 4 * 20000);
	/* 80000 calls * 37 µs = 2.96 s of fake time: at most one batch per 100 ms, plus the first */
	assert_true(atomic_load(&batches) <= 2960 / 100 + 1);
	assert_true(atomic_load(&batches) >= 2);
}

/* The outage: the first failure switches to the local bucket and is the one to log; more
 * failures log nothing; the first answer switches back (logged once) and keeps the level. */
static void test_fleet_fallback(void **state)
{
	static const struct { char ev; int64_t level; bool news; bool shared; } rows[] = {
		{ 'a', 7 * BUDGET_ONE, false, true },  /* answers while up: nothing to say */
		{ 'f', 0, true, false },    /* the outage begins: log */
		{ 'f', 0, false, false },   /* and goes on: counted, not logged */
		{ 'f', 0, false, false },
		{ 'a', 3 * BUDGET_ONE, true, true },   /* first answer: shared again, log */
		{ 'a', 2 * BUDGET_ONE, false, true },
		{ 'f', 0, true, false },    /* a second outage is logged again */
		{ 'a', -5, true, true },    /* a level below 0 reads as empty */
	};
	struct budget_fleet f;
	budget_fleet_init(&f);
	assert_true(budget_fleet_use_shared(&f));
	assert_int_equal(atomic_load(&f.level), -1);
	int64_t level = -1;
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		bool news = rows[i].ev == 'a' ? budget_fleet_answered(&f, rows[i].level)
		                              : budget_fleet_failed(&f, 0);
		if (rows[i].ev == 'a')
			level = rows[i].level < 0 ? 0 : rows[i].level;
		if (news != rows[i].news || budget_fleet_use_shared(&f) != rows[i].shared ||
		    atomic_load(&f.level) != level)
			fail_msg("row %zu: news %d shared %d level %lld", i, news,
			         budget_fleet_use_shared(&f), (long long)atomic_load(&f.level));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_starts_full_and_empties),
		cmocka_unit_test(test_deposit_adds_ratio),
		cmocka_unit_test(test_time_refill),
		cmocka_unit_test(test_time_while_full_is_not_banked),
		cmocka_unit_test(test_fractional_rate_called_often),
		cmocka_unit_test(test_reload_changes_max_tokens),
		cmocka_unit_test(test_zero_rate_earns_nothing),
		cmocka_unit_test(test_zero_max_tokens_never_retries),
		cmocka_unit_test(test_clock_seen_out_of_order),
		cmocka_unit_test(test_matches_ideal_bucket),
		cmocka_unit_test(test_peek_reads_without_writing),
		cmocka_unit_test(test_peek_sees_refill),
		cmocka_unit_test(test_threads_respect_bound),
		cmocka_unit_test(test_threads_stale_refill_burst),
		cmocka_unit_test(test_fleet_batches),
		cmocka_unit_test(test_fleet_batches_threads),
		cmocka_unit_test(test_fleet_fallback),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
