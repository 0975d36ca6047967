/*
 * test_accesslog: the JSON line of a request as written to a real file: each try with its
 * endpoint and status or outcome, SPEC §10's grpc-status per try (only where one was seen, so
 * HTTP lines are as before), and the whole line valid JSON-shaped; the outcome (ok, failed,
 * unknown and why) of HTTP and gRPC requests as a table, and a hold-caused refusal's "held".
 * And a log whose reader
 * reads nothing: writing never waits for it, the lines past the backlog are counted dropped.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <time.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "obs/accesslog.h"
#include "http/grpc.h"
#include "http/h1_parser.h"
#include "obs/stats.h"

/* Writes R through a fresh log file and returns its one line (caller frees). */
static char *line_of(const struct access_rec *r)
{
	char path[] = "/tmp/rg-test-accesslog-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(accesslog_open(path), 0);
	accesslog_write(r);
	accesslog_close();
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	char *buf = calloc(1, 8192);
	size_t n = fread(buf, 1, 8191, f);
	fclose(f);
	unlink(path);
	assert_true(n > 0 && buf[n - 1] == '\n');
	assert_null(memchr(buf, '\n', n - 1));      /* one line */
	return buf;
}

static void assert_contains(const char *hay, const char *needle)
{
	if (!strstr(hay, needle))
		fail_msg("missing %s in:\n%s", needle, hay);
}

static struct access_rec base(struct http_head *h)
{
	memset(h, 0, sizeof *h);
	snprintf(h->method, sizeof h->method, "POST");
	h->path = "/shop.Cart/Add";
	h->path_len = strlen(h->path);
	struct access_rec r;
	access_begin(&r, 7, "127.0.0.1", h, "rid");
	return r;
}

static void test_grpc_status_per_try(void **state)
{
	(void)state;
	struct http_head h;
	struct access_rec r = base(&h);
	access_add_attempt(&r, "10.0.0.1:50051");
	access_set_status(&r, 200);
	access_set_grpc_status(&r, GRPC_UNAVAILABLE);
	access_add_attempt(&r, "10.0.0.2:50051");
	access_set_outcome(&r, "reset");
	access_add_attempt(&r, "10.0.0.1:50051");
	access_set_status(&r, 200);
	access_set_grpc_status(&r, GRPC_OK);
	r.attempts = 3;
	r.status = 200;
	char *l = line_of(&r);
	assert_contains(l, "\"tries\":[{\"endpoint\":\"10.0.0.1:50051\",\"status\":200,"
	                   "\"grpc_status\":14,\"grpc_status_name\":\"unavailable\"},"
	                   "{\"endpoint\":\"10.0.0.2:50051\",\"outcome\":\"reset\"},"
	                   "{\"endpoint\":\"10.0.0.1:50051\",\"status\":200,\"grpc_status\":0,"
	                   "\"grpc_status_name\":\"ok\"}]");
	free(l);
}

static void test_http_try_unchanged(void **state)
{
	(void)state;
	struct http_head h;
	struct access_rec r = base(&h);
	access_add_attempt(&r, "10.0.0.1:80");
	access_set_status(&r, 503);
	access_set_grpc_status(&r, 17);     /* outside 0..16: ignored */
	access_set_grpc_status(&r, -1);
	r.attempts = 1;
	r.status = 503;
	char *l = line_of(&r);
	assert_contains(l, "\"tries\":[{\"endpoint\":\"10.0.0.1:80\",\"status\":503}]");
	assert_null(strstr(l, "grpc"));
	free(l);
}

static void test_grpc_status_before_any_attempt_is_ignored(void **state)
{
	(void)state;
	struct http_head h;
	struct access_rec r = base(&h);
	access_set_grpc_status(&r, GRPC_INTERNAL);
	r.status = 200;
	char *l = line_of(&r);
	assert_contains(l, "\"tries\":[]");
	assert_null(strstr(l, "grpc_status"));
	free(l);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Last: the writer stays blocked on the pipe until its reader closes. */
/* SPEC §6, §10, §12: one decision for the log's outcome and the reconciliation record */
static const struct outcome_row {
	const char *why;
	bool non_idempotent;
	int attempts;
	enum outcome last_out;
	int status;
	bool ok_response;
	int grpc_status;                /* -1: HTTP */
	bool answered;
	bool not_executed;
	const char *reason;
	const char *cause, *outcome;
} outcome_rows[] = {
	/* why: non_idempotent, attempts, last_out, status, ok_response, grpc_status, answered,
	 * not_executed, reason -> cause, outcome */
	{ "HTTP POST answered 200", true, 1, OUT_STATUS, 200, true, -1, false, false, NULL,
	  NULL, "ok" },
	{ "HTTP POST answered 503", true, 3, OUT_STATUS, 503, true, -1, false, false, NULL,
	  NULL, "failed" },
	{ "HTTP POST reset", true, 1, OUT_RESET, 502, false, -1, false, false, "reset",
	  "reset", "unknown" },
	{ "HTTP POST timed out", true, 2, OUT_TIMEOUT, 504, false, -1, false, false, "timeout",
	  "timeout", "unknown" },
	{ "HTTP GET reset", false, 3, OUT_RESET, 502, false, -1, false, false, "reset",
	  NULL, "failed" },
	{ "no attempt", true, 0, OUT_NONE, 503, false, -1, false, false, "overloaded",
	  NULL, "failed" },
	{ "gRPC OK", true, 1, OUT_STATUS, 200, true, 0, true, false, NULL,
	  NULL, "ok" },
	{ "gRPC UNAVAILABLE relayed", true, 1, OUT_STATUS, 200, true, 14, true, false, NULL,
	  "unavailable", "unknown" },
	{ "gRPC INTERNAL relayed", true, 3, OUT_STATUS, 200, true, 13, true, false, NULL,
	  "internal", "unknown" },
	{ "gRPC NOT_FOUND relayed: definite", true, 1, OUT_STATUS, 200, true, 5, true, false, NULL,
	  NULL, "failed" },
	{ "gRPC UNAVAILABLE on an idempotent path", false, 3, OUT_STATUS, 200, true, 14, true,
	  false, NULL, NULL, "failed" },
	{ "gRPC reset, retrygate's UNAVAILABLE", true, 1, OUT_RESET, 200, false, 14, false, false,
	  "reset", "reset", "unknown" },
	{ "gRPC connect-failure, retrygate's UNAVAILABLE", true, 1, OUT_CONNECT_FAILURE, 200, false,
	  14, false, false, "connect-failure", NULL, "failed" },
	{ "gRPC HTTP 503 relayed (an HTTP outcome)", true, 1, OUT_STATUS, 503, true, 14, false,
	  false, NULL, NULL, "failed" },
	{ "gRPC replayed OK", true, 0, OUT_NONE, 200, false, 0, false, false,
	  "idempotency-replayed", NULL, "ok" },
	{ "gRPC RESOURCE_EXHAUSTED relayed, in release_on", true, 1, OUT_STATUS, 200, true, 8, true,
	  true, NULL, NULL, "failed" },
	{ "gRPC RESOURCE_EXHAUSTED relayed, release_on without it", true, 1, OUT_STATUS, 200, true,
	  8, true, false, NULL, "resource-exhausted", "unknown" },
};

static void test_outcome_table(void **state)
{
	(void)state;
	struct http_head h;
	for (size_t i = 0; i < sizeof(outcome_rows) / sizeof(outcome_rows[0]); i++) {
		const struct outcome_row *o = &outcome_rows[i];
		struct access_rec r = base(&h);
		r.non_idempotent = o->non_idempotent;
		r.attempts = o->attempts;
		r.last_out = o->last_out;
		r.status = o->status;
		r.ok_response = o->ok_response;
		r.grpc_status = o->grpc_status;
		r.grpc_answered = o->answered;
		r.not_executed = o->not_executed;
		r.reason = o->reason;
		const char *cause = access_unknown_cause(&r);
		if ((cause == NULL) != (o->cause == NULL) || (cause && strcmp(cause, o->cause) != 0))
			fail_msg("%s: cause %s, want %s", o->why, cause ? cause : "none",
			         o->cause ? o->cause : "none");
		if (strcmp(access_outcome(&r), o->outcome) != 0)
			fail_msg("%s: outcome %s, want %s", o->why, access_outcome(&r), o->outcome);
	}
}

static void test_held_named_on_the_line(void **state)
{
	(void)state;
	struct http_head h;
	struct access_rec r = base(&h);
	r.refused = RR_RETRY_AFTER;
	access_set_held(&r, "10.0.0.7:50051", 4210);
	char *line = line_of(&r);
	assert_contains(line, "\"retry_refused\":\"retry-after\",\"held\":{\"endpoint\":"
	                      "\"10.0.0.7:50051\",\"ms_left\":4210}");
	free(line);
	r = base(&h);
	line = line_of(&r);
	assert_null(strstr(line, "\"held\""));
	free(line);
}

static void test_full_pipe_never_blocks_the_writer_of_a_line(void **state)
{
	int p[2];
	assert_int_equal(pipe(p), 0);
	fcntl(p[0], F_SETPIPE_SZ, 4096);
	char path[64];
	snprintf(path, sizeof path, "/dev/fd/%d", p[1]);
	assert_int_equal(accesslog_open(path), 0);
	struct http_head h;
	struct access_rec r = base(&h);
	access_add_attempt(&r, "127.0.0.1:1");
	access_set_status(&r, 200);
	r.status = 200;
	double t0 = now_s();
	for (int i = 0; i < 40000; i++)        /* some 12 MB: past the backlog */
		accesslog_write(&r);
	accesslog_flush();
	assert_true(now_s() - t0 < 5.0);
	assert_true(atomic_load(&g_pstats.access_log_dropped) > 0);
	t0 = now_s();
	accesslog_close();                      /* gives up on the stuck writer */
	assert_true(now_s() - t0 < 4.0);
	signal(SIGPIPE, SIG_IGN);
	close(p[0]);                            /* its write fails: the writer ends */
	close(p[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_grpc_status_per_try),
		cmocka_unit_test(test_http_try_unchanged),
		cmocka_unit_test(test_grpc_status_before_any_attempt_is_ignored),
		cmocka_unit_test(test_outcome_table),
		cmocka_unit_test(test_held_named_on_the_line),
		cmocka_unit_test(test_full_pipe_never_blocks_the_writer_of_a_line),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
