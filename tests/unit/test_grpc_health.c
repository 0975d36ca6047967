/*
 * test_grpc_health: the hand-made protobuf of grpc.health.v1, row by row: the request bytes
 * for short, empty and long (two-byte length) service names and the buffer bound; the
 * response's status, with unknown fields of every wire type skipped and each malformed form
 * refused (truncated varints and lengths, field 1 of the wrong type, groups); the gRPC
 * length prefix around it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "http/grpc_health.h"

static void test_request_bytes(void **state)
{
	(void)state;
	uint8_t out[512];
	/* "" is the empty message: a prefix of zero length */
	assert_int_equal(grpc_health_request("", 0, out, sizeof(out)), 5);
	assert_memory_equal(out, "\0\0\0\0\0", 5);
	/* field 1, wire type 2 (0x0a), length, bytes */
	assert_int_equal(grpc_health_request("svc", 3, out, sizeof(out)), 10);
	assert_memory_equal(out, "\0\0\0\0\x05\x0a\x03svc", 10);
	/* a 200-byte name has a two-byte varint length: 0xc8 0x01 */
	char name[200];
	memset(name, 'a', sizeof(name));
	assert_int_equal(grpc_health_request(name, 200, out, sizeof(out)), 5 + 3 + 200);
	assert_memory_equal(out, "\0\0\0\0\xcb\x0a\xc8\x01", 8);
	assert_memory_equal(out + 8, name, 200);
	/* what does not fit is refused, exactly at the bound */
	assert_int_equal(grpc_health_request("svc", 3, out, 10), 10);
	assert_int_equal(grpc_health_request("svc", 3, out, 9), 0);
	assert_int_equal(grpc_health_request("", 0, out, 4), 0);
}

struct row {
	const char *bytes;
	size_t n;
	int status;
};

#define R(s, st) { s, sizeof(s) - 1, st }

static void test_decode_table(void **state)
{
	(void)state;
	static const struct row rows[] = {
		R("", GRPC_HEALTH_UNKNOWN),                     /* empty: status 0 */
		R("\x08\x01", GRPC_HEALTH_SERVING),
		R("\x08\x02", GRPC_HEALTH_NOT_SERVING),
		R("\x08\x03", GRPC_HEALTH_SERVICE_UNKNOWN),
		R("\x08\x00", GRPC_HEALTH_UNKNOWN),
		R("\x08\x02\x08\x01", GRPC_HEALTH_SERVING),     /* the last one wins */
		R("\x08\x81\x00", GRPC_HEALTH_SERVING),         /* a non-minimal varint is a varint */
		R("\x08\x96\x01", 150),                         /* a value we do not know */
		/* a negative enum: ten bytes, sign-extended; not a status we know */
		R("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", INT32_MAX),
		/* unknown fields of each wire type are skipped */
		R("\x10\x07\x08\x01", GRPC_HEALTH_SERVING),                 /* 2: varint */
		R("\x19" "12345678" "\x08\x01", GRPC_HEALTH_SERVING),       /* 3: 64-bit */
		R("\x08\x01\x22\x03xyz", GRPC_HEALTH_SERVING),              /* 4: length-delimited */
		R("\x2d" "1234" "\x08\x01", GRPC_HEALTH_SERVING),           /* 5: 32-bit */
		R("\x22\x00\x08\x01", GRPC_HEALTH_SERVING),                 /* an empty one */
		R("\xf8\xff\xff\xff\x0f\x05\x08\x01", GRPC_HEALTH_SERVING), /* a large field number */
		/* malformed */
		R("\x08", -1),                                  /* the value is missing */
		R("\x08\x81", -1),                              /* truncated varint */
		R("\x88", -1),                                  /* truncated key */
		R("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", -1),  /* an 11-byte varint */
		R("\x0a\x01\x01", -1),                          /* field 1 as a string: wrong type */
		R("\x0d" "1234", -1),                           /* field 1 as 32-bit */
		R("\x09" "12345678", -1),                       /* field 1 as 64-bit */
		R("\x22\x05xyz", -1),                           /* a length past the end */
		R("\x22\x80", -1),                              /* a truncated length */
		R("\x19" "1234", -1),                           /* 64-bit, truncated */
		R("\x2d" "12", -1),                             /* 32-bit, truncated */
		R("\x13\x14", -1),                              /* a group (3, 4): not proto3 */
		R("\x0e\x01", -1),                              /* wire type 6 */
		R("\x07\x01", -1),                              /* field 0 */
		R("\x08\x01\x0f", -1),                          /* good status, then wire type 7 */
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		int got = grpc_health_decode((const uint8_t *)rows[i].bytes, rows[i].n);
		if (got != rows[i].status)
			fail_msg("row %zu: got %d, want %d", i, got, rows[i].status);
	}
}

static void test_reply_prefix(void **state)
{
	(void)state;
	static const struct row rows[] = {
		R("\0\0\0\0\x02\x08\x01", GRPC_HEALTH_SERVING),
		R("\0\0\0\0\x02\x08\x02", GRPC_HEALTH_NOT_SERVING),
		R("\0\0\0\0\0", GRPC_HEALTH_UNKNOWN),           /* an empty message */
		R("", -1),                                      /* no message at all */
		R("\0\0\0\0", -1),                              /* a short prefix */
		R("\0\0\0\0\x03\x08\x01", -1),                  /* shorter than its prefix says */
		R("\0\0\0\0\x02\x08\x01\0", -1),                /* trailing bytes: a second message */
		R("\x01\0\0\0\x02\x08\x01", -1),                /* compressed */
		R("\0\0\0\0\x01\x08", -1),                      /* a malformed message inside */
		R("\0\x01\0\0\x02\x08\x01", -1),                /* a length far past the end */
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		int got = grpc_health_reply((const uint8_t *)rows[i].bytes, rows[i].n);
		if (got != rows[i].status)
			fail_msg("row %zu: got %d, want %d", i, got, rows[i].status);
	}
	/* what the request encoder writes, a server would decode the same way: round trip of
	 * the prefix */
	uint8_t out[32];
	size_t n = grpc_health_request("", 0, out, sizeof(out));
	assert_int_equal(grpc_health_reply(out, n), GRPC_HEALTH_UNKNOWN);
}

static void test_names(void **state)
{
	(void)state;
	assert_string_equal(grpc_health_status_name(0), "UNKNOWN");
	assert_string_equal(grpc_health_status_name(1), "SERVING");
	assert_string_equal(grpc_health_status_name(2), "NOT_SERVING");
	assert_string_equal(grpc_health_status_name(3), "SERVICE_UNKNOWN");
	assert_string_equal(grpc_health_status_name(4), "?");
	assert_string_equal(grpc_health_status_name(-1), "?");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_request_bytes),
		cmocka_unit_test(test_decode_table),
		cmocka_unit_test(test_reply_prefix),
		cmocka_unit_test(test_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
