/*
 * test_grpc: SPEC §10's pure facts row by row: the 17 names both ways, which content-types
 * make a request gRPC (and the near misses that do not), grpc-status and
 * grpc-retry-pushback-ms parsing, grpc-timeout formatting at every unit boundary, the reason
 * table of retrygate's own answers and the definite codes of idempotency enforcement.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "http/grpc.h"
#include "http/h1_parser.h"

#define MS 1000LL
#define S  1000000LL

static const char *const names[GRPC_NCODES] = {
	"ok", "cancelled", "unknown", "invalid-argument", "deadline-exceeded", "not-found",
	"already-exists", "permission-denied", "resource-exhausted", "failed-precondition",
	"aborted", "out-of-range", "unimplemented", "internal", "unavailable", "data-loss",
	"unauthenticated",
};

static void test_names_both_ways(void **state)
{
	(void)state;
	for (int c = 0; c < GRPC_NCODES; c++) {
		assert_string_equal(grpc_status_name(c), names[c]);
		assert_int_equal(grpc_status_by_name(names[c], strlen(names[c])), c);
	}
	assert_int_equal(GRPC_UNAVAILABLE, 14);
	assert_int_equal(GRPC_UNAUTHENTICATED, 16);
	/* outside 0..16 a code is what a client reads it as */
	assert_string_equal(grpc_status_name(-1), "unknown");
	assert_string_equal(grpc_status_name(17), "unknown");
	assert_string_equal(grpc_status_name(1000), "unknown");
}

static void test_names_misses(void **state)
{
	(void)state;
	static const char *const misses[] = {
		"", "UNAVAILABLE", "Unavailable", "unavailable ", " unavailable", "unavail",
		"invalid_argument", "14", "deadline_exceeded", "okay", "o",
	};
	for (size_t i = 0; i < sizeof(misses) / sizeof(misses[0]); i++)
		assert_int_equal(grpc_status_by_name(misses[i], strlen(misses[i])), -1);
	/* the length is honoured, not the NUL */
	assert_int_equal(grpc_status_by_name("unavailablexx", 11), GRPC_UNAVAILABLE);
	assert_int_equal(grpc_status_by_name("unavailable", 5), -1);
	assert_int_equal(grpc_status_by_name(NULL, 0), -1);
}

struct ct_row {
	const char *v;
	bool grpc;
};

static const struct ct_row ct_rows[] = {
	{ "application/grpc", true },
	{ "application/grpc+proto", true },
	{ "application/grpc+json", true },
	{ "application/grpc;charset=utf-8", true },
	{ "application/grpc; charset=utf-8", true },
	{ "application/grpc+", true },          /* "starting with application/grpc+" */
	{ "application/grpc;", true },
	{ "APPLICATION/GRPC", true },
	{ "Application/Grpc+Proto", true },
	{ "application/gRPC;x=1", true },
	{ "application/grpcx", false },
	{ "application/grpc-web", false },      /* gRPC-Web is out of scope */
	{ "application/grpc-web+proto", false },
	{ "application/grpc ", false },
	{ " application/grpc", false },
	{ "application/grp", false },
	{ "application/json", false },
	{ "text/grpc", false },
	{ "application/grpcweb", false },
	{ "application\x0fgrpc", false },     /* only '/' is '/', whatever case folding does */
	{ "applicatioN/grpc", true },
	{ "application/grpC", true },
	{ "", false },
};

static void test_content_type(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(ct_rows) / sizeof(ct_rows[0]); i++) {
		const struct ct_row *r = &ct_rows[i];
		if (grpc_content_type(r->v, strlen(r->v)) != r->grpc)
			fail_msg("content-type \"%s\": want %d", r->v, r->grpc);
	}
	/* the length bounds the value: a prefix of a gRPC type is not one */
	assert_false(grpc_content_type("application/grpc+proto", 15));
	assert_true(grpc_content_type("application/grpcx", 16));
	assert_false(grpc_content_type(NULL, 0));
}

struct st_row {
	const char *v;
	int code;
};

static const struct st_row st_rows[] = {
	{ "0", 0 },
	{ "14", 14 },
	{ "16", 16 },
	{ "014", 14 },          /* leading zeros count as digits */
	{ "017", GRPC_UNKNOWN },
	{ "17", GRPC_UNKNOWN }, /* well-formed but unknown: what a client reads */
	{ "999", GRPC_UNKNOWN },
	{ "000", 0 },
	{ "", -1 },
	{ "1a", -1 },
	{ "a", -1 },
	{ "-1", -1 },
	{ "+1", -1 },
	{ " 5", -1 },
	{ "5 ", -1 },
	{ "1.0", -1 },
	{ "0014", -1 },         /* more than 3 digits */
	{ "1000", -1 },
};

static void test_status_parse(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(st_rows) / sizeof(st_rows[0]); i++) {
		const struct st_row *r = &st_rows[i];
		int got = grpc_status_parse(r->v, strlen(r->v));
		if (got != r->code)
			fail_msg("grpc-status \"%s\": got %d, want %d", r->v, got, r->code);
	}
	assert_int_equal(grpc_status_parse("140", 2), 14);
	assert_int_equal(grpc_status_parse(NULL, 0), -1);
}

struct to_row {
	int64_t us;
	const char *out;
};

static const struct to_row to_rows[] = {
	{ 0, "0m" },
	{ -5, "0m" },
	{ 1, "1u" },                            /* never "0m" for time that is left */
	{ 999, "999u" },
	{ 1000, "1m" },
	{ 1999, "1m" },                         /* rounded down */
	{ 950 * MS, "950m" },
	{ 1020304 * MS + 5, "1020304m" },       /* every digit, zeros inside kept */
	{ 10 * MS, "10m" },
	{ 100, "100u" },
	{ 5 * S, "5000m" },
	{ 99999999 * MS, "99999999m" },         /* the last that fits 8 digits of ms */
	{ 99999999 * MS + 999, "99999999m" },
	{ 100000000 * MS, "100000S" },
	{ 99999999 * S, "99999999S" },
	{ 100000000 * S, "1666666M" },
	{ 99999999LL * 60 * S, "99999999M" },
	{ 100000000LL * 60 * S, "1666666H" },
	{ 99999999LL * 3600 * S, "99999999H" },
	{ INT64_MAX, "99999999H" },             /* capped: the most gRPC can say */
};

static void test_timeout_format(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(to_rows) / sizeof(to_rows[0]); i++) {
		const struct to_row *r = &to_rows[i];
		char out[16];
		memset(out, 'x', sizeof(out));
		size_t n = grpc_timeout_format(r->us, out);
		if (strcmp(out, r->out) != 0 || n != strlen(r->out))
			fail_msg("grpc-timeout for %lld us: got \"%s\" (%zu), want \"%s\"",
			         (long long)r->us, out, n, r->out);
		/* at most 8 digits and a unit (gRPC over HTTP/2) */
		assert_true(n >= 2 && n <= 9);
	}
}

struct pb_row {
	const char *v;
	bool ok;
	int64_t us;
};

static const struct pb_row pb_rows[] = {
	{ "0", true, 0 },
	{ "300", true, 300 * MS },
	{ "1000", true, 1 * S },
	{ "007", true, 7 * MS },
	{ "99999999999999999999999999", true, INT64_MAX / 2 },  /* saturates, never wraps */
	{ "9223372036854775807", true, INT64_MAX / 2 },
	{ "-1", false, 0 },
	{ "-0", false, 0 },
	{ "+5", false, 0 },
	{ "", false, 0 },
	{ "1.5", false, 0 },
	{ " 5", false, 0 },
	{ "5 ", false, 0 },
	{ "5ms", false, 0 },
	{ "abc", false, 0 },
	{ "99999999999999999999999x", false, 0 },    /* malformed after saturating */
};

static void test_pushback_parse(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(pb_rows) / sizeof(pb_rows[0]); i++) {
		const struct pb_row *r = &pb_rows[i];
		int64_t us = -42;
		bool ok = grpc_pushback_parse(r->v, strlen(r->v), &us);
		if (ok != r->ok || (ok && us != r->us))
			fail_msg("pushback \"%s\": got %d %lld, want %d %lld", r->v, ok, (long long)us,
			         r->ok, (long long)r->us);
	}
	int64_t us = 0;
	assert_false(grpc_pushback_parse(NULL, 0, &us));
}

struct reason_row {
	const char *reason;
	int code;
	int pushback_ms;
};

/* SPEC §10's table, every row */
static const struct reason_row reason_rows[] = {
	{ "bad-deadline", GRPC_INVALID_ARGUMENT, -1 },
	{ "idempotency-key-required", GRPC_INVALID_ARGUMENT, -1 },
	{ "deadline-exceeded", GRPC_DEADLINE_EXCEEDED, -1 },
	{ "body-too-large", GRPC_RESOURCE_EXHAUSTED, -1 },
	{ "headers-too-large", GRPC_RESOURCE_EXHAUSTED, -1 },
	{ "uri-too-long", GRPC_RESOURCE_EXHAUSTED, -1 },
	{ "idempotency-key-mismatch", GRPC_FAILED_PRECONDITION, -1 },
	{ "idempotency-in-progress", GRPC_ABORTED, -1 },
	{ "no-route", GRPC_UNIMPLEMENTED, -1 },
	{ "not-implemented", GRPC_UNIMPLEMENTED, -1 },
	{ "connect-failure", GRPC_UNAVAILABLE, -1 },
	{ "reset", GRPC_UNAVAILABLE, -1 },
	{ "bad-response", GRPC_UNAVAILABLE, -1 },
	{ "timeout", GRPC_UNAVAILABLE, -1 },
	{ "idempotency-store-unavailable", GRPC_UNAVAILABLE, -1 },
	{ "overloaded", GRPC_UNAVAILABLE, 1000 },
	/* not in the table: UNAVAILABLE, no pushback */
	{ "header-timeout", GRPC_UNAVAILABLE, -1 },
	{ "something-new", GRPC_UNAVAILABLE, -1 },
	{ "", GRPC_UNAVAILABLE, -1 },
	{ "Overloaded", GRPC_UNAVAILABLE, -1 },
	{ "no-route ", GRPC_UNAVAILABLE, -1 },
};

static void test_status_for_reason(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(reason_rows) / sizeof(reason_rows[0]); i++) {
		const struct reason_row *r = &reason_rows[i];
		int pb = 12345;
		int code = grpc_status_for_reason(r->reason, &pb);
		if (code != r->code || pb != r->pushback_ms)
			fail_msg("reason \"%s\": got %d/%d, want %d/%d", r->reason, code, pb, r->code,
			         r->pushback_ms);
	}
	int pb = 0;
	assert_int_equal(grpc_status_for_reason(NULL, &pb), GRPC_UNAVAILABLE);
	assert_int_equal(pb, -1);
}

static void test_definite(void **state)
{
	(void)state;
	static const bool definite[GRPC_NCODES] = {
		[GRPC_OK] = true, [GRPC_INVALID_ARGUMENT] = true, [GRPC_NOT_FOUND] = true,
		[GRPC_ALREADY_EXISTS] = true, [GRPC_PERMISSION_DENIED] = true,
		[GRPC_FAILED_PRECONDITION] = true, [GRPC_OUT_OF_RANGE] = true,
		[GRPC_UNIMPLEMENTED] = true, [GRPC_UNAUTHENTICATED] = true,
	};
	for (int c = 0; c < GRPC_NCODES; c++)
		if (grpc_definite(c) != definite[c])
			fail_msg("code %d (%s): definite should be %d", c, names[c], definite[c]);
	assert_false(grpc_definite(-1));
	assert_false(grpc_definite(17));
}

/* what a gRPC client reads: its grpc-status, else gRPC's mapping of the RST_STREAM or the
 * HTTP status it got */
static const struct cc_row {
	int code, http, complete, want;
} cc_rows[] = {
	{ 0, 200, 1, GRPC_OK },
	{ 14, 200, 1, GRPC_UNAVAILABLE },
	{ 13, 200, 0, GRPC_INTERNAL },          /* a status then a cut: the status arrived */
	{ 16, 200, 1, GRPC_UNAUTHENTICATED },
	{ 17, 200, 1, GRPC_UNKNOWN },           /* outside 0..16 */
	{ -1, 200, 0, GRPC_INTERNAL },          /* cut (RST_STREAM INTERNAL_ERROR) */
	{ -1, 0, 0, GRPC_INTERNAL },            /* cut before any head */
	{ -1, 503, 0, GRPC_INTERNAL },
	{ -1, 200, 1, GRPC_UNKNOWN },           /* ended, no status */
	{ -1, 400, 1, GRPC_INTERNAL },
	{ -1, 401, 1, GRPC_UNAUTHENTICATED },
	{ -1, 403, 1, GRPC_PERMISSION_DENIED },
	{ -1, 404, 1, GRPC_UNIMPLEMENTED },
	{ -1, 429, 1, GRPC_UNAVAILABLE },
	{ -1, 502, 1, GRPC_UNAVAILABLE },
	{ -1, 503, 1, GRPC_UNAVAILABLE },
	{ -1, 504, 1, GRPC_UNAVAILABLE },
	{ -1, 500, 1, GRPC_UNKNOWN },
	{ -1, 409, 1, GRPC_UNKNOWN },
	{ -1, 302, 1, GRPC_UNKNOWN },
};

static void test_client_code(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(cc_rows) / sizeof(cc_rows[0]); i++) {
		const struct cc_row *r = &cc_rows[i];
		int got = grpc_client_code(r->code, r->http, r->complete);
		if (got != r->want)
			fail_msg("row %zu (%d, %d, %d): got %d, want %d", i, r->code, r->http,
			         r->complete, got, r->want);
	}
}

static void test_status_field(void **state)
{
	(void)state;
	struct http_hdr f[] = {
		{ .name = "content-type", .nlen = 12, .value = "application/grpc", .vlen = 16 },
		{ .name = "Grpc-Status", .nlen = 11, .value = "14", .vlen = 2 },
	};
	assert_int_equal(grpc_status_field(f, 2), GRPC_UNAVAILABLE);
	assert_int_equal(grpc_status_field(f, 1), -1);
	assert_int_equal(grpc_status_field(NULL, 0), -1);
	f[1].value = "x";
	f[1].vlen = 1;
	assert_int_equal(grpc_status_field(f, 2), -1);
}

static void test_field_kind(void **state)
{
	(void)state;
	static const struct { const char *name; enum grpc_field want; } rows[] = {
		{ "grpc-status", GRPC_F_STATUS },
		{ "Grpc-Status", GRPC_F_STATUS },
		{ "GRPC-STATUS", GRPC_F_STATUS },
		{ "grpc-retry-pushback-ms", GRPC_F_PUSHBACK },
		{ "Grpc-Retry-Pushback-Ms", GRPC_F_PUSHBACK },
		{ "grpc-statue", GRPC_F_OTHER },        /* the length of one, not the name */
		{ "grpc-retry-pushback-mx", GRPC_F_OTHER },
		{ "grpc-message", GRPC_F_OTHER },
		{ "grpc-status-details-bin", GRPC_F_OTHER },
		{ "content-type", GRPC_F_OTHER },
		{ "", GRPC_F_OTHER },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		enum grpc_field got = grpc_field_kind(rows[i].name, strlen(rows[i].name));
		if (got != rows[i].want)
			fail_msg("%s: got %d, want %d", rows[i].name, got, rows[i].want);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names_both_ways),
		cmocka_unit_test(test_names_misses),
		cmocka_unit_test(test_content_type),
		cmocka_unit_test(test_status_parse),
		cmocka_unit_test(test_timeout_format),
		cmocka_unit_test(test_pushback_parse),
		cmocka_unit_test(test_status_for_reason),
		cmocka_unit_test(test_definite),
		cmocka_unit_test(test_client_code),
		cmocka_unit_test(test_status_field),
		cmocka_unit_test(test_field_kind),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
