/*
 * test_admit: what a request is before anything is sent, as a table: its route, its
 * deadline, the refusals that need no upstream (SPEC §5 404, 400 bad-deadline, 504, 413,
 * 400 idempotency-key-required, §10's 501 for gRPC to an HTTP/1 upstream) in the order a
 * client sees them, how its body travels, which requests are gRPC and which paths are
 * idempotent whatever the method.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>

/* rows name only what differs from an admitted GET: the rest is zero */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include "proxy/admit.h"
#include "config/config.h"
#include "http/h1_parser.h"

static const char *yaml =
	"listeners:\n"
	"  - name: l\n"
	"    listen: \"127.0.0.1:1\"\n"
	"    limits: { max_body: 1MiB }\n"
	"    routes:\n"
	"      - { host: \"pay\", upstream: pay }\n"
	"      - { path_prefix: \"/api\", upstream: api }\n"
	"      - { path_prefix: \"/shop.\", upstream: shop }\n"
	"      - { path_prefix: \"/legacy.\", upstream: api }\n"
	"upstreams:\n"
	"  pay:\n"
	"    endpoints: [\"127.0.0.1:2\"]\n"
	"    deadline: { default: 2s, max: 10s, min: 50ms }\n"
	"    retry: { max_body: 1KiB }\n"
	"    idempotency: { enabled: true, require_key: true, max_body: 4KiB }\n"
	"  api:\n"
	"    endpoints: [\"127.0.0.1:3\"]\n"
	"    retry: { idempotent_paths: [/legacy.Search/] }\n"
	"  shop:\n"
	"    endpoints: [\"127.0.0.1:4\"]\n"
	"    protocol: h2\n"
	"    retry: { idempotent_paths: [/shop.Catalog/, /shop.Prices/Get] }\n";

#define MS 1000LL

struct row {
	const char *why;
	const char *request;
	int status;                 /* 0: admitted */
	const char *reason;
	bool close;
	const char *upstream;       /* expected route's upstream, NULL: none */
	int64_t budget_us;          /* -1: don't care */
	bool nested, idem, key;
	enum body_mode bmode;
	enum method_class mclass;
	bool h2;                    /* arrived over HTTP/2 (version 20) */
	bool grpc, ipath;           /* admission.grpc, admission.idempotent_path */
};

#define GRPC_POST(path, extra) \
	"POST " path " HTTP/1.1\r\nHost: other\r\ncontent-type: application/grpc\r\n" extra "\r\n"

static const struct row rows[] = {
	{ "no route: 404, the connection stays", "GET /x HTTP/1.1\r\nHost: other\r\n\r\n",
	  404, "no-route", false, NULL, -1 },
	{ "routed by path; the default deadline", "GET /api/v1 HTTP/1.1\r\nHost: other\r\n\r\n",
	  0, NULL, false, "api", 5000 * MS },
	{ "a deadline header is read and clamped to max", "GET / HTTP/1.1\r\nHost: pay\r\nX-Timeout-Ms: 60000\r\n\r\n",
	  0, NULL, false, "pay", 10000 * MS },
	{ "an unparseable deadline: 400 and close", "GET / HTTP/1.1\r\nHost: pay\r\nX-Timeout-Ms: soon\r\n\r\n",
	  400, "bad-deadline", true, "pay", -1 },
	{ "less than deadline.min left: 504 at once", "GET / HTTP/1.1\r\nHost: pay\r\nX-Timeout-Ms: 10\r\n\r\n",
	  504, "deadline-exceeded", false, "pay", 10 * MS },
	{ "grpc-timeout counts too", "GET / HTTP/1.1\r\nHost: pay\r\ngrpc-timeout: 300m\r\n\r\n",
	  0, NULL, false, "pay", 300 * MS },
	{ "a body over limits.max_body: 413 and close",
	  "PUT / HTTP/1.1\r\nHost: pay\r\nContent-Length: 2000000\r\n\r\n", 413, "body-too-large", true, "pay", -1 },
	{ "POST without the key where it is required: 400 and close",
	  "POST / HTTP/1.1\r\nHost: pay\r\nContent-Length: 2\r\n\r\n", 400, "idempotency-key-required", true, "pay", -1,
	  .mclass = MC_OTHER },
	{ "a keyed POST is enforced here and buffered",
	  "POST / HTTP/1.1\r\nHost: pay\r\nIdempotency-Key: k1\r\nContent-Length: 2000\r\n\r\n", 0, NULL, false, "pay", -1,
	  .idem = true, .key = true, .bmode = BODY_BUFFER, .mclass = MC_OTHER },
	{ "a keyed POST over idempotency.max_body: 413",
	  "POST / HTTP/1.1\r\nHost: pay\r\nIdempotency-Key: k1\r\nContent-Length: 5000\r\n\r\n", 413, "body-too-large", true,
	  "pay", -1, .key = true, .idem = true, .mclass = MC_OTHER },
	{ "a PUT over retry.max_body streams (never re-sent)",
	  "PUT / HTTP/1.1\r\nHost: pay\r\nContent-Length: 2000\r\n\r\n", 0, NULL, false, "pay", -1, .bmode = BODY_STREAM },
	{ "a small PUT is buffered for replay",
	  "PUT / HTTP/1.1\r\nHost: pay\r\nContent-Length: 20\r\n\r\n", 0, NULL, false, "pay", -1, .bmode = BODY_BUFFER },
	{ "a chunked body is buffered (it may still outgrow the limit)",
	  "PUT / HTTP/1.1\r\nHost: pay\r\nTransfer-Encoding: chunked\r\n\r\n", 0, NULL, false, "pay", -1, .bmode = BODY_BUFFER },
	{ "an empty key is no key", "PUT / HTTP/1.1\r\nHost: pay\r\nIdempotency-Key: \r\n\r\n", 0, NULL, false, "pay", -1 },
	{ "marked as a retry by a deeper retrygate", "GET / HTTP/1.1\r\nHost: pay\r\nX-Retrygate-Attempt: 2\r\n\r\n",
	  0, NULL, false, "pay", -1, .nested = true },
	{ "attempt 1 is not a retry", "GET / HTTP/1.1\r\nHost: pay\r\nX-Retrygate-Attempt: 1\r\n\r\n",
	  0, NULL, false, "pay", -1 },
	{ "marked by Envoy", "GET / HTTP/1.1\r\nHost: pay\r\nx-envoy-attempt-count: 3\r\n\r\n",
	  0, NULL, false, "pay", -1, .nested = true },
	{ "marked by a gRPC client's own retries", "GET / HTTP/1.1\r\nHost: pay\r\ngrpc-previous-rpc-attempts: 1\r\n\r\n",
	  0, NULL, false, "pay", -1, .nested = true },
	{ "the marker's name is case-insensitive", "GET / HTTP/1.1\r\nHost: pay\r\nx-retrygate-attempt: 2\r\n\r\n",
	  0, NULL, false, "pay", -1, .nested = true },
	{ "the first of two markers is the one read",
	  "GET / HTTP/1.1\r\nHost: pay\r\nX-Retrygate-Attempt: 1\r\nX-Retrygate-Attempt: 2\r\n\r\n",
	  0, NULL, false, "pay", -1 },
	{ "the first of two keys is the key, the idempotency header's case does not matter",
	  "POST / HTTP/1.1\r\nHost: pay\r\nidempotency-key: k1\r\nIdempotency-Key: \r\nContent-Length: 2\r\n\r\n",
	  0, NULL, false, "pay", -1, .idem = true, .key = true, .bmode = BODY_BUFFER, .mclass = MC_OTHER },
	{ "an empty first key is no key, whatever follows",
	  "PUT / HTTP/1.1\r\nHost: pay\r\nIdempotency-Key: \r\nIdempotency-Key: k2\r\n\r\n", 0, NULL, false,
	  "pay", -1 },

	/* SPEC §10: gRPC is HTTP/2 with a gRPC content-type */
	{ "a gRPC call over HTTP/2", GRPC_POST("/shop.Cart/Add", ""), 0, NULL, false, "shop", -1,
	  .h2 = true, .grpc = true, .mclass = MC_OTHER },
	{ "application/grpc+proto is gRPC",
	  "POST /shop.Cart/Add HTTP/1.1\r\nHost: other\r\ncontent-type: application/grpc+proto\r\n\r\n",
	  0, NULL, false, "shop", -1, .h2 = true, .grpc = true, .mclass = MC_OTHER },
	{ "the first content-type decides",
	  "POST /shop.Cart/Add HTTP/1.1\r\nHost: other\r\ncontent-type: text/plain\r\ncontent-type: application/grpc\r\n\r\n",
	  0, NULL, false, "shop", -1, .h2 = true, .mclass = MC_OTHER },
	{ "the content-type's case does not matter",
	  "POST /shop.Cart/Add HTTP/1.1\r\nHost: other\r\nContent-Type: Application/GRPC;x=y\r\n\r\n",
	  0, NULL, false, "shop", -1, .h2 = true, .grpc = true, .mclass = MC_OTHER },
	{ "gRPC-Web is not gRPC",
	  "POST /shop.Cart/Add HTTP/1.1\r\nHost: other\r\ncontent-type: application/grpc-web\r\n\r\n",
	  0, NULL, false, "shop", -1, .h2 = true, .mclass = MC_OTHER },
	{ "HTTP/2 without a content-type is not gRPC",
	  "POST /shop.Cart/Add HTTP/1.1\r\nHost: other\r\n\r\n", 0, NULL, false, "shop", -1,
	  .h2 = true, .mclass = MC_OTHER },
	{ "a gRPC content-type over HTTP/1.1 is a plain POST", GRPC_POST("/legacy.Cart/Add", ""),
	  0, NULL, false, "api", -1, .mclass = MC_OTHER },
	{ "gRPC to an upstream without protocol h2: 501 not-implemented",
	  GRPC_POST("/legacy.Cart/Add", ""), 501, "not-implemented", true, "api", -1, .h2 = true },
	{ "the 501 comes before a bad deadline", GRPC_POST("/legacy.Cart/Add", "grpc-timeout: soon\r\n"),
	  501, "not-implemented", true, "api", -1, .h2 = true },
	{ "a gRPC call's grpc-timeout is its deadline", GRPC_POST("/shop.Cart/Add", "grpc-timeout: 2S\r\n"),
	  0, NULL, false, "shop", 2000 * MS, .h2 = true, .grpc = true, .mclass = MC_OTHER },
	{ "grpc-previous-rpc-attempts 0: a first try",
	  GRPC_POST("/shop.Cart/Add", "grpc-previous-rpc-attempts: 0\r\n"), 0, NULL, false, "shop", -1,
	  .h2 = true, .grpc = true, .mclass = MC_OTHER },
	{ "grpc-previous-rpc-attempts 2: the client retries itself, one attempt here",
	  GRPC_POST("/shop.Cart/Add", "grpc-previous-rpc-attempts: 2\r\n"), 0, NULL, false, "shop", -1,
	  .h2 = true, .grpc = true, .nested = true, .mclass = MC_OTHER },
	{ "an unreadable grpc-previous-rpc-attempts on a gRPC call is not 0: nested",
	  GRPC_POST("/shop.Cart/Add", "grpc-previous-rpc-attempts: x\r\n"), 0, NULL, false, "shop", -1,
	  .h2 = true, .grpc = true, .nested = true, .mclass = MC_OTHER },
	{ "an empty grpc-previous-rpc-attempts on a gRPC call is not 0: nested",
	  GRPC_POST("/shop.Cart/Add", "grpc-previous-rpc-attempts: \r\n"), 0, NULL, false, "shop", -1,
	  .h2 = true, .grpc = true, .nested = true, .mclass = MC_OTHER },

	/* retry.idempotent_paths: the path without its query, any method, HTTP too */
	{ "a gRPC call under an idempotent path", GRPC_POST("/shop.Catalog/List", ""), 0, NULL,
	  false, "shop", -1, .h2 = true, .grpc = true, .ipath = true, .mclass = MC_IDEMPOTENT },
	{ "an exact idempotent path", GRPC_POST("/shop.Prices/Get", ""), 0, NULL, false, "shop", -1,
	  .h2 = true, .grpc = true, .ipath = true, .mclass = MC_IDEMPOTENT },
	{ "a path shorter than the prefix is not under it", GRPC_POST("/shop.Catalog", ""), 0, NULL,
	  false, "shop", -1, .h2 = true, .grpc = true, .mclass = MC_OTHER },
	{ "the prefix is case-sensitive", GRPC_POST("/shop.catalog/List", ""), 0, NULL, false,
	  "shop", -1, .h2 = true, .grpc = true, .mclass = MC_OTHER },
	{ "an HTTP POST under an idempotent path, its query ignored",
	  "POST /legacy.Search/q?x=/y HTTP/1.1\r\nHost: other\r\n\r\n", 0, NULL, false, "api", -1,
	  .ipath = true, .mclass = MC_IDEMPOTENT },
	{ "the prefix in the query does not count",
	  "POST /legacy.?p=/legacy.Search/ HTTP/1.1\r\nHost: other\r\n\r\n", 0, NULL, false,
	  "api", -1, .mclass = MC_OTHER },
	{ "another upstream's idempotent paths do not apply",
	  "POST /api/legacy.Search/ HTTP/1.1\r\nHost: other\r\n\r\n", 0, NULL, false, "api", -1,
	  .mclass = MC_OTHER },
};

static void test_rows(void **state)
{
	static const struct http_limits lim = { .max_header_bytes = 32768, .max_uri_bytes = 8192 };
	struct config *c = config_load_buffer("t.yaml", yaml, strlen(yaml), stderr);
	assert_non_null(c);
	int failed = 0;
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		const struct row *r = &rows[i];
		struct http_msg *m = http_msg_new(HTTP_REQUEST_KIND, &lim);
		struct evbuffer *in = evbuffer_new(), *body = evbuffer_new();
		evbuffer_add(in, r->request, strlen(r->request));
		assert_int_equal(http_msg_feed(m, in, body, 0), HTTP_HEAD);
		struct admission a;
		struct http_head h = *http_msg_head(m);
		if (r->h2)
			h.version = 20;
		admit_request(&c->listeners[0], &h, &a);
		const char *up = a.route ? a.route->upstream->name : NULL;
		bool ok = a.status == r->status && a.close == r->close &&
		          (r->reason ? a.reason && strcmp(a.reason, r->reason) == 0 : !a.reason) &&
		          (r->upstream ? up && strcmp(up, r->upstream) == 0 : !up) &&
		          (r->budget_us < 0 || a.budget_us == r->budget_us) &&
		          (r->status || (a.nested == r->nested && a.idem == r->idem &&
		                         (a.key != NULL) == r->key && a.bmode == r->bmode &&
		                         a.mclass == r->mclass && a.grpc == r->grpc &&
		                         a.idempotent_path == r->ipath));
		if (!ok) {
			printf("row %zu (%s): status %d reason %s close %d upstream %s budget %lld nested %d "
			       "idem %d key %d bmode %d mclass %d grpc %d ipath %d\n", i, r->why, a.status,
			       a.reason ? a.reason : "-", a.close, up ? up : "-", (long long)a.budget_us,
			       a.nested, a.idem, a.key != NULL, a.bmode, a.mclass, a.grpc, a.idempotent_path);
			failed++;
		}
		http_msg_free(m);
		evbuffer_free(in);
		evbuffer_free(body);
	}
	config_unref(c);
	assert_int_equal(failed, 0);
}

static void test_response_nested(void **state)
{
	static const struct http_limits lim = { .max_header_bytes = 32768, .max_uri_bytes = 8192 };
	static const struct { const char *resp; bool nested; } t[] = {
		{ "HTTP/1.1 503 x\r\nContent-Length: 0\r\n\r\n", false },
		{ "HTTP/1.1 503 x\r\nX-Retrygate-Attempts: 1\r\nContent-Length: 0\r\n\r\n", false },
		{ "HTTP/1.1 503 x\r\nX-Retrygate-Attempts: 2\r\nContent-Length: 0\r\n\r\n", true },
		{ "HTTP/1.1 503 x\r\nX-Retrygate-Retry-Refused: budget\r\nContent-Length: 0\r\n\r\n", true },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct http_msg *m = http_msg_new(HTTP_RESPONSE_KIND, &lim);
		struct evbuffer *in = evbuffer_new(), *body = evbuffer_new();
		evbuffer_add(in, t[i].resp, strlen(t[i].resp));
		http_msg_expect(m, false);
		assert_int_equal(http_msg_feed(m, in, body, 0), HTTP_HEAD);
		assert_int_equal(admit_response_nested(http_msg_head(m)), t[i].nested);
		http_msg_free(m);
		evbuffer_free(in);
		evbuffer_free(body);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rows),
		cmocka_unit_test(test_response_nested),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
