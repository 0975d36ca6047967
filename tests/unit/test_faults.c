/*
 * test_faults: SPEC §11's two pure decisions as tables. faults_pick(): which rule one draw
 * gives an attempt (match on method and path prefix, each rule its own slice of the draw, the
 * first rule winning where slices would overlap); faults_stop_reason(): which stop condition
 * a window meets, in SPEC order, with 0 turning a condition off and 20 requests before a
 * ratio is judged; faults_wait_us(): how long a drawn fault waits before it shows, and when
 * the per-try timeout cuts a delay. Then the reload of the reconciliation queue's bound and its ack.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <event2/buffer.h>

#include "policy/faults.h"
#include "obs/reconcile.h"

#define S 1000000LL

/* the random bits whose draw is PCT percent (0 <= PCT < 100), a hair above it so that a
 * slice boundary in the table is on the side the row means */
static uint64_t draw(double pct)
{
	return (uint64_t)((pct + 1e-9) / 100.0 * 9007199254740992.0) << 11;
}

static char *post_only[] = { "POST" };

static struct cfg_fault_rule rules[] = {
	{ .kind = FAULT_LOST_RESPONSE, .percent = 5, .methods = post_only, .nmethods = 1,
	  .path_prefix = "/pay" },
	{ .kind = FAULT_ABORT, .percent = 10, .path_prefix = "/", .status = 503 },
	{ .kind = FAULT_DELAY, .percent = 0.5, .path_prefix = "/slow" },
};

struct pick_row {
	const char *why;
	const char *method, *path;
	double at;                  /* the draw, in percent */
	int want;                   /* index in rules[], -1: none */
};

static const struct pick_row pick_rows[] = {
	{ "a POST to /pay in the first rule's slice", "POST", "/pay/1", 4.99, 0 },
	{ "a POST to /pay just past it: the second rule's slice", "POST", "/pay/1", 5.0, 1 },
	{ "a POST to /pay past both slices", "POST", "/pay/1", 15.0, -1 },
	{ "a GET to /pay: the first rule does not match, the second starts at 0", "GET", "/pay", 4.0, 1 },
	{ "a GET to /pay at 10: past the second rule's 10 percent", "GET", "/pay", 10.0, -1 },
	{ "a POST elsewhere: only the second rule matches", "POST", "/orders", 9.99, 1 },
	{ "/slow: its half percent comes after the abort's ten", "GET", "/slow", 10.2, 2 },
	{ "/slow past it", "GET", "/slow", 10.5, -1 },
	{ "/pa is not /pay", "POST", "/pa", 1.0, 1 },
	{ "the draw 0 hits the first matching rule", "POST", "/pay", 0.0, 0 },
};

static void test_pick_table(void **state)
{
	struct cfg_faults f = { .enabled = true, .rules = rules, .nrules = 3 };
	for (size_t i = 0; i < sizeof(pick_rows) / sizeof(pick_rows[0]); i++) {
		const struct pick_row *r = &pick_rows[i];
		const struct cfg_fault_rule *got = faults_pick(&f, r->method, r->path, strlen(r->path),
		                                               draw(r->at));
		int idx = got ? (int)(got - rules) : -1;
		if (idx != r->want)
			fail_msg("%s: got rule %d, want %d", r->why, idx, r->want);
	}
}

static void test_pick_rates_and_edges(void **state)
{
	struct cfg_fault_rule all = { .kind = FAULT_CONNECT_FAILURE, .percent = 100, .path_prefix = "/" };
	struct cfg_fault_rule none = { .kind = FAULT_CONNECT_FAILURE, .percent = 0, .path_prefix = "/" };
	struct cfg_faults f100 = { .rules = &all, .nrules = 1 };
	struct cfg_faults f0 = { .rules = &none, .nrules = 1 };
	struct cfg_faults empty = { 0 };
	assert_non_null(faults_pick(&f100, "GET", "/", 1, UINT64_MAX));
	assert_null(faults_pick(&f0, "GET", "/", 1, 0));
	assert_null(faults_pick(&empty, "GET", "/", 1, 0));
	/* a fraction of a percent, over an even spread of draws */
	struct cfg_fault_rule half = { .kind = FAULT_ABORT, .percent = 0.5, .path_prefix = "/" };
	struct cfg_faults fh = { .rules = &half, .nrules = 1 };
	int hits = 0;
	for (int i = 0; i < 100000; i++)
		hits += faults_pick(&fh, "GET", "/", 1, draw(i / 1000.0)) != NULL;
	assert_int_equal(hits, 500);
}

struct stop_row {
	const char *why;
	int64_t after_us;
	double min_rate, max_amp;
	struct faults_window w;
	enum faults_stop want;
};

#define DEF 600 * S, 0.9, 2.0

static const struct stop_row stop_rows[] = {
	{ "nothing yet", DEF, { 1 * S, 0, 0, 0, 0 }, FS_NONE },
	{ "after: just before", DEF, { 600 * S - 1, 0, 0, 0, 0 }, FS_NONE },
	{ "after: reached", DEF, { 600 * S, 0, 0, 0, 0 }, FS_AFTER },
	{ "after 0 is off", 0, 0.9, 2.0, { 100000 * S, 0, 0, 0, 0 }, FS_NONE },
	{ "success rate: 19 failures are too few to judge", DEF, { S, 19, 19, 19, 19 }, FS_NONE },
	{ "success rate: 20 failures of 20", DEF, { S, 20, 20, 20, 20 }, FS_SUCCESS_RATE },
	{ "success rate: exactly 0.9 is not below it", DEF, { S, 100, 10, 100, 100 }, FS_NONE },
	{ "success rate: 0.89", DEF, { S, 100, 11, 100, 100 }, FS_SUCCESS_RATE },
	{ "success rate 0 is off", 600 * S, 0, 2.0, { S, 100, 100, 100, 100 }, FS_NONE },
	{ "failures counted ahead of responses never underflow", DEF, { S, 20, 25, 20, 20 },
	  FS_SUCCESS_RATE },
	{ "amplification: 3x over 19 requests is too few", DEF, { S, 19, 0, 19, 57 }, FS_NONE },
	{ "amplification: 2.0 is not above 2.0", DEF, { S, 20, 0, 20, 40 }, FS_NONE },
	{ "amplification: 2.05", DEF, { S, 20, 0, 20, 41 }, FS_AMPLIFICATION },
	{ "amplification 0 is off", 600 * S, 0.9, 0, { S, 20, 0, 20, 60 }, FS_NONE },
	{ "after comes first", DEF, { 600 * S, 20, 20, 20, 60 }, FS_AFTER },
	{ "success rate before amplification", DEF, { S, 20, 20, 20, 60 }, FS_SUCCESS_RATE },
};

static void test_stop_table(void **state)
{
	for (size_t i = 0; i < sizeof(stop_rows) / sizeof(stop_rows[0]); i++) {
		const struct stop_row *r = &stop_rows[i];
		struct cfg_faults f = { .stop_after_us = r->after_us, .stop_min_success_rate = r->min_rate,
		                        .stop_max_amplification = r->max_amp };
		enum faults_stop got = faults_stop_reason(&f, &r->w);
		if (got != r->want)
			fail_msg("%s: got %d, want %d", r->why, got, r->want);
	}
	assert_string_equal(faults_stop_name(FS_AFTER), "after");
	assert_string_equal(faults_stop_name(FS_SUCCESS_RATE), "min_success_rate");
	assert_string_equal(faults_stop_name(FS_AMPLIFICATION), "max_amplification");
	assert_null(faults_stop_name(FS_NONE));
	assert_string_equal(faults_kind_name(FAULT_LOST_RESPONSE), "lost-response");
}

struct wait_row {
	const char *why;
	int kind;
	int64_t delay, per_try, remaining;
	int64_t want;
	bool cut;
};

static const struct wait_row wait_rows[] = {
	{ "abort shows at once", FAULT_ABORT, 0, 2 * S, 10 * S, 0, false },
	{ "connect-failure shows at once", FAULT_CONNECT_FAILURE, 0, 2 * S, 10 * S, 0, false },
	{ "a delay within the per-try timeout", FAULT_DELAY, S / 2, 2 * S, 10 * S, S / 2, false },
	{ "a delay as long as the per-try timeout is cut by it", FAULT_DELAY, 2 * S, 2 * S, 10 * S,
	  2 * S, true },
	{ "a delay past the per-try timeout: a timeout then", FAULT_DELAY, 5 * S, 2 * S, 10 * S,
	  2 * S, true },
	{ "the deadline before the per-try timeout: the delay waits on (the deadline ends it)",
	  FAULT_DELAY, 5 * S, 2 * S, S, 5 * S, false },
};

static void test_wait_table(void **state)
{
	for (size_t i = 0; i < sizeof(wait_rows) / sizeof(wait_rows[0]); i++) {
		const struct wait_row *r = &wait_rows[i];
		struct cfg_fault_rule rule = { .kind = r->kind, .delay_us = r->delay };
		bool cut = !r->cut;
		int64_t got = faults_wait_us(&rule, r->per_try, r->remaining, &cut);
		if (got != r->want || cut != r->cut)
			fail_msg("%s: got %lld (cut %d), want %lld (cut %d)", r->why, (long long)got,
			         cut, (long long)r->want, r->cut);
	}
}

static void add(const char *id)
{
	struct reconcile_rec r = { .id = id, .upstream = "pay", .method = "POST", .path = "/x",
	                           .path_len = 2, .attempts = 1, .last_outcome = "reset",
	                           .endpoint = "127.0.0.1:1" };
	reconcile_record(&r);
}

static int count(const char *needle)
{
	struct evbuffer *b = evbuffer_new();
	reconcile_render(b, NULL);
	size_t n = evbuffer_get_length(b);
	char *s = (char *)evbuffer_pullup(b, -1);
	int k = 0;
	for (char *p = s; (p = memmem(p, n - (size_t)(p - s), needle, strlen(needle))); p++)
		k++;
	evbuffer_free(b);
	return k;
}

static void test_queue_bound_and_ack(void **state)
{
	reconcile_set_keep(2);
	add("a");
	add("b");
	add("c");
	assert_int_equal(count("\"id\":"), 2);
	assert_int_equal(count("\"id\":\"a\""), 0);
	assert_true(reconcile_ack("b"));
	assert_false(reconcile_ack("b"));
	assert_int_equal(count("\"id\":"), 1);
	reconcile_set_keep(1000);
	reconcile_clear();
	assert_int_equal(count("\"id\":"), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pick_table),
		cmocka_unit_test(test_pick_rates_and_edges),
		cmocka_unit_test(test_stop_table),
		cmocka_unit_test(test_wait_table),
		cmocka_unit_test(test_queue_bound_and_ack),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
