/*
 * test_deadline: SPEC §3 deadline headers and the Retry-After header of SPEC §4, as tables
 * whose rows read like the SPEC sentences they check.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "policy/deadline.h"

#define MS 1000LL
#define S  1000000LL

/* ---------------------------------------------------------------- deadline_parse */

struct parse_row {
	const char *why;
	enum dl_kind kind;
	const char *v;
	int rc;
	int64_t us;
};

static const struct parse_row parse_rows[] = {
	{ "X-Timeout-Ms is integer milliseconds", DL_X_TIMEOUT_MS, "250", DL_OK, 250 * MS },
	{ "X-Timeout-Ms 0 means already expired", DL_X_TIMEOUT_MS, "0", DL_OK, 0 },
	{ "leading zeros are digits like any other", DL_X_TIMEOUT_MS, "007", DL_OK, 7 * MS },
	{ "surrounding spaces and tabs are allowed", DL_X_TIMEOUT_MS, " \t250\t ", DL_OK, 250 * MS },
	{ "an empty value is malformed", DL_X_TIMEOUT_MS, "", DL_BAD, 0 },
	{ "only whitespace is malformed", DL_X_TIMEOUT_MS, "  \t", DL_BAD, 0 },
	{ "a negative value is malformed", DL_X_TIMEOUT_MS, "-1", DL_BAD, 0 },
	{ "a '+' sign is malformed", DL_X_TIMEOUT_MS, "+5", DL_BAD, 0 },
	{ "a fraction is malformed", DL_X_TIMEOUT_MS, "1.5", DL_BAD, 0 },
	{ "a unit is malformed in an ms header", DL_X_TIMEOUT_MS, "250ms", DL_BAD, 0 },
	{ "hex is malformed", DL_X_TIMEOUT_MS, "0x10", DL_BAD, 0 },
	{ "inner whitespace is malformed", DL_X_TIMEOUT_MS, "1 5", DL_BAD, 0 },
	{ "CR is not whitespace", DL_X_TIMEOUT_MS, "12\r", DL_BAD, 0 },
	{ "VT is not whitespace", DL_X_TIMEOUT_MS, "\v12", DL_BAD, 0 },
	{ "a huge value saturates, it is not malformed", DL_X_TIMEOUT_MS,
	  "99999999999999999999999999999", DL_OK, INT64_MAX / MS * MS },
	{ "the largest exact ms value", DL_X_TIMEOUT_MS, "9223372036854775", DL_OK,
	  9223372036854775 * MS },
	{ "one past it saturates", DL_X_TIMEOUT_MS, "9223372036854776", DL_OK, INT64_MAX / MS * MS },
	{ "a huge value followed by garbage is still malformed", DL_X_TIMEOUT_MS,
	  "99999999999999999999999x", DL_BAD, 0 },

	{ "grpc-timeout H is hours", DL_GRPC_TIMEOUT, "1H", DL_OK, 3600 * S },
	{ "grpc-timeout M is minutes", DL_GRPC_TIMEOUT, "2M", DL_OK, 120 * S },
	{ "grpc-timeout S is seconds", DL_GRPC_TIMEOUT, "3S", DL_OK, 3 * S },
	{ "grpc-timeout m is milliseconds", DL_GRPC_TIMEOUT, "250m", DL_OK, 250 * MS },
	{ "grpc-timeout u is microseconds", DL_GRPC_TIMEOUT, "1500u", DL_OK, 1500 },
	{ "grpc-timeout n is nanoseconds", DL_GRPC_TIMEOUT, "2000n", DL_OK, 2 },
	{ "sub-microsecond nanoseconds round up: 1n is not expired", DL_GRPC_TIMEOUT, "1n", DL_OK, 1 },
	{ "nanoseconds round up to the next microsecond", DL_GRPC_TIMEOUT, "1001n", DL_OK, 2 },
	{ "0n means already expired", DL_GRPC_TIMEOUT, "0n", DL_OK, 0 },
	{ "0m means already expired", DL_GRPC_TIMEOUT, "0m", DL_OK, 0 },
	{ "8 digits are allowed", DL_GRPC_TIMEOUT, "12345678m", DL_OK, 12345678 * MS },
	{ "9 digits are malformed", DL_GRPC_TIMEOUT, "123456789m", DL_BAD, 0 },
	{ "leading zeros count towards the 8 digits", DL_GRPC_TIMEOUT, "000000001S", DL_BAD, 0 },
	{ "8 digits with leading zeros are fine", DL_GRPC_TIMEOUT, "00000001S", DL_OK, 1 * S },
	{ "the largest grpc-timeout does not overflow", DL_GRPC_TIMEOUT, "99999999H", DL_OK,
	  99999999LL * 3600 * S },
	{ "a unit alone is malformed", DL_GRPC_TIMEOUT, "m", DL_BAD, 0 },
	{ "digits without a unit are malformed", DL_GRPC_TIMEOUT, "10", DL_BAD, 0 },
	{ "units are case-sensitive: s is not S", DL_GRPC_TIMEOUT, "10s", DL_BAD, 0 },
	{ "units are case-sensitive: h is not H", DL_GRPC_TIMEOUT, "10h", DL_BAD, 0 },
	{ "an unknown unit is malformed", DL_GRPC_TIMEOUT, "10x", DL_BAD, 0 },
	{ "two units are malformed", DL_GRPC_TIMEOUT, "10mm", DL_BAD, 0 },
	{ "a space before the unit is malformed", DL_GRPC_TIMEOUT, "10 m", DL_BAD, 0 },
	{ "grpc-timeout allows surrounding whitespace", DL_GRPC_TIMEOUT, " 10m\t", DL_OK, 10 * MS },
	{ "a negative grpc-timeout is malformed", DL_GRPC_TIMEOUT, "-1S", DL_BAD, 0 },
	{ "a '+' grpc-timeout is malformed", DL_GRPC_TIMEOUT, "+1S", DL_BAD, 0 },
	{ "a fractional grpc-timeout is malformed", DL_GRPC_TIMEOUT, "1.5S", DL_BAD, 0 },
	{ "an empty grpc-timeout is malformed", DL_GRPC_TIMEOUT, "", DL_BAD, 0 },

	{ "connect-timeout-ms is integer milliseconds", DL_CONNECT_TIMEOUT_MS, "100", DL_OK, 100 * MS },
	{ "connect-timeout-ms 0 means already expired", DL_CONNECT_TIMEOUT_MS, "0", DL_OK, 0 },
	{ "connect-timeout-ms garbage is malformed", DL_CONNECT_TIMEOUT_MS, "abc", DL_BAD, 0 },

	{ "x-envoy-upstream-rq-timeout-ms is milliseconds", DL_ENVOY_UPSTREAM_RQ, "15000", DL_OK,
	  15 * S },
	{ "x-envoy-upstream-rq-timeout-ms 0 means no timeout", DL_ENVOY_UPSTREAM_RQ, "0", DL_NONE, 0 },
	{ "an Envoy 000 is 0 too", DL_ENVOY_UPSTREAM_RQ, "000", DL_NONE, 0 },
	{ "an Envoy -0 is malformed", DL_ENVOY_UPSTREAM_RQ, "-0", DL_BAD, 0 },
	{ "x-envoy-expected-rq-timeout-ms is milliseconds", DL_ENVOY_EXPECTED_RQ, "2000", DL_OK, 2 * S },
	{ "x-envoy-expected-rq-timeout-ms 0 means no timeout", DL_ENVOY_EXPECTED_RQ, " 0 ", DL_NONE, 0 },
	{ "an empty Envoy header is malformed", DL_ENVOY_EXPECTED_RQ, "", DL_BAD, 0 },
};

static void test_parse_table(void **state)
{
	int bad = 0;
	for (size_t i = 0; i < sizeof(parse_rows) / sizeof(parse_rows[0]); i++) {
		const struct parse_row *t = &parse_rows[i];
		int64_t us = -12345;
		int rc = deadline_parse(t->kind, t->v, strlen(t->v), &us);
		if (rc != t->rc || (rc == DL_OK && us != t->us)) {
			print_error("%s: %s \"%s\": got rc %d us %lld, want rc %d us %lld\n", t->why,
			            deadline_header_name[t->kind], t->v, rc, (long long)us, t->rc,
			            (long long)t->us);
			bad++;
		}
	}
	assert_int_equal(bad, 0);
}

/* The parser must respect LEN, not look for a NUL. */
static void test_parse_uses_length(void **state)
{
	int64_t us = 0;
	assert_int_equal(deadline_parse(DL_X_TIMEOUT_MS, "250junk", 3, &us), DL_OK);
	assert_int_equal(us, 250 * MS);
	assert_int_equal(deadline_parse(DL_GRPC_TIMEOUT, "5Sxyz", 2, &us), DL_OK);
	assert_int_equal(us, 5 * S);
	assert_int_equal(deadline_parse(DL_X_TIMEOUT_MS, NULL, 0, &us), DL_BAD);
}

/* ---------------------------------------------------------------- deadline_resolve */

static const struct cfg_deadline dcfg = { .default_us = 5 * S, .max_us = 30 * S, .min_us = 5 * MS };

/* value per kind; NULL: absent. A value starting with '!' is present with conflict=1. */
struct resolve_row {
	const char *why;
	const char *v[DL_NKINDS];
	int rc;
	int64_t us;
	int kind;
};

static const struct resolve_row resolve_rows[] = {
	{ "absent: deadline.default applies", { NULL }, DL_OK, 5 * S, -1 },
	{ "X-Timeout-Ms alone", { "250" }, DL_OK, 250 * MS, DL_X_TIMEOUT_MS },
	{ "the first present wins: X-Timeout-Ms before grpc-timeout", { "250", "1S" }, DL_OK,
	  250 * MS, DL_X_TIMEOUT_MS },
	{ "grpc-timeout alone", { NULL, "1S" }, DL_OK, 1 * S, DL_GRPC_TIMEOUT },
	{ "grpc-timeout before connect-timeout-ms", { NULL, "2S", "100" }, DL_OK, 2 * S,
	  DL_GRPC_TIMEOUT },
	{ "connect-timeout-ms before the Envoy headers", { NULL, NULL, "100", "200", "300" }, DL_OK,
	  100 * MS, DL_CONNECT_TIMEOUT_MS },
	{ "larger than deadline.max: clamped", { "60000" }, DL_OK, 30 * S, DL_X_TIMEOUT_MS },
	{ "exactly deadline.max: kept", { "30000" }, DL_OK, 30 * S, DL_X_TIMEOUT_MS },
	{ "a huge grpc-timeout is clamped", { NULL, "99999999H" }, DL_OK, 30 * S, DL_GRPC_TIMEOUT },
	{ "a saturated X-Timeout-Ms is clamped", { "999999999999999999999999" }, DL_OK, 30 * S,
	  DL_X_TIMEOUT_MS },
	{ "0 means already expired", { "0" }, DL_OK, 0, DL_X_TIMEOUT_MS },
	{ "grpc 0m means already expired", { NULL, "0m" }, DL_OK, 0, DL_GRPC_TIMEOUT },
	{ "connect-timeout-ms 0 means already expired, even with an Envoy header after it",
	  { NULL, NULL, "0", "5000" }, DL_OK, 0, DL_CONNECT_TIMEOUT_MS },
	{ "malformed first present: bad", { NULL, NULL, "abc" }, DL_BAD, 0, 0 },
	{ "malformed first present beats a good later one", { "x", "1S" }, DL_BAD, 0, 0 },
	{ "only the first present header is parsed", { "250", "garbage" }, DL_OK, 250 * MS,
	  DL_X_TIMEOUT_MS },
	{ "Envoy upstream 0 alone counts as absent: the default", { NULL, NULL, NULL, "0" }, DL_OK,
	  5 * S, -1 },
	{ "Envoy upstream 0 passes to the next header", { NULL, NULL, NULL, "0", "2000" }, DL_OK,
	  2 * S, DL_ENVOY_EXPECTED_RQ },
	{ "both Envoy headers 0: the default", { NULL, NULL, NULL, "0", "0" }, DL_OK, 5 * S, -1 },
	{ "Envoy expected 0 alone: the default", { NULL, NULL, NULL, NULL, "0" }, DL_OK, 5 * S, -1 },
	{ "Envoy upstream non-zero is a deadline", { NULL, NULL, NULL, "3000" }, DL_OK, 3 * S,
	  DL_ENVOY_UPSTREAM_RQ },
	{ "Envoy 0 then a malformed Envoy header: bad", { NULL, NULL, NULL, "0", "x" }, DL_BAD, 0, 0 },
	{ "Envoy values are clamped too", { NULL, NULL, NULL, "90000" }, DL_OK, 30 * S,
	  DL_ENVOY_UPSTREAM_RQ },
	{ "a repeated header with different values is malformed", { "!250" }, DL_BAD, 0, 0 },
	{ "a conflict on a later header is not looked at", { "250", "!1S" }, DL_OK, 250 * MS,
	  DL_X_TIMEOUT_MS },
	{ "a conflict on an Envoy 0 is malformed", { NULL, NULL, NULL, "!0", "2000" }, DL_BAD, 0, 0 },
	{ "after an Envoy 0 the next header's conflict counts", { NULL, NULL, NULL, "0", "!2000" },
	  DL_BAD, 0, 0 },
};

static void test_resolve_table(void **state)
{
	int bad = 0;
	for (size_t i = 0; i < sizeof(resolve_rows) / sizeof(resolve_rows[0]); i++) {
		const struct resolve_row *t = &resolve_rows[i];
		struct dl_value vals[DL_NKINDS];
		memset(vals, 0, sizeof(vals));
		for (int k = 0; k < DL_NKINDS; k++) {
			const char *v = t->v[k];
			if (!v)
				continue;
			vals[k].conflict = v[0] == '!';
			v += vals[k].conflict;
			vals[k].v = v;
			vals[k].len = strlen(v);
			vals[k].present = 1;
		}
		int64_t us = -1;
		int kind = -99;
		int rc = deadline_resolve(vals, &dcfg, &us, &kind);
		if (rc != t->rc || (rc == DL_OK && (us != t->us || kind != t->kind))) {
			print_error("%s: got rc %d us %lld kind %d, want rc %d us %lld kind %d\n", t->why,
			            rc, (long long)us, kind, t->rc, (long long)t->us, t->kind);
			bad++;
		}
	}
	assert_int_equal(bad, 0);
}

/* ---------------------------------------------------------------- deadline_header_kind */

struct kind_row {
	const char *why;
	const char *name;
	int kind;
};

static const struct kind_row kind_rows[] = {
	{ "X-Timeout-Ms as SPEC §3 spells it", "X-Timeout-Ms", DL_X_TIMEOUT_MS },
	{ "names are case-insensitive", "x-timeout-ms", DL_X_TIMEOUT_MS },
	{ "grpc-timeout", "GRPC-Timeout", DL_GRPC_TIMEOUT },
	{ "connect-timeout-ms", "connect-timeout-ms", DL_CONNECT_TIMEOUT_MS },
	{ "the Envoy upstream header", "X-Envoy-Upstream-Rq-Timeout-Ms", DL_ENVOY_UPSTREAM_RQ },
	{ "the Envoy expected header", "x-envoy-expected-rq-timeout-ms", DL_ENVOY_EXPECTED_RQ },
	{ "another field of the same length is none", "content-type", -1 },
	{ "a name one byte short is none", "X-Timeout-M", -1 },
	{ "a name one byte long is none", "X-Timeout-Mss", -1 },
	{ "a 30-byte name that is neither Envoy one", "x-envoy-upstream-rq-timeout-us", -1 },
	{ "an empty name is none", "", -1 },
};

static void test_header_kind_table(void **state)
{
	int bad = 0;
	for (size_t i = 0; i < sizeof(kind_rows) / sizeof(kind_rows[0]); i++) {
		const struct kind_row *t = &kind_rows[i];
		int k = deadline_header_kind(t->name, strlen(t->name));
		if (k != t->kind) {
			print_error("%s: \"%s\" is kind %d, want %d\n", t->why, t->name, k, t->kind);
			bad++;
		}
	}
	/* every name the table spells is found as itself */
	for (int k = 0; k < DL_NKINDS; k++)
		assert_int_equal(deadline_header_kind(deadline_header_name[k],
		                                      strlen(deadline_header_name[k])), k);
	assert_int_equal(bad, 0);
}

/* ---------------------------------------------------------------- deadline_format */

struct format_row {
	const char *why;
	enum dl_kind kind;
	int64_t us;
	const char *want;
};

static const struct format_row format_rows[] = {
	{ "ms kinds write whole milliseconds", DL_X_TIMEOUT_MS, 250 * MS, "250" },
	{ "ms kinds floor: 1.999 ms is 1", DL_X_TIMEOUT_MS, 1999, "1" },
	{ "less than 1 ms left is 0", DL_X_TIMEOUT_MS, 999, "0" },
	{ "0 is 0", DL_X_TIMEOUT_MS, 0, "0" },
	{ "a negative remaining time is 0", DL_X_TIMEOUT_MS, -5 * S, "0" },
	{ "the largest value", DL_X_TIMEOUT_MS, INT64_MAX, "9223372036854775" },
	{ "every digit written, in order", DL_X_TIMEOUT_MS, 1234567890 * MS + 999, "1234567890" },
	{ "zeros inside and at the end are kept", DL_X_TIMEOUT_MS, 1000200 * MS, "1000200" },
	{ "connect-timeout-ms floors", DL_CONNECT_TIMEOUT_MS, 2500500, "2500" },
	{ "Envoy upstream floors", DL_ENVOY_UPSTREAM_RQ, 15 * S + 999, "15000" },
	{ "Envoy expected floors", DL_ENVOY_EXPECTED_RQ, 1 * S + 1, "1000" },
	/* gRPC: grpc_timeout_format's whole milliseconds (test_grpc.c has its unit table), so the
	 * rewritten header says the same time as X-Timeout-Ms */
	{ "grpc 0 is 0m", DL_GRPC_TIMEOUT, 0, "0m" },
	{ "grpc below 1 ms is microseconds, not expired", DL_GRPC_TIMEOUT, 1, "1u" },
	{ "grpc: whole milliseconds, as X-Timeout-Ms", DL_GRPC_TIMEOUT, 250999, "250m" },
	{ "grpc: the largest m truncates", DL_GRPC_TIMEOUT, 99999999999LL, "99999999m" },
	{ "grpc: then S", DL_GRPC_TIMEOUT, 100000000000LL, "100000S" },
	{ "grpc: beyond 99999999H says 99999999H", DL_GRPC_TIMEOUT, INT64_MAX, "99999999H" },
	{ "grpc: a negative remaining time is 0m", DL_GRPC_TIMEOUT, -1, "0m" },
};

static void test_format_table(void **state)
{
	int bad = 0;
	for (size_t i = 0; i < sizeof(format_rows) / sizeof(format_rows[0]); i++) {
		const struct format_row *t = &format_rows[i];
		char buf[DEADLINE_FMT_MAX];
		int n = deadline_format(t->kind, t->us, buf, sizeof(buf));
		if (n != (int)strlen(t->want) || strcmp(buf, t->want) != 0) {
			print_error("%s: %s %lld us: got \"%s\" (%d), want \"%s\"\n", t->why,
			            deadline_header_name[t->kind], (long long)t->us, buf, n, t->want);
			bad++;
		}
	}
	assert_int_equal(bad, 0);
}

static void test_format_small_buffer(void **state)
{
	char buf[4];
	/* a truncated number would be a wrong deadline: refuse and leave an empty string */
	assert_int_equal(deadline_format(DL_X_TIMEOUT_MS, 1234 * MS, buf, sizeof(buf)), -1);
	assert_string_equal(buf, "");
	assert_int_equal(deadline_format(DL_X_TIMEOUT_MS, 123 * MS, buf, sizeof(buf)), 3);
	assert_string_equal(buf, "123");
	assert_int_equal(deadline_format(DL_GRPC_TIMEOUT, 1234 * MS, buf, sizeof(buf)), -1);
	assert_int_equal(deadline_format(DL_X_TIMEOUT_MS, 1, buf, 0), -1);
	/* room for the digits but not the NUL: refused too */
	assert_int_equal(deadline_format(DL_X_TIMEOUT_MS, 7 * MS, buf, 1), -1);
	assert_string_equal(buf, "");
	assert_int_equal(deadline_format(DL_GRPC_TIMEOUT, 7 * MS, buf, 3), 2);
	assert_string_equal(buf, "7m");
}

static uint64_t xorshift(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ULL;
}

/* Formatting then parsing never gives the next hop more time than we have, and loses less
 * than one unit of the format used (1 ms for ms kinds; for grpc the unit it chose). */
static void test_format_round_trip(void **state)
{
	static const int64_t fixed[] = { 0, 1, 999, 1000, 99999, 100000, 99999999, 100000000,
	                                 123456789012LL, 30 * S, 3600 * S, INT64_MAX / 2, INT64_MAX };
	uint64_t seed = 0x9e3779b97f4a7c15ULL;
	for (int i = 0; i < 20000; i++) {
		int64_t us;
		if (i < (int)(sizeof(fixed) / sizeof(fixed[0])))
			us = fixed[i];
		else  /* spread over all magnitudes */
			us = (int64_t)(xorshift(&seed) >> (1 + xorshift(&seed) % 63));
		for (int k = 0; k < DL_NKINDS; k++) {
			char buf[DEADLINE_FMT_MAX];
			int n = deadline_format((enum dl_kind)k, us, buf, sizeof(buf));
			assert_true(n > 0);
			int64_t back = -1;
			int rc = deadline_parse((enum dl_kind)k, buf, (size_t)n, &back);
			if (rc == DL_NONE) {
				/* an Envoy "0": only when less than 1 ms was left */
				assert_true(us < MS);
				continue;
			}
			assert_int_equal(rc, DL_OK);
			if (back > us)
				print_error("%s: %lld us -> \"%s\" -> %lld us\n", deadline_header_name[k],
				            (long long)us, buf, (long long)back);
			assert_true(back <= us);
			int64_t unit = MS;
			if (k == DL_GRPC_TIMEOUT) {
				switch (buf[n - 1]) {
				case 'n': case 'u': unit = 1; break;
				case 'm': unit = MS; break;
				case 'S': unit = S; break;
				case 'M': unit = 60 * S; break;
				default: unit = 3600 * S; break;
				}
			}
			if (!(k == DL_GRPC_TIMEOUT && us >= 99999999LL * 3600 * S))
				assert_true(us - back < unit);
		}
	}
}

/* ---------------------------------------------------------------- retry_after_parse */

#define T_1994 784111777LL       /* Sun, 06 Nov 1994 08:49:37 GMT */
#define T_2026 1767225600LL      /* Thu, 01 Jan 2026 00:00:00 GMT */

struct ra_row {
	const char *why;
	const char *v;
	int64_t now;
	int rc;
	int64_t delay_us;
};

static const struct ra_row ra_rows[] = {
	{ "delta-seconds", "120", T_1994, 0, 120 * S },
	{ "Retry-After: 0 means no wait", "0", T_1994, 0, 0 },
	{ "delta-seconds with leading zeros", "007", T_1994, 0, 7 * S },
	{ "surrounding whitespace is allowed", " \t5 ", T_1994, 0, 5 * S },
	{ "huge delta-seconds saturate", "99999999999999999999999", T_1994, 0,
	  INT64_MAX / S * S },
	{ "empty is malformed", "", T_1994, -1, 0 },
	{ "whitespace only is malformed", "  ", T_1994, -1, 0 },
	{ "a negative delta is malformed", "-1", T_1994, -1, 0 },
	{ "a '+' delta is malformed", "+5", T_1994, -1, 0 },
	{ "a fractional delta is malformed", "1.5", T_1994, -1, 0 },
	{ "a unit is malformed", "5s", T_1994, -1, 0 },
	{ "digits then garbage is malformed", "12 GMT", T_1994, -1, 0 },
	{ "garbage is malformed", "soon", T_1994, -1, 0 },

	{ "IMF-fixdate in the future", "Sun, 06 Nov 1994 08:49:37 GMT", T_1994 - 10, 0, 10 * S },
	{ "RFC 850 date in the future", "Sunday, 06-Nov-94 08:49:37 GMT", T_1994 - 10, 0, 10 * S },
	{ "asctime date in the future", "Sun Nov  6 08:49:37 1994", T_1994 - 10, 0, 10 * S },
	{ "asctime with a two-digit day", "Sun Nov 06 08:49:37 1994", T_1994 - 10, 0, 10 * S },
	{ "asctime with a day >= 10", "Wed Nov 16 08:49:37 1994", T_1994, 0, 10 * 86400 * S },
	{ "IMF-fixdate now is no wait", "Sun, 06 Nov 1994 08:49:37 GMT", T_1994, 0, 0 },
	{ "a past date means no wait", "Sun, 06 Nov 1994 08:49:37 GMT", T_1994 + 100, 0, 0 },
	{ "a past RFC 850 date means no wait", "Sunday, 06-Nov-94 08:49:37 GMT", T_1994 + 1, 0, 0 },
	{ "a past asctime date means no wait", "Sun Nov  6 08:49:37 1994", T_1994 + 1, 0, 0 },
	{ "trailing whitespace around a date", "\tSun, 06 Nov 1994 08:49:37 GMT ", T_1994 - 1, 0, S },
	{ "the epoch", "Thu, 01 Jan 1970 00:00:00 GMT", 0, 0, 0 },
	{ "the largest IMF-fixdate", "Fri, 31 Dec 9999 23:59:59 GMT", 0, 0, 253402300799LL * S },
	{ "year 0000 is a (past) date", "Sat, 01 Jan 0000 00:00:00 GMT", T_1994, 0, 0 },
	{ "29 Feb of a leap year", "Thu, 29 Feb 1996 00:00:00 GMT", 825552000LL - 1, 0, S },
	{ "29 Feb 2000 (divisible by 400)", "Tue, 29 Feb 2000 00:00:00 GMT", 951782400LL - 2, 0,
	  2 * S },
	{ "29 Feb 1900 does not exist", "Thu, 29 Feb 1900 00:00:00 GMT", T_1994, -1, 0 },
	{ "29 Feb 1995 does not exist", "Wed, 29 Feb 1995 00:00:00 GMT", T_1994, -1, 0 },
	{ "31 Apr does not exist", "Mon, 31 Apr 1995 00:00:00 GMT", T_1994, -1, 0 },
	{ "day 00 does not exist", "Mon, 00 Jan 1995 00:00:00 GMT", T_1994, -1, 0 },
	{ "31 Dec rolls into the new year", "Sat, 31 Dec 1994 23:59:59 GMT", 788918400LL - 2, 0, S },
	{ "a leap second is accepted", "Sat, 31 Dec 2016 23:59:60 GMT", 1483228800LL - 3, 0, 3 * S },
	{ "hour 24 is malformed", "Sun, 06 Nov 1994 24:00:00 GMT", T_1994, -1, 0 },
	{ "minute 60 is malformed", "Sun, 06 Nov 1994 23:60:00 GMT", T_1994, -1, 0 },
	{ "second 61 is malformed", "Sun, 06 Nov 1994 23:59:61 GMT", T_1994, -1, 0 },
	{ "HTTP-date is case-sensitive: day name", "sun, 06 Nov 1994 08:49:37 GMT", T_1994, -1, 0 },
	{ "HTTP-date is case-sensitive: month", "Sun, 06 NOV 1994 08:49:37 GMT", T_1994, -1, 0 },
	{ "HTTP-date is case-sensitive: GMT", "Sun, 06 Nov 1994 08:49:37 gmt", T_1994, -1, 0 },
	{ "a zone other than GMT is malformed", "Sun, 06 Nov 1994 08:49:37 UTC", T_1994, -1, 0 },
	{ "a numeric zone is malformed", "Sun, 06 Nov 1994 08:49:37 +0000", T_1994, -1, 0 },
	{ "IMF-fixdate needs a two-digit day", "Sun, 6 Nov 1994 08:49:37 GMT", T_1994, -1, 0 },
	{ "IMF-fixdate needs single spaces", "Sun,  06 Nov 1994 08:49:37 GMT", T_1994, -1, 0 },
	{ "IMF-fixdate needs a four-digit year", "Sun, 06 Nov 94 08:49:37 GMT", T_1994, -1, 0 },
	{ "trailing garbage is malformed", "Sun, 06 Nov 1994 08:49:37 GMT x", T_1994, -1, 0 },
	{ "a missing GMT is malformed", "Sun, 06 Nov 1994 08:49:37", T_1994, -1, 0 },
	{ "an unknown day name is malformed", "Fun, 06 Nov 1994 08:49:37 GMT", T_1994, -1, 0 },
	{ "an unknown month is malformed", "Sun, 06 Nox 1994 08:49:37 GMT", T_1994, -1, 0 },
	{ "the day name is not checked against the date", "Mon, 06 Nov 1994 08:49:37 GMT",
	  T_1994 - 1, 0, S },
	{ "RFC 850 needs the long day name", "Sun, 06-Nov-94 08:49:37 GMT", T_1994, -1, 0 },
	{ "RFC 850 needs a two-digit year", "Sunday, 06-Nov-1994 08:49:37 GMT", T_1994, -1, 0 },
	{ "an unknown long day name is malformed", "Funday, 06-Nov-94 08:49:37 GMT", T_1994, -1, 0 },
	{ "asctime with one space before a one-digit day is malformed", "Sun Nov 6 08:49:37 1994",
	  T_1994, -1, 0 },
	{ "asctime with a GMT suffix is malformed", "Sun Nov  6 08:49:37 1994 GMT", T_1994, -1, 0 },
	{ "asctime needs a four-digit year", "Sun Nov  6 08:49:37 94", T_1994, -1, 0 },
	{ "RFC 850 year within 50 years ahead is this century", "Friday, 01-Jan-27 00:00:00 GMT",
	  T_2026, 0, 365LL * 86400 * S },
	{ "RFC 850 year exactly 50 years ahead is this century", "Friday, 01-Jan-76 00:00:00 GMT",
	  T_2026, 0, 18262LL * 86400 * S },
	{ "RFC 850 year more than 50 years ahead is the past century", "Saturday, 01-Jan-77 00:00:00 GMT",
	  T_2026, 0, 0 },
	{ "RFC 850 70 in 2026 is 2070: not more than 50 years ahead", "Tuesday, 01-Jan-70 00:00:00 GMT",
	  T_2026, 0, 16071LL * 86400 * S },
	{ "RFC 850 year 00 in 2026 is 2000: past", "Saturday, 01-Jan-00 00:00:00 GMT", T_2026, 0, 0 },
};

static void test_retry_after_table(void **state)
{
	int bad = 0;
	for (size_t i = 0; i < sizeof(ra_rows) / sizeof(ra_rows[0]); i++) {
		const struct ra_row *t = &ra_rows[i];
		int64_t d = -12345;
		int rc = retry_after_parse(t->v, strlen(t->v), (time_t)t->now, &d);
		if (rc != t->rc || (rc == 0 && d != t->delay_us)) {
			print_error("%s: \"%s\": got rc %d delay %lld, want rc %d delay %lld\n", t->why,
			            t->v, rc, (long long)d, t->rc, (long long)t->delay_us);
			bad++;
		}
	}
	assert_int_equal(bad, 0);
}

/* RFC 850 two-digit years follow the clock: in 2090, "10" is 2110, not 2010. */
static void test_retry_after_century(void **state)
{
	const int64_t t2090 = 3786912000LL;      /* Sun, 01 Jan 2090 00:00:00 GMT */
	const int64_t t2110 = 4417977600LL;      /* Wed, 01 Jan 2110 00:00:00 GMT */
	int64_t d = -1;
	assert_int_equal(retry_after_parse("Wednesday, 01-Jan-10 00:00:00 GMT", 33, (time_t)t2090,
	                                   &d), 0);
	assert_int_equal(d, (t2110 - t2090) * S);
}

/* LEN bounds the value: a date cut short is malformed, the prefix of a number is a number. */
static void test_retry_after_uses_length(void **state)
{
	int64_t d = -1;
	assert_int_equal(retry_after_parse("120garbage", 3, T_1994, &d), 0);
	assert_int_equal(d, 120 * S);
	assert_int_equal(retry_after_parse("Sun, 06 Nov 1994 08:49:37 GMT", 28, T_1994, &d), -1);
	assert_int_equal(retry_after_parse(NULL, 0, T_1994, &d), -1);
}

/* A nonsense wall clock (found by the fuzzer) must not overflow the date arithmetic. */
static void test_retry_after_absurd_clock(void **state)
{
	const char *v[] = { "Sunday, 06-Nov-31 08:49:37 GMT", "Fri, 31 Dec 9999 23:59:59 GMT",
	                    "Sat, 01 Jan 0000 00:00:00 GMT" };
	const time_t nows[] = { (time_t)INT64_MIN, (time_t)INT64_MAX, (time_t)-1 };
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		for (size_t j = 0; j < sizeof(nows) / sizeof(nows[0]); j++) {
			int64_t d = -1;
			assert_int_equal(retry_after_parse(v[i], strlen(v[i]), nows[j], &d), 0);
			assert_true(d >= 0);
		}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_table),
		cmocka_unit_test(test_parse_uses_length),
		cmocka_unit_test(test_resolve_table),
		cmocka_unit_test(test_header_kind_table),
		cmocka_unit_test(test_format_table),
		cmocka_unit_test(test_format_small_buffer),
		cmocka_unit_test(test_format_round_trip),
		cmocka_unit_test(test_retry_after_table),
		cmocka_unit_test(test_retry_after_century),
		cmocka_unit_test(test_retry_after_uses_length),
		cmocka_unit_test(test_retry_after_absurd_clock),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
