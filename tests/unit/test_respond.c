/*
 * test_respond: the responses retrygate makes, as the client codec receives them: SPEC §10's
 * gRPC errors for every §5 reason (status, Trailers-Only, the fields and their values), the
 * §5 JSON errors beside them, and the room respond_request_id needs after either.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "http/respond.h"

/* The value of field NAME (exact case), or NULL; *COUNT how many there are. */
static const char *field(const struct resp_head *h, const char *name, int *count)
{
	const char *v = NULL;
	static char buf[256];
	int c = 0;
	for (int i = 0; i < h->nhdrs; i++)
		if (h->hdrs[i].nlen == strlen(name) && !memcmp(h->hdrs[i].name, name, h->hdrs[i].nlen)) {
			snprintf(buf, sizeof buf, "%.*s", (int)h->hdrs[i].vlen, h->hdrs[i].value);
			v = buf;
			c++;
		}
	if (count)
		*count = c;
	return v;
}

static void assert_field(const struct resp_head *h, const char *name, const char *want)
{
	int c;
	const char *v = field(h, name, &c);
	if (!want) {
		if (v)
			fail_msg("%s should be absent, is \"%s\"", name, v);
		return;
	}
	if (!v || strcmp(v, want) != 0 || c != 1)
		fail_msg("%s: got \"%s\" (%d), want \"%s\"", name, v ? v : "(none)", c, want);
}

static const struct { const char *reason; const char *code; const char *pushback; } grpc_rows[] = {
	{ "bad-deadline", "3", NULL },
	{ "idempotency-key-required", "3", NULL },
	{ "deadline-exceeded", "4", NULL },
	{ "body-too-large", "8", NULL },
	{ "headers-too-large", "8", NULL },
	{ "uri-too-long", "8", NULL },
	{ "idempotency-key-mismatch", "9", NULL },
	{ "idempotency-in-progress", "10", NULL },
	{ "no-route", "12", NULL },
	{ "not-implemented", "12", NULL },
	{ "connect-failure", "14", NULL },
	{ "reset", "14", NULL },
	{ "bad-response", "14", NULL },
	{ "timeout", "14", NULL },
	{ "idempotency-store-unavailable", "14", NULL },
	{ "overloaded", "14", "1000" },
	{ "header-timeout", "14", NULL },       /* not in the table: unavailable */
};

static void test_grpc_error_rows(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof grpc_rows / sizeof grpc_rows[0]; i++) {
		struct made_response m;
		memset(&m, 0xa5, sizeof m);     /* nothing may be read that was not written */
		respond_grpc_error(&m, grpc_rows[i].reason, "shop", 2, NULL);
		const struct resp_head *h = &m.head;
		assert_int_equal(h->status, 200);
		assert_true(h->end_stream);
		assert_false(h->close);
		assert_int_equal(m.body_len, 0);
		assert_ptr_equal(h->hdrs, m.fields);
		assert_field(h, "content-type", "application/grpc");
		assert_field(h, "grpc-status", grpc_rows[i].code);
		assert_field(h, "grpc-message", grpc_rows[i].reason);
		assert_field(h, "X-Retrygate-Reason", grpc_rows[i].reason);
		assert_field(h, "X-Retrygate-Attempts", "2");
		assert_field(h, "X-Retrygate-Retry-Refused", NULL);
		assert_field(h, "grpc-retry-pushback-ms", grpc_rows[i].pushback);
		assert_field(h, "Retry-After", NULL);
		assert_int_equal(h->nhdrs, grpc_rows[i].pushback ? 6 : 5);
	}
}

static void test_grpc_error_refused_and_request_id(void **state)
{
	(void)state;
	struct made_response m;
	/* the most fields a made response has, then the X-Request-Id appended */
	respond_grpc_error(&m, "overloaded", "shop", 0, "retries-in-flight");
	assert_field(&m.head, "X-Retrygate-Retry-Refused", "retries-in-flight");
	assert_field(&m.head, "X-Retrygate-Attempts", "0");
	assert_int_equal(m.head.nhdrs, 7);
	respond_request_id(&m.head, m.fields, (int)(sizeof m.fields / sizeof m.fields[0]), "rid-1");
	assert_int_equal(m.head.nhdrs, 8);
	assert_field(&m.head, "X-Request-Id", "rid-1");
	assert_field(&m.head, "grpc-status", "14");
	assert_field(&m.head, "grpc-retry-pushback-ms", "1000");
	assert_true(m.head.end_stream);
}

static void test_http_error_unchanged(void **state)
{
	(void)state;
	struct made_response m;
	respond_error(&m, 503, "overloaded", "shop", 1, "budget", "1", false);
	assert_int_equal(m.head.status, 503);
	assert_false(m.head.end_stream);
	assert_field(&m.head, "Content-Type", "application/json");
	assert_field(&m.head, "Retry-After", "1");
	assert_field(&m.head, "grpc-status", NULL);
	assert_int_equal(m.head.content_length, (int64_t)m.body_len);
	static const char want[] = "{\"error\":\"overloaded\",\"upstream\":\"shop\",\"attempts\":1}\n";
	assert_int_equal(m.body_len, sizeof want - 1);
	assert_memory_equal(m.body, want, sizeof want - 1);
	respond_request_id(&m.head, m.fields, (int)(sizeof m.fields / sizeof m.fields[0]), "r");
	assert_field(&m.head, "X-Request-Id", "r");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_grpc_error_rows),
		cmocka_unit_test(test_grpc_error_refused_and_request_id),
		cmocka_unit_test(test_http_error_unchanged),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
