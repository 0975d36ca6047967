/*
 * test_log_limit: the log's rate limits. log_every() grants one caller per period, also when
 * threads race for it; log_keyed_every() grants once per period per key and, when every slot
 * of its table was written within the period, nothing to a new key (bounded lines).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "base/log.h"

#define S 1000000LL

static void test_every_once_per_period(void **state)
{
	_Atomic int64_t last = 0;
	assert_true(log_every(&last, 5 * S, 10 * S));       /* the first event is logged */
	assert_false(log_every(&last, 5 * S, 10 * S));
	assert_false(log_every(&last, 15 * S - 1, 10 * S));
	assert_true(log_every(&last, 15 * S, 10 * S));
	assert_false(log_every(&last, 16 * S, 10 * S));
}

static _Atomic int64_t race_last;
static _Atomic int race_won;

static void *racer(void *arg)
{
	for (int64_t t = 1; t <= 100000; t++)
		if (log_every(&race_last, 100 * S + t * 1000, 10 * S))
			atomic_fetch_add(&race_won, 1);
	return NULL;
}

static void test_every_threads_race(void **state)
{
	/* four threads see the same 100 s of clock: 10 periods, one winner each */
	pthread_t th[4];
	for (int i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, racer, NULL);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	assert_int_equal(atomic_load(&race_won), 10);
}

static void test_keyed_once_per_key_and_bounded(void **state)
{
	char key[32];
	int64_t t0 = 1000 * S;
	assert_true(log_keyed_every("client 10.0.0.1", t0, 60 * S));
	assert_false(log_keyed_every("client 10.0.0.1", t0 + 59 * S, 60 * S));
	assert_true(log_keyed_every("client 10.0.0.2", t0 + 1, 60 * S));
	assert_true(log_keyed_every("client 10.0.0.1", t0 + 60 * S, 60 * S));
	/* fill the table within one period (10.0.0.1's slot is taken, 10.0.0.2's is a period
	 * old and free again): the keys beyond it get nothing */
	int granted = 0;
	for (int i = 0; i < 2 * LOG_KEYS; i++) {
		snprintf(key, sizeof(key), "peer %d", i);
		granted += log_keyed_every(key, t0 + 61 * S, 60 * S);
	}
	assert_int_equal(granted, LOG_KEYS - 1);
	/* a period later the table takes new keys again */
	assert_true(log_keyed_every("peer 1000", t0 + 200 * S, 60 * S));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_once_per_period),
		cmocka_unit_test(test_every_threads_race),
		cmocka_unit_test(test_keyed_once_per_key_and_bounded),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
