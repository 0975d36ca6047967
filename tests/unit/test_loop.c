/*
 * test_loop: the loop's free lists keep what a steady load reuses and, tick by tick
 * (loop_scavenge), let go of what it did not need, the longest unused first.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/event.h>

#include "base/clock.h"
#include "base/loop.h"

#ifdef RG_CHECK_MAGIC
#define KEPT 0          /* the sanitizer build keeps nothing: reuse would hide a use-after-free */
#else
#define KEPT 1
#endif

static int setup(void **state)
{
	struct loop *l = calloc(1, sizeof(*l));
	if (!l || loop_init(l, 0) != 0)
		return -1;
	*state = l;
	return 0;
}

static int teardown(void **state)
{
	struct loop *l = *state;
	loop_free_dns(l);
	loop_fini(l);
	loop_free_base(l);
	free(l);
	return 0;
}

static void test_buffers_unused_for_a_tick_are_freed(void **state)
{
	struct loop *l = *state;
	struct evbuffer *b[10];
	for (int i = 0; i < 10; i++)
		b[i] = loop_buf_get(l);
	for (int i = 0; i < 10; i++)
		loop_buf_put(l, b[i]);
	assert_int_equal(l->nbufs, 10 * KEPT);
	/* all ten were taken during this tick: none goes */
	loop_scavenge(l);
	assert_int_equal(l->nbufs, 10 * KEPT);
	/* a steady load of three at a time: the seven it never reaches go, the three stay */
	for (int i = 0; i < 3; i++)
		b[i] = loop_buf_get(l);
	for (int i = 0; i < 3; i++)
		loop_buf_put(l, b[i]);
	loop_scavenge(l);
	assert_int_equal(l->nbufs, 3 * KEPT);
	if (KEPT) {
		/* the kept ones are those the load used (returned last, taken first) */
		for (int i = 0; i < 3; i++)
			assert_ptr_equal(l->bufs[i], b[i]);
	}
	/* the load stops: everything goes at the next tick */
	loop_scavenge(l);
	assert_int_equal(l->nbufs, 0);
	loop_scavenge(l);
	assert_int_equal(l->nbufs, 0);
}

static void test_objects_and_blocks_unused_for_a_tick_are_freed(void **state)
{
	struct loop *l = *state;
	void *o[8], *k[8];
	for (int i = 0; i < 8; i++) {
		o[i] = loop_obj_get(l, LOOP_ATTEMPT, 200);
		k[i] = loop_blk_alloc(l, 100);      /* the 128-byte class */
	}
	for (int i = 0; i < 8; i++) {
		loop_obj_put(l, LOOP_ATTEMPT, o[i]);
		loop_blk_free(l, k[i]);
	}
	assert_int_equal(l->ncache[LOOP_ATTEMPT], 8 * KEPT);
	assert_int_equal(l->nblk[2], 8 * KEPT);
	loop_scavenge(l);
	assert_int_equal(l->ncache[LOOP_ATTEMPT], 8 * KEPT);
	assert_int_equal(l->nblk[2], 8 * KEPT);
	/* two in use at a time: those two stay, and they are the ones reused */
	void *o2 = loop_obj_get(l, LOOP_ATTEMPT, 200), *o3 = loop_obj_get(l, LOOP_ATTEMPT, 200);
	void *k2 = loop_blk_alloc(l, 120), *k3 = loop_blk_alloc(l, 120);
	loop_obj_put(l, LOOP_ATTEMPT, o3);
	loop_obj_put(l, LOOP_ATTEMPT, o2);
	loop_blk_free(l, k3);
	loop_blk_free(l, k2);
	loop_scavenge(l);
	assert_int_equal(l->ncache[LOOP_ATTEMPT], 2 * KEPT);
	assert_int_equal(l->nblk[2], 2 * KEPT);
	if (KEPT) {
		assert_ptr_equal(loop_obj_get(l, LOOP_ATTEMPT, 200), o2);
		assert_ptr_equal(loop_blk_alloc(l, 128), k2);
		loop_obj_put(l, LOOP_ATTEMPT, o2);
		loop_blk_free(l, k2);
	}
	/* another list was not touched by any of this: its low mark went with its entries */
	assert_int_equal(l->ncache[LOOP_EXCHANGE], 0);
	loop_scavenge(l);
	loop_scavenge(l);
	assert_int_equal(l->ncache[LOOP_ATTEMPT], 0);
	assert_int_equal(l->nblk[2], 0);
}

/* Timeouts get the coarse clock's tick added so none fires early, except the hedge timer's
 * (clock_tv_early_ok): a 1.2 ms hedge delay stays 1.2 ms, not 5.2. */
static void test_timer_slack_and_early_ok(void **state)
{
	static const struct {
		int64_t us, tv_us, early_us;
	} t[] = {
		{ -5, 0, 0 }, { 0, 0, 0 }, { 1200, 5200, 1200 }, { 20000, 24000, 20000 },
		{ 999000, 1003000, 999000 }, { 2500000, 2504000, 2500000 },
	};
	int64_t saved = clock_timer_slack_us;
	clock_timer_slack_us = 4000;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct timeval a = clock_tv(t[i].us), b = clock_tv_early_ok(t[i].us);
		assert_int_equal(a.tv_sec * 1000000 + a.tv_usec, t[i].tv_us);
		assert_int_equal(b.tv_sec * 1000000 + b.tv_usec, t[i].early_us);
		assert_true(a.tv_usec < 1000000 && b.tv_usec < 1000000);
	}
	clock_timer_slack_us = saved;
}

int main(void)
{
	loop_global_init();     /* drops the warnings loop_init's loop_fd_seen provokes */
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_buffers_unused_for_a_tick_are_freed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_objects_and_blocks_unused_for_a_tick_are_freed, setup,
		                                teardown),
		cmocka_unit_test(test_timer_slack_and_early_ok),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
