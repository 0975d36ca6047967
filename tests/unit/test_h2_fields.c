/*
 * test_h2_fields: the validity of one HTTP/2 field (RFC 9113 §8.2), as nghttp2 judged it —
 * tables of names, values, paths, content-lengths and the regular fields' kinds, each byte
 * class checked against the one nghttp2 1.52 used (lib/nghttp2_helper.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "http/h2_fields.h"

static void test_byte_classes(void **state)
{
	const char *tchar = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz";
	/* RFC 3986 reg-name, IP literal and port: unreserved, sub-delims, ':', '@', '[', ']',
	 * '%' (pct-encoded) */
	const char *auth = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	                   "-._~!$&'()*+,;=:@[]%";
	for (int c = 0; c < 256; c++) {
		bool name = c != 0 && strchr(tchar, c) != NULL;
		bool a = c != 0 && strchr(auth, c) != NULL;
		assert_int_equal(!!(h2f_class[c] & H2F_NAME), name);
		assert_int_equal(!!(h2f_class[c] & H2F_AUTHORITY), a);
	}
}

static void test_values(void **state)
{
	static const struct { const char *v; size_t n; bool ok; } t[] = {
		{ "", 0, true },
		{ "a b\tc", 5, true },
		{ "caf\xc3\xa9 and more bytes", 20, true },
		{ "a\0b", 3, false },
		{ "a\rb", 3, false },
		{ "a\nb", 3, false },
		{ "a\x01" "b", 3, false },
		{ "a\x7f" "b", 3, false },
		{ " a", 2, false },
		{ "\ta", 2, false },
		{ "a ", 2, false },
		{ "a\t", 2, false },
		{ "0123456789abcdef0123456789abcdef", 32, true },
		{ "0123456789abcdef0123456789abcde\r", 32, false },
		{ "01234567\n9abcdef0123456789abcdef", 32, false },
		{ "0123456789abcdef\x80\xff" "23456789abcdef", 32, true },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		assert_int_equal(h2f_value_ok(t[i].v, t[i].n), t[i].ok);
}

static void test_paths(void **state)
{
	assert_true(h2f_path_ok("/a/b?c=d#e", 10));
	assert_true(h2f_path_ok("/caf\xc3\xa9", 6));
	assert_false(h2f_path_ok("/a b", 4));
	assert_false(h2f_path_ok("/a\tb", 4));
	assert_false(h2f_path_ok("/a\x7f", 3));
	assert_false(h2f_path_ok("/aaaaaaaaaaaaaa\x01", 16));
}

static void test_lengths(void **state)
{
	static const struct { const char *v; int64_t want; } t[] = {
		{ "0", 0 }, { "007", 7 }, { "1234", 1234 },
		{ "9223372036854775807", INT64_MAX }, { "9223372036854775808", -2 },
		{ "", -2 }, { "-1", -2 }, { "1x", -2 }, { " 1", -2 }, { "1,1", -2 },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		assert_int_equal(h2f_parse_length(t[i].v, strlen(t[i].v)), t[i].want);
}

static void test_regular_fields(void **state)
{
	static const struct { const char *n, *v; enum h2f_kind k; } t[] = {
		{ "x-a", "1", H2F_OTHER },
		{ "host", "example", H2F_HOST },
		{ "content-length", "12", H2F_CONTENT_LENGTH },
		{ "te", "trailers", H2F_OTHER },
		{ "te", "Trailers", H2F_OTHER },
		{ "te", "gzip", H2F_BAD },
		{ "te", "trailers, gzip", H2F_BAD },
		{ "connection", "close", H2F_BAD },
		{ "keep-alive", "5", H2F_BAD },
		{ "proxy-connection", "x", H2F_BAD },
		{ "transfer-encoding", "chunked", H2F_BAD },
		{ "upgrade", "h2c", H2F_BAD },
		{ "", "1", H2F_BAD },
		{ "X-A", "1", H2F_BAD },
		{ "x a", "1", H2F_BAD },
		{ "x:a", "1", H2F_BAD },
		{ "x-a", " 1", H2F_BAD },
		{ "x-a", "1\r\n", H2F_BAD },
		{ "tea", "x", H2F_OTHER },
		{ "connections", "x", H2F_OTHER },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		assert_int_equal(h2f_regular(t[i].n, strlen(t[i].n), t[i].v, strlen(t[i].v)),
		                 t[i].k);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_byte_classes),
		cmocka_unit_test(test_values),
		cmocka_unit_test(test_paths),
		cmocka_unit_test(test_lengths),
		cmocka_unit_test(test_regular_fields),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
