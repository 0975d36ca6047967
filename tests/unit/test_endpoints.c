/*
 * test_endpoints: the pure parts of SPEC §13 as tables: which endpoint balancing picks (first
 * attempts by mode, retries by §4 rule 6 with "not ejected" first), the ejection arithmetic of
 * passive health, the TTL clamp of re-resolution and the probe's status line.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "policy/balance.h"
#include "policy/outlier.h"
#include "state/probe.h"
#include "state/resolve.h"

#define NOW 1000000000LL
#define S   1000000LL
#define EJ  (NOW + 5 * S)       /* ejected: ends in 5 s */
#define HD  (NOW + 2 * S)       /* held: ends in 2 s */

struct row {
	const char *what;
	int n;
	struct balance_view v[4];
	enum balance_mode mode;
	bool retry;
	uint64_t rr, rnd;
	int want;
};

static const struct row rows[] = {
	{ "round-robin takes the rr-th", 3, { { 0 }, { 0 }, { 0 } }, BAL_ROUND_ROBIN, false, 4, 0, 1 },
	{ "round-robin skips the ejected", 3, { { 0 }, { .eject_until_us = EJ }, { 0 } },
	  BAL_ROUND_ROBIN, false, 1, 0, 2 },
	{ "first attempts ignore holds", 2, { { .hold_until_us = HD }, { 0 } }, BAL_ROUND_ROBIN,
	  false, 0, 0, 0 },
	{ "an ejection that ended counts as up", 2, { { .eject_until_us = NOW }, { 0 } },
	  BAL_ROUND_ROBIN, false, 0, 0, 0 },
	{ "all ejected: the one whose ejection ends first", 3,
	  { { .eject_until_us = EJ + S }, { .eject_until_us = EJ }, { .eject_until_us = INT64_MAX } },
	  BAL_ROUND_ROBIN, false, 0, 0, 1 },
	{ "random: rnd modulo the endpoints up", 3, { { 0 }, { .eject_until_us = EJ }, { 0 } },
	  BAL_RANDOM, false, 0, 3, 2 },
	{ "least-request: the less loaded of two draws", 3,
	  { { .in_flight = 5 }, { .in_flight = 1 }, { .in_flight = 9 } }, BAL_LEAST_REQUEST, false,
	  0, 0 | (0ull << 32), 1 },
	{ "least-request: a tie keeps the first draw", 2, { { .in_flight = 2 }, { .in_flight = 2 } },
	  BAL_LEAST_REQUEST, false, 0, 1, 1 },
	{ "retry: untried before tried", 2, { { .tried = true }, { 0 } }, BAL_ROUND_ROBIN, true, 0,
	  0, 1 },
	{ "retry: unheld tried before held untried", 2, { { .hold_until_us = HD }, { .tried = true } },
	  BAL_ROUND_ROBIN, true, 0, 0, 1 },
	{ "retry: not ejected (held) before ejected", 2,
	  { { .eject_until_us = EJ }, { .hold_until_us = HD, .tried = true } }, BAL_ROUND_ROBIN, true,
	  0, 0, 1 },
	{ "retry: all held: the hold that ends first", 2,
	  { { .hold_until_us = HD + S }, { .hold_until_us = HD } }, BAL_ROUND_ROBIN, true, 0, 0, 1 },
	{ "retry: all ejected: the ejection that ends first", 2,
	  { { .eject_until_us = EJ + S }, { .eject_until_us = EJ } }, BAL_ROUND_ROBIN, true, 0, 0, 1 },
	{ "retry: ties in round-robin order from rr", 3, { { .tried = true }, { 0 }, { 0 } },
	  BAL_ROUND_ROBIN, true, 2, 0, 2 },
};

static void test_balance_table(void **state)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		const struct row *r = &rows[i];
		int got = balance_choose(r->v, r->n, r->mode, r->retry, r->rr, r->rnd, NOW);
		if (got != r->want)
			fail_msg("%s: got %d, want %d", r->what, got, r->want);
	}
}

/* round-robin over two: first attempts alternate whatever retries happen in between */
static void test_round_robin_splits_first_attempts_evenly(void **state)
{
	struct balance_view v[2] = { { 0 }, { 0 } };
	int count[2] = { 0, 0 };
	for (uint64_t rr = 0; rr < 200; rr++)
		count[balance_choose(v, 2, BAL_ROUND_ROBIN, false, rr, rr * 7919, NOW)]++;
	assert_int_equal(count[0], 100);
	assert_int_equal(count[1], 100);
}

static void test_least_request_draws_two_distinct(void **state)
{
	/* the only idle endpoint wins whenever it is one of the two draws: never the busy one
	 * when both draws would be the same busy endpoint */
	struct balance_view v[3] = { { .in_flight = 1 }, { .in_flight = 0 }, { .in_flight = 1 } };
	int wins = 0;
	for (uint64_t rnd = 0; rnd < 3000; rnd++)
		wins += balance_choose(v, 3, BAL_LEAST_REQUEST, false, 0, rnd * 0x9e3779b97f4a7c15ull,
		                       NOW) == 1;
	assert_in_range(wins, 1700, 2300);     /* 2/3 of the pairs contain it */
}

static const struct cfg_health health = {
	.consecutive_failures = 5, .base_ejection_us = 10 * S, .max_ejection_us = 300 * S,
	.max_ejected_percent = 50,
};

static void test_ejection_arithmetic(void **state)
{
	struct { int n; int64_t want; } t[] = {
		{ 1, 10 * S }, { 2, 20 * S }, { 3, 30 * S }, { 30, 300 * S }, { 31, 300 * S },
		{ 1000000000, 300 * S }, { 0, 10 * S },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		assert_int_equal(outlier_ejection_us(&health, t[i].n), t[i].want);
}

static void test_max_ejected_percent(void **state)
{
	struct { int n, ejected; bool want; } t[] = {
		{ 1, 0, false },    /* the only one always stays */
		{ 2, 0, true }, { 2, 1, false },
		{ 3, 0, true }, { 3, 1, false },    /* 2 of 3 would be 66% */
		{ 4, 1, true }, { 4, 2, false },
		{ 10, 4, true }, { 10, 5, false },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (outlier_may_eject(&health, t[i].n, t[i].ejected) != t[i].want)
			fail_msg("n=%d ejected=%d: want %d", t[i].n, t[i].ejected, t[i].want);
	struct cfg_health all = health;
	all.max_ejected_percent = 100;
	assert_true(outlier_may_eject(&all, 3, 1));
	assert_false(outlier_may_eject(&all, 3, 2));     /* still one stays */
}

static void test_what_counts_as_failure(void **state)
{
	assert_true(outlier_is_failure(OUT_CONNECT_FAILURE, 0, false));
	assert_true(outlier_is_failure(OUT_RESET, 0, false));
	assert_true(outlier_is_failure(OUT_TIMEOUT, 0, false));
	assert_true(outlier_is_failure(OUT_STATUS, 500, false));
	assert_true(outlier_is_failure(OUT_STATUS, 503, false));
	assert_false(outlier_is_failure(OUT_STATUS, 503, true));    /* a hold, not ill health */
	assert_false(outlier_is_failure(OUT_STATUS, 429, true));
	assert_false(outlier_is_failure(OUT_STATUS, 429, false));
	assert_false(outlier_is_failure(OUT_STATUS, 404, false));
	assert_false(outlier_is_failure(OUT_STATUS, 200, false));
	assert_true(outlier_is_failure(OUT_STATUS, 502, true));
}

static void test_ttl_clamp(void **state)
{
	assert_int_equal(resolve_ttl_us(0), 1 * S);
	assert_int_equal(resolve_ttl_us(-5), 1 * S);
	assert_int_equal(resolve_ttl_us(30), 30 * S);
	assert_int_equal(resolve_ttl_us(86400), 300 * S);
}

static void test_probe_status_line(void **state)
{
	assert_int_equal(probe_parse_status("HTTP/1.1 200 OK", 15), 200);
	assert_int_equal(probe_parse_status("HTTP/1.0 503", 12), 503);
	assert_int_equal(probe_parse_status("HTTP/1.1 20 OK", 14), 0);
	assert_int_equal(probe_parse_status("SSH-2.0-OpenSSH", 15), 0);
	assert_int_equal(probe_parse_status("HTTP/1.1 2000", 13), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_balance_table),
		cmocka_unit_test(test_round_robin_splits_first_attempts_evenly),
		cmocka_unit_test(test_least_request_draws_two_distinct),
		cmocka_unit_test(test_ejection_arithmetic),
		cmocka_unit_test(test_max_ejected_percent),
		cmocka_unit_test(test_what_counts_as_failure),
		cmocka_unit_test(test_ttl_clamp),
		cmocka_unit_test(test_probe_status_line),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
