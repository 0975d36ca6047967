/*
 * test_latency_hist: SPEC §14's p95/p99 hedge delay. The bins are log-scaled (four per
 * doubling above 1 ms) and a percentile is the upper bound of the bin it falls in, so it is
 * never below the true value and at most ~19% above it; never below 1 ms; none with fewer
 * than 100 samples in the last 60 s; samples older than the window are forgotten.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "policy/latency_hist.h"

#define MS 1000LL
#define S  1000000LL

static void test_bins_are_monotonic_and_bound_their_values(void **state)
{
	int last = 0;
	for (int64_t us = 1; us < 3600 * S; us = us * 11 / 10 + 1) {
		int b = lh_bin(us);
		assert_true(b >= last);
		assert_true(b >= 0 && b < LH_NBINS);
		if (b < LH_NBINS - 1) {
			assert_true(us <= lh_bin_upper(b));
			/* within a quarter doubling: the upper bound is at most ~19% above */
			if (us > MS)
				assert_true(lh_bin_upper(b) <= us * 1190 / 1000 + 1);
		}
		last = b;
	}
	assert_int_equal(lh_bin(0), 0);
	assert_int_equal(lh_bin(1000), 0);
	assert_int_equal(lh_bin(1001), 1);
	assert_int_equal(lh_bin_upper(0), 1000);
	assert_int_equal(lh_bin_upper(4), 2000);
	assert_int_equal(lh_bin_upper(8), 4000);
}

static void test_percentile_table(void **state)
{
	static const struct {
		int64_t fast_us, slow_us;
		int nfast, nslow, pct;
		int64_t lo, hi;         /* the answer lies in [lo, hi]; -1: none */
	} t[] = {
		{ 5 * MS, 0, 99, 0, 95, -1, -1 },               /* 99 samples: none */
		{ 5 * MS, 0, 100, 0, 95, 5 * MS, 6 * MS },      /* 100: one */
		{ 100, 0, 200, 0, 99, 1 * MS, 1 * MS },         /* never below 1 ms */
		{ 2 * MS, 200 * MS, 96, 4, 95, 2 * MS, 2400 },  /* 4% slow: p95 is the fast */
		{ 2 * MS, 200 * MS, 96, 4, 99, 200 * MS, 240 * MS },   /* p99 the slow */
		{ 2 * MS, 200 * MS, 90, 10, 95, 200 * MS, 240 * MS },
	};
	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
		uint32_t c[LH_NBINS] = { 0 };
		c[lh_bin(t[i].fast_us)] += (uint32_t)t[i].nfast;
		c[lh_bin(t[i].slow_us)] += (uint32_t)t[i].nslow;
		int64_t p = lh_percentile(c, t[i].pct);
		if (t[i].lo < 0) {
			assert_int_equal(p, -1);
			continue;
		}
		if (p < t[i].lo || p > t[i].hi)
			print_error("row %zu: %lld not in [%lld, %lld]\n", i, (long long)p,
			            (long long)t[i].lo, (long long)t[i].hi);
		assert_true(p >= t[i].lo && p <= t[i].hi);
	}
}

static void test_window_forgets_old_samples(void **state)
{
	struct latency_hist h;
	latency_hist_init(&h);
	int64_t t0 = 1000 * S;
	for (int i = 0; i < 150; i++)
		latency_hist_add(&h, t0 + i * 100 * MS, 3 * MS);   /* over 15 s */
	int64_t p = latency_hist_pct(&h, t0 + 15 * S, 95);
	assert_true(p >= 3 * MS && p <= 4 * MS);
	/* 55 s after the first, all are still inside the six 10 s periods */
	assert_true(latency_hist_pct(&h, t0 + 55 * S, 95) > 0);
	/* 70 s after the last one, nothing remains */
	assert_int_equal(latency_hist_pct(&h, t0 + 90 * S, 95), -1);
	/* a bucket reused for a new period starts from zero */
	for (int i = 0; i < 120; i++)
		latency_hist_add(&h, t0 + 90 * S + i * 10 * MS, 50 * MS);
	p = latency_hist_pct(&h, t0 + 92 * S, 50);
	assert_true(p >= 50 * MS && p <= 60 * MS);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bins_are_monotonic_and_bound_their_values),
		cmocka_unit_test(test_percentile_table),
		cmocka_unit_test(test_window_forgets_old_samples),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
