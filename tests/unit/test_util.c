/*
 * util: duration and size syntax (SPEC §2) row by row, host:port splitting, the small string
 * helpers, the PRNG, request ids and the JSON string escaper.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/util.h"

#define MS 1000LL
#define S  1000000LL

struct num_row {
	const char *in;
	int rc;
	int64_t out;
};

static const struct num_row duration_rows[] = {
	{ "250ms", 0, 250 * MS },
	{ "2s", 0, 2 * S },
	{ "1m", 0, 60 * S },
	{ "24h", 0, 24 * 3600 * S },
	{ "0", 0, 0 },
	{ "0ms", 0, 0 },
	{ "1500", 0, 1500 * MS },          /* bare integer: milliseconds */
	{ "007s", 0, 7 * S },
	{ "2562047788h", 0, 2562047788LL * 3600 * S },   /* the largest whole hour in int64 us */
	{ "9223372036854775ms", 0, 9223372036854775LL * MS },
	{ "", -1, 0 },
	{ "ms", -1, 0 },
	{ "s", -1, 0 },
	{ "1.5s", -1, 0 },                 /* no fractions */
	{ ".5s", -1, 0 },
	{ "1m30s", -1, 0 },                /* no compounds */
	{ "-5s", -1, 0 },                  /* no negatives */
	{ "+5s", -1, 0 },
	{ " 5s", -1, 0 },                  /* no spaces */
	{ "5s ", -1, 0 },
	{ "5 s", -1, 0 },
	{ "5S", -1, 0 },                   /* units as written */
	{ "5sec", -1, 0 },
	{ "5us", -1, 0 },
	{ "5d", -1, 0 },
	{ "1e3", -1, 0 },
	{ "0x10", -1, 0 },
	{ "2562047789h", -1, 0 },          /* int64 microseconds overflow */
	{ "9223372036854776ms", -1, 0 },
	{ "9223372036854775807", -1, 0 },
	{ "99999999999999999999999s", -1, 0 },
};

static const struct num_row size_rows[] = {
	{ "512", 0, 512 },
	{ "512B", 0, 512 },
	{ "64KiB", 0, 64 * 1024 },
	{ "1MiB", 0, 1 << 20 },
	{ "1GiB", 0, 1 << 30 },
	{ "0", 0, 0 },
	{ "8589934591GiB", 0, 8589934591LL << 30 },
	{ "9223372036854775807", 0, INT64_MAX },
	{ "", -1, 0 },
	{ "B", -1, 0 },
	{ "64KB", -1, 0 },                 /* only the IEC units as written */
	{ "64K", -1, 0 },
	{ "64kib", -1, 0 },
	{ "1TiB", -1, 0 },
	{ "1.5MiB", -1, 0 },
	{ "-1", -1, 0 },
	{ " 1", -1, 0 },
	{ "1 KiB", -1, 0 },
	{ "8589934592GiB", -1, 0 },        /* overflow */
	{ "9223372036854775808", -1, 0 },
};

static void test_parse_duration(void **state)
{
	for (size_t i = 0; i < sizeof duration_rows / sizeof *duration_rows; i++) {
		const struct num_row *r = &duration_rows[i];
		int64_t v = -42;
		int rc = parse_duration(r->in, &v);
		if (rc != r->rc || (rc == 0 && v != r->out))
			fail_msg("parse_duration(\"%s\") = %d, %lld; want %d, %lld", r->in, rc,
			         (long long)v, r->rc, (long long)r->out);
		if (rc != 0 && v != -42)
			fail_msg("parse_duration(\"%s\") failed but wrote its output", r->in);
	}
	assert_int_equal(parse_duration(NULL, &(int64_t){ 0 }), -1);
}

static void test_parse_size(void **state)
{
	for (size_t i = 0; i < sizeof size_rows / sizeof *size_rows; i++) {
		const struct num_row *r = &size_rows[i];
		int64_t v = -42;
		int rc = parse_size(r->in, &v);
		if (rc != r->rc || (rc == 0 && v != r->out))
			fail_msg("parse_size(\"%s\") = %d, %lld; want %d, %lld", r->in, rc, (long long)v,
			         r->rc, (long long)r->out);
	}
}

static void test_format_duration(void **state)
{
	static const struct {
		int64_t us;
		const char *out;
	} rows[] = {
		{ 0, "0s" },
		{ 250 * MS, "250ms" },
		{ 5 * S, "5s" },
		{ 90 * S, "90s" },
		{ 60 * S, "1m" },
		{ 3600 * S, "1h" },
		{ 24 * 3600 * S, "24h" },
		{ 1500 * MS, "1500ms" },
		{ 7, "7us" },
	};
	char buf[32];

	for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
		int64_t back;
		format_duration(rows[i].us, buf, sizeof buf);
		assert_string_equal(buf, rows[i].out);
		/* what it prints, parse_duration reads back exactly (at millisecond precision) */
		if (rows[i].us % MS == 0) {
			assert_int_equal(parse_duration(buf, &back), 0);
			assert_int_equal(back, rows[i].us);
		}
	}
	assert_int_equal(format_duration(250 * MS, buf, 3), 5);   /* truncated, like snprintf */
	assert_string_equal(buf, "25");
}

static void test_split_host_port(void **state)
{
	static const struct {
		const char *in;
		int rc;
		const char *host;
		int port;
	} rows[] = {
		{ "127.0.0.1:9001", 0, "127.0.0.1", 9001 },
		{ "payments.internal:8443", 0, "payments.internal", 8443 },
		{ "[::1]:80", 0, "::1", 80 },
		{ "[2001:db8::1]:65535", 0, "2001:db8::1", 65535 },
		{ "a:1", 0, "a", 1 },
		{ "a:0", -1, NULL, 0 },
		{ "a:65536", -1, NULL, 0 },
		{ "a:123456", -1, NULL, 0 },
		{ "a:", -1, NULL, 0 },
		{ ":80", -1, NULL, 0 },
		{ "a", -1, NULL, 0 },
		{ "", -1, NULL, 0 },
		{ "a:8o", -1, NULL, 0 },
		{ "a:+80", -1, NULL, 0 },
		{ "::1:80", -1, NULL, 0 },     /* IPv6 needs brackets */
		{ "[::1]", -1, NULL, 0 },
		{ "[::1]80", -1, NULL, 0 },
		{ "[]:80", -1, NULL, 0 },
		{ "[nothex]:80", -1, NULL, 0 },
		{ "a]:80", -1, NULL, 0 },
	};
	char host[64];
	int port;

	for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
		int rc = split_host_port(rows[i].in, host, sizeof host, &port);
		if (rc != rows[i].rc)
			fail_msg("split_host_port(\"%s\") = %d, want %d", rows[i].in, rc, rows[i].rc);
		if (rc == 0) {
			assert_string_equal(host, rows[i].host);
			assert_int_equal(port, rows[i].port);
		}
	}
	/* the host must fit, NUL included */
	assert_int_equal(split_host_port("abcd:1", host, 5, &port), 0);
	assert_int_equal(split_host_port("abcde:1", host, 5, &port), -1);
}

static void test_str_helpers(void **state)
{
	assert_true(str_ieq("Content-Length", 14, "content-length", 14));
	assert_false(str_ieq("Content-Length", 14, "content-lengt", 13));
	assert_false(str_ieq("abc", 3, "abd", 3));
	assert_true(str_ieq("", 0, "", 0));
	assert_true(str_iprefix("Bearer xyz", 10, "bearer "));
	assert_false(str_iprefix("Bear", 4, "bearer "));
	assert_true(str_iprefix("chunked", 7, ""));
	/* only LEN bytes are looked at */
	assert_false(str_iprefix("gzip, chunked", 3, "gzip"));
}

static void test_rand_next(void **state)
{
	uint64_t s = 1, z = 0, a, b;
	int same = 0;

	a = rand_next(&s);
	b = rand_next(&s);
	assert_true(a != b);
	assert_true(s != 0);
	/* a zero state must not get stuck at zero */
	assert_true(rand_next(&z) != 0);
	assert_true(z != 0);
	/* deterministic per seed */
	s = 12345;
	a = rand_next(&s);
	s = 12345;
	assert_true(rand_next(&s) == a);
	/* roughly uniform top bit over many draws */
	s = 99;
	for (int i = 0; i < 10000; i++)
		same += (int)(rand_next(&s) >> 63);
	assert_in_range(same, 4500, 5500);
}

/* X-Request-Id: 32 lowercase hex digits, every digit used, each id the 128 bits it was drawn
 * from (the digits of one 32-bit word least significant first) */
static void test_request_id(void **state)
{
	uint64_t s = 7, seen[16] = { 0 };
	char id[33];
	for (int n = 0; n < 1000; n++) {
		uint64_t t = s, r1 = rand_next(&t), r2 = rand_next(&t);
		request_id_new(id, &s);
		assert_int_equal(strlen(id), 32);
		assert_true(s == t);
		for (int i = 0; i < 32; i++) {
			char c = id[i];
			assert_true((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
			unsigned d = (unsigned)(c <= '9' ? c - '0' : c - 'a' + 10);
			uint64_t w = i < 16 ? r1 : r2;
			int word = (i % 16) / 8, nib = i % 8;
			assert_int_equal(d, (unsigned)(w >> (32 * word + 4 * nib)) & 15);
			seen[d]++;
		}
	}
	for (int d = 0; d < 16; d++)
		assert_in_range(seen[d], 1500, 2500);    /* 2000 expected */
}

static void test_xalloc(void **state)
{
	char *p = xstrndup("abcdef", 3);
	assert_string_equal(p, "abc");
	p = xrealloc(p, 100);
	assert_string_equal(p, "abc");
	free(p);
	p = xmalloc(0);          /* never NULL, even for 0 */
	assert_non_null(p);
	free(p);
	p = xcalloc(0, 8);
	assert_non_null(p);
	free(p);
	p = xstrdup("");
	assert_string_equal(p, "");
	free(p);
}

/* ------------------------------------------------------------------ json_escape */

struct esc_row {
	const char *name;
	const char *in;
	size_t len;                 /* of in: it may hold a NUL */
	const char *out;
};

#define E(name, in, out) { name, in, sizeof(in) - 1, out }

static const struct esc_row escape_rows[] = {
	E("empty", "", ""),
	E("ASCII", "GET /v1/pay?x=1&y=2", "GET /v1/pay?x=1&y=2"),
	E("quote and backslash", "a\"b\\c", "a\\\"b\\\\c"),
	E("short escapes", "\n\r\t\b\f", "\\n\\r\\t\\b\\f"),
	E("other controls", "\x01\x1f", "\\u0001\\u001f"),
	E("NUL inside", "a\0b", "a\\u0000b"),
	E("DEL", "a\x7f", "a\\u007f"),
	E("2-byte UTF-8", "caf\xc3\xa9", "caf\xc3\xa9"),
	E("3-byte UTF-8", "\xe2\x82\xac 5", "\xe2\x82\xac 5"),
	E("4-byte UTF-8", "\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80"),
	E("highest code point", "\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf"),
	E("stray continuation", "a\x80z", "a\\ufffdz"),
	E("Latin-1 byte", "caf\xe9", "caf\\ufffd"),
	E("truncated 3-byte at the end", "x\xe2\x82", "x\\ufffd\\ufffd"),
	E("truncated 2-byte before ASCII", "\xc3z", "\\ufffdz"),
	E("overlong 2-byte", "\xc0\xaf", "\\ufffd\\ufffd"),
	E("overlong 3-byte", "\xe0\x80\xaf", "\\ufffd\\ufffd\\ufffd"),
	E("surrogate", "\xed\xa0\x80", "\\ufffd\\ufffd\\ufffd"),
	E("above U+10FFFF", "\xf4\x90\x80\x80", "\\ufffd\\ufffd\\ufffd\\ufffd"),
	E("0xff", "\xff", "\\ufffd"),
};

static void test_json_escape(void **state)
{
	char out[128];

	for (size_t i = 0; i < sizeof escape_rows / sizeof *escape_rows; i++) {
		const struct esc_row *r = &escape_rows[i];
		size_t n = json_escape(out, sizeof out, r->in, r->len);
		if (strcmp(out, r->out) != 0 || n != strlen(r->out))
			fail_msg("%s: got \"%s\" (%zu), want \"%s\"", r->name, out, n, r->out);
		/* the documented worst case always holds the whole output */
		char *big = malloc(6 * r->len + 1);
		assert_int_equal(json_escape(big, 6 * r->len + 1, r->in, r->len), strlen(r->out));
		free(big);
	}
	/* a short buffer cuts between pieces, never inside an escape or a character */
	assert_int_equal(json_escape(out, 4, "ab\"c", 4), 2);
	assert_string_equal(out, "ab");
	assert_int_equal(json_escape(out, 4, "a\xc3\xa9", 3), 3);
	assert_string_equal(out, "a\xc3\xa9");
	assert_int_equal(json_escape(out, 3, "a\xc3\xa9", 3), 1);
	assert_string_equal(out, "a");
	assert_int_equal(json_escape(out, 7, "\x01", 1), 6);
	assert_int_equal(json_escape(out, 6, "\x01", 1), 0);
	assert_string_equal(out, "");
	/* NULL is no bytes; a zero capacity writes nothing */
	assert_int_equal(json_escape(out, sizeof out, NULL, 5), 0);
	assert_string_equal(out, "");
	assert_int_equal(json_escape(NULL, 0, "x", 1), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_duration),
		cmocka_unit_test(test_parse_size),
		cmocka_unit_test(test_format_duration),
		cmocka_unit_test(test_split_host_port),
		cmocka_unit_test(test_str_helpers),
		cmocka_unit_test(test_rand_next),
		cmocka_unit_test(test_request_id),
		cmocka_unit_test(test_xalloc),
		cmocka_unit_test(test_json_escape),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
