/*
 * test_forward: the upstream request head as a table (SPEC §3 deadline rewriting, §4 markers,
 * §8 hop-by-hop removal, X-Forwarded-*, X-Request-Id, Host, framing, §10 gRPC markers). Each row is a raw
 * client request, parsed by the real parser, the attempt's facts, and the exact head sent.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "proxy/forward.h"
#include "http/h1_parser.h"

struct row {
	const char *why;
	const char *request;        /* raw bytes from the client */
	const char *host_rewrite;
	bool tls, nested, streamed;
	int attempt;                /* 0: 1 */
	int64_t wait_ms;            /* 0: 950 */
	int64_t body_len;
	const char *expect;         /* the head sent upstream */
};

#define STD_TAIL "X-Forwarded-For: 10.0.0.9\r\nX-Forwarded-Proto: http\r\nX-Request-Id: rid\r\n" \
                 "X-Timeout-Ms: 950\r\nX-Retrygate-Attempt: 1\r\n"

static const struct row rows[] = {
	{ "a plain GET: Host kept, our hop, an id, the attempt's time and number",
	  "GET /a?b=1 HTTP/1.1\r\nHost: svc\r\nAccept: */*\r\n\r\n", .expect =
	  "GET /a?b=1 HTTP/1.1\r\nHost: svc\r\nAccept: */*\r\n" STD_TAIL "\r\n" },
	{ "hop-by-hop fields and what Connection lists are not forwarded",
	  "GET / HTTP/1.1\r\nHost: svc\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n"
	  "Keep-Alive: timeout=5\r\nProxy-Connection: x\r\nTE: trailers\r\nX-End: 2\r\n\r\n", .expect =
	  "GET / HTTP/1.1\r\nHost: svc\r\nX-End: 2\r\n" STD_TAIL "\r\n" },
	{ "X-Forwarded-For: earlier lines as they came, the last gets our hop",
	  "GET / HTTP/1.1\r\nHost: svc\r\nX-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2\r\n"
	  "X-Forwarded-Proto: https\r\n\r\n", .expect =
	  "GET / HTTP/1.1\r\nHost: svc\r\nX-Forwarded-For: 1.1.1.1\r\n"
	  "X-Forwarded-For: 2.2.2.2, 10.0.0.9\r\nX-Forwarded-Proto: https, http\r\n"
	  "X-Request-Id: rid\r\nX-Timeout-Ms: 950\r\nX-Retrygate-Attempt: 1\r\n\r\n" },
	{ "a TLS client: X-Forwarded-Proto https",
	  "GET / HTTP/1.1\r\nHost: svc\r\n\r\n", .tls = true, .expect =
	  "GET / HTTP/1.1\r\nHost: svc\r\nX-Forwarded-For: 10.0.0.9\r\nX-Forwarded-Proto: https\r\n"
	  "X-Request-Id: rid\r\nX-Timeout-Ms: 950\r\nX-Retrygate-Attempt: 1\r\n\r\n" },
	{ "the client's X-Request-Id is kept, none added",
	  "GET / HTTP/1.1\r\nHost: svc\r\nX-Request-Id: abc\r\n\r\n", .expect =
	  "GET / HTTP/1.1\r\nHost: svc\r\nX-Request-Id: abc\r\nX-Forwarded-For: 10.0.0.9\r\n"
	  "X-Forwarded-Proto: http\r\nX-Timeout-Ms: 950\r\nX-Retrygate-Attempt: 1\r\n\r\n" },
	{ "every deadline header the client sent is rewritten to the attempt's time",
	  "GET / HTTP/1.1\r\nHost: svc\r\nX-Timeout-Ms: 4000\r\ngrpc-timeout: 4S\r\n"
	  "x-envoy-upstream-rq-timeout-ms: 0\r\n\r\n", .wait_ms = 250, .expect =
	  "GET / HTTP/1.1\r\nHost: svc\r\nX-Forwarded-For: 10.0.0.9\r\nX-Forwarded-Proto: http\r\n"
	  "X-Request-Id: rid\r\nX-Timeout-Ms: 250\r\ngrpc-timeout: 250m\r\n"
	  "x-envoy-upstream-rq-timeout-ms: 250\r\nX-Retrygate-Attempt: 1\r\n\r\n" },
	{ "host_rewrite replaces the client's Host",
	  "GET / HTTP/1.1\r\nHost: outside.example\r\n\r\n", .host_rewrite = "inside", .expect =
	  "GET / HTTP/1.1\r\nHost: inside\r\n" STD_TAIL "\r\n" },
	{ "an HTTP/1.0 request without Host gets the endpoint's name",
	  "GET / HTTP/1.0\r\n\r\n", .expect =
	  "GET / HTTP/1.1\r\nHost: 127.0.0.1:9001\r\n" STD_TAIL "\r\n" },
	{ "a retry: our marker says 2, the client's own marker is dropped",
	  "GET / HTTP/1.1\r\nHost: svc\r\nX-Retrygate-Attempt: 1\r\n\r\n", .attempt = 2, .expect =
	  "GET / HTTP/1.1\r\nHost: svc\r\nX-Forwarded-For: 10.0.0.9\r\nX-Forwarded-Proto: http\r\n"
	  "X-Request-Id: rid\r\nX-Timeout-Ms: 950\r\nX-Retrygate-Attempt: 2\r\n\r\n" },
	{ "a request marked as a retry goes on with its markers unchanged and none of ours",
	  "GET / HTTP/1.1\r\nHost: svc\r\nX-Retrygate-Attempt: 3\r\n\r\n", .nested = true, .expect =
	  "GET / HTTP/1.1\r\nHost: svc\r\nX-Retrygate-Attempt: 3\r\nX-Forwarded-For: 10.0.0.9\r\n"
	  "X-Forwarded-Proto: http\r\nX-Request-Id: rid\r\nX-Timeout-Ms: 950\r\n\r\n" },
	{ "a buffered body: Content-Length computed here",
	  "POST / HTTP/1.1\r\nHost: svc\r\nContent-Length: 5\r\n\r\n", .body_len = 5, .expect =
	  "POST / HTTP/1.1\r\nHost: svc\r\n" STD_TAIL "Content-Length: 5\r\n\r\n" },
	{ "a buffered chunked body goes with its length, not chunked",
	  "POST / HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\n\r\n", .body_len = 12, .expect =
	  "POST / HTTP/1.1\r\nHost: svc\r\n" STD_TAIL "Content-Length: 12\r\n\r\n" },
	{ "an empty buffered body that had framing: Content-Length: 0",
	  "POST / HTTP/1.1\r\nHost: svc\r\nContent-Length: 0\r\n\r\n", .expect =
	  "POST / HTTP/1.1\r\nHost: svc\r\n" STD_TAIL "Content-Length: 0\r\n\r\n" },
	{ "a streamed body keeps the client's length, and Expect goes along",
	  "PUT / HTTP/1.1\r\nHost: svc\r\nExpect: 100-continue\r\nContent-Length: 99999\r\n\r\n",
	  .streamed = true, .expect =
	  "PUT / HTTP/1.1\r\nHost: svc\r\n" STD_TAIL
	  "Expect: 100-continue\r\nContent-Length: 99999\r\n\r\n" },
	{ "a buffered body: we answered 100-continue ourselves, Expect is not forwarded",
	  "PUT / HTTP/1.1\r\nHost: svc\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
	  .body_len = 3, .expect =
	  "PUT / HTTP/1.1\r\nHost: svc\r\n" STD_TAIL "Content-Length: 3\r\n\r\n" },
	{ "a streamed chunked body stays chunked",
	  "POST / HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\n\r\n", .streamed = true,
	  .expect = "POST / HTTP/1.1\r\nHost: svc\r\n" STD_TAIL "Transfer-Encoding: chunked\r\n\r\n" },
	{ "an Upgrade request carries Connection: upgrade and its Upgrade token",
	  "GET /ws HTTP/1.1\r\nHost: svc\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", .expect =
	  "GET /ws HTTP/1.1\r\nHost: svc\r\n" STD_TAIL "Connection: upgrade\r\nUpgrade: websocket\r\n\r\n" },
	{ "an absolute-form target goes as origin-form",
	  "GET http://svc/x HTTP/1.1\r\nHost: svc\r\n\r\n", .expect =
	  "GET /x HTTP/1.1\r\nHost: svc\r\n" STD_TAIL "\r\n" },
};

static const struct http_limits lim = { .max_header_bytes = 32768, .max_uri_bytes = 8192 };

/* A raw request parsed by the real parser, with the deadline headers it carried. */
struct parsed {
	struct http_msg *m;
	struct evbuffer *in, *body;
	struct dl_value vals[DL_NKINDS];
	bool present[DL_NKINDS];
};

static const struct http_head *parse(struct parsed *p, const char *request)
{
	p->m = http_msg_new(HTTP_REQUEST_KIND, &lim);
	p->in = evbuffer_new();
	p->body = evbuffer_new();
	evbuffer_add(p->in, request, strlen(request));
	assert_int_equal(http_msg_feed(p->m, p->in, p->body, 0), HTTP_HEAD);
	const struct http_head *h = http_msg_head(p->m);
	deadline_collect(h->hdrs, h->nhdrs, p->vals, p->present);
	return h;
}

static void parsed_free(struct parsed *p)
{
	http_msg_free(p->m);
	evbuffer_free(p->in);
	evbuffer_free(p->body);
}

/* 1 (and the two texts printed) when OUT is not EXPECT */
static int differs(struct evbuffer *out, const char *expect, const char *what, size_t i,
                   const char *why)
{
	size_t n = evbuffer_get_length(out);
	const char *got = (const char *)evbuffer_pullup(out, -1);
	if (n == strlen(expect) && memcmp(got, expect, n) == 0)
		return 0;
	printf("%s %zu (%s):\n--- expected\n%s--- got\n%.*s---\n", what, i, why, expect, (int)n, got);
	return 1;
}

static void test_rows(void **state)
{
	int failed = 0;
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		const struct row *r = &rows[i];
		struct parsed pr;
		const struct http_head *h = parse(&pr, r->request);
		bool *present = pr.present;
		struct evbuffer *out = evbuffer_new();
		struct forward_req f = {
			.req = h,
			.host_rewrite = r->host_rewrite,
			.endpoint = "127.0.0.1:9001",
			.peer_ip = "10.0.0.9",
			.tls = r->tls,
			.reqid = "rid",
			.dl_present = present,
			.wait_us = (r->wait_ms ? r->wait_ms : 950) * 1000,
			.attempt = r->attempt ? r->attempt : 1,
			.nested = r->nested,
			.streamed = r->streamed,
			.body_len = r->body_len,
		};
		forward_h1_head(&f, out);
		failed += differs(out, r->expect, "row", i, r->why);
		parsed_free(&pr);
		evbuffer_free(out);
	}
	assert_int_equal(failed, 0);
}

/* HTTP/2 upstream (SPEC §9 mapping): the field list, one "name: value\n" line a field */
struct h2row {
	const char *why;
	const char *request;
	const char *host_rewrite;
	bool up_tls, streamed;
	int64_t body_len;
	const char *expect;
	bool grpc, nested;
	int attempt;                /* 0: 1 */
	int64_t wait_us;            /* 0: 950 ms */
};

#define H2_TAIL "x-forwarded-for: 10.0.0.9\nx-forwarded-proto: http\nx-request-id: rid\n" \
                "x-timeout-ms: 950\nx-retrygate-attempt: 1\n"
#define H2_ID "x-forwarded-for: 10.0.0.9\nx-forwarded-proto: http\nx-request-id: rid\n"
#define GRPC_REQ(extra) \
	"POST /shop.Cart/Add HTTP/1.1\r\nHost: svc\r\ncontent-type: application/grpc\r\n" extra "\r\n"
#define GRPC_HEAD ":method: POST\n:scheme: http\n:authority: svc\n:path: /shop.Cart/Add\n" \
                  "content-type: application/grpc\n"

static const struct h2row h2rows[] = {
	{ "pseudo-headers first, :authority from Host, no host field, names lowercased",
	  "GET /a?b=1 HTTP/1.1\r\nHost: svc:8080\r\nAccept: */*\r\nX-Mixed-Case: V\r\n\r\n",
	  .expect = ":method: GET\n:scheme: http\n:authority: svc:8080\n:path: /a?b=1\n"
	  "accept: */*\nx-mixed-case: V\n" H2_TAIL },
	{ "with tls :scheme is https; host_rewrite names the :authority",
	  "GET / HTTP/1.1\r\nHost: outside\r\n\r\n", .up_tls = true, .host_rewrite = "inside",
	  .expect = ":method: GET\n:scheme: https\n:authority: inside\n:path: /\n" H2_TAIL },
	{ "hop-by-hop and connection-specific fields are not forwarded; TE: trailers becomes te",
	  "GET / HTTP/1.1\r\nHost: svc\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n"
	  "Keep-Alive: timeout=5\r\nProxy-Connection: x\r\nTE: trailers\r\nUpgrade: foo\r\n"
	  "X-End: 2\r\n\r\n",
	  .expect = ":method: GET\n:scheme: http\n:authority: svc\n:path: /\nx-end: 2\n" H2_TAIL
	  "te: trailers\n" },
	{ "a TE without trailers is dropped",
	  "GET / HTTP/1.1\r\nHost: svc\r\nTE: gzip\r\nConnection: TE\r\n\r\n",
	  .expect = ":method: GET\n:scheme: http\n:authority: svc\n:path: /\n" H2_TAIL },
	{ "a buffered body: its length",
	  "POST /p HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\n\r\n", .body_len = 7,
	  .expect = ":method: POST\n:scheme: http\n:authority: svc\n:path: /p\n" H2_TAIL
	  "content-length: 7\n" },
	{ "a streamed chunked body: no length and never transfer-encoding",
	  "POST /p HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\n\r\n", .streamed = true,
	  .expect = ":method: POST\n:scheme: http\n:authority: svc\n:path: /p\n" H2_TAIL },
	{ "a streamed body with a length keeps it",
	  "PUT /p HTTP/1.1\r\nHost: svc\r\nContent-Length: 99999\r\n\r\n", .streamed = true,
	  .expect = ":method: PUT\n:scheme: http\n:authority: svc\n:path: /p\n" H2_TAIL
	  "content-length: 99999\n" },
	{ "no Host (HTTP/1.0): the endpoint is the :authority",
	  "GET / HTTP/1.0\r\n\r\n",
	  .expect = ":method: GET\n:scheme: http\n:authority: 127.0.0.1:9001\n:path: /\n" H2_TAIL },

	/* SPEC §10: a gRPC call's markers */
	{ "gRPC: te: trailers and grpc-timeout in milliseconds though the client sent neither",
	  GRPC_REQ(""), .grpc = true, .expect = GRPC_HEAD H2_ID
	  "x-timeout-ms: 950\ngrpc-timeout: 950m\nx-retrygate-attempt: 1\nte: trailers\n" },
	{ "gRPC: the client's grpc-timeout is replaced and its TE gives exactly one te",
	  GRPC_REQ("TE: trailers\r\ngrpc-timeout: 5S\r\n"), .grpc = true, .wait_us = 250000,
	  .expect = GRPC_HEAD H2_ID
	  "x-timeout-ms: 250\ngrpc-timeout: 250m\nx-retrygate-attempt: 1\nte: trailers\n" },
	{ "gRPC: a sub-millisecond time left is not \"0m\" (expired)", GRPC_REQ(""), .grpc = true,
	  .wait_us = 700, .expect = GRPC_HEAD H2_ID
	  "x-timeout-ms: 0\ngrpc-timeout: 700u\nx-retrygate-attempt: 1\nte: trailers\n" },
	{ "gRPC attempt 3: grpc-previous-rpc-attempts 2 beside our marker, the client's dropped",
	  GRPC_REQ("grpc-previous-rpc-attempts: 0\r\n"), .grpc = true, .attempt = 3,
	  .expect = GRPC_HEAD H2_ID "x-timeout-ms: 950\ngrpc-timeout: 950m\n"
	  "x-retrygate-attempt: 3\ngrpc-previous-rpc-attempts: 2\nte: trailers\n" },
	{ "gRPC attempt 2 counts one previous attempt", GRPC_REQ(""), .grpc = true, .attempt = 2,
	  .expect = GRPC_HEAD H2_ID "x-timeout-ms: 950\ngrpc-timeout: 950m\n"
	  "x-retrygate-attempt: 2\ngrpc-previous-rpc-attempts: 1\nte: trailers\n" },
	{ "a nested gRPC call keeps its client's markers and gets none of ours (the deadline yes)",
	  GRPC_REQ("grpc-previous-rpc-attempts: 2\r\n"), .grpc = true, .nested = true,
	  .expect = GRPC_HEAD "grpc-previous-rpc-attempts: 2\n" H2_ID
	  "x-timeout-ms: 950\ngrpc-timeout: 950m\nte: trailers\n" },
	{ "gRPC with a buffered message: its length after te", GRPC_REQ("Content-Length: 5\r\n"),
	  .grpc = true, .body_len = 5, .expect = GRPC_HEAD H2_ID
	  "x-timeout-ms: 950\ngrpc-timeout: 950m\nx-retrygate-attempt: 1\nte: trailers\n"
	  "content-length: 5\n" },
	{ "not gRPC: a client's grpc-timeout is rewritten in its finest unit, no te added",
	  "POST /p HTTP/1.1\r\nHost: svc\r\ngrpc-timeout: 4S\r\n\r\n",
	  .expect = ":method: POST\n:scheme: http\n:authority: svc\n:path: /p\n" H2_ID
	  "x-timeout-ms: 950\ngrpc-timeout: 950m\nx-retrygate-attempt: 1\n" },
};

static void test_h2_rows(void **state)
{
	int failed = 0;
	struct forward_nv nv;
	forward_nv_init(&nv);
	for (size_t i = 0; i < sizeof(h2rows) / sizeof(h2rows[0]); i++) {
		const struct h2row *r = &h2rows[i];
		struct parsed pr;
		const struct http_head *h = parse(&pr, r->request);
		bool *present = pr.present;
		struct evbuffer *out = evbuffer_new();
		struct forward_req f = {
			.req = h, .host_rewrite = r->host_rewrite, .endpoint = "127.0.0.1:9001",
			.peer_ip = "10.0.0.9", .reqid = "rid", .dl_present = present,
			.wait_us = r->wait_us ? r->wait_us : 950000, .attempt = r->attempt ? r->attempt : 1,
			.streamed = r->streamed, .body_len = r->body_len, .grpc = r->grpc,
			.nested = r->nested,
		};
		forward_h2_headers(&f, r->up_tls, &nv);   /* reused across rows, as a caller may */
		for (size_t j = 0; j < nv.n; j++) {
			evbuffer_add(out, nv.nv[j].name, nv.nv[j].namelen);
			evbuffer_add(out, ": ", 2);
			evbuffer_add(out, nv.nv[j].value, nv.nv[j].valuelen);
			evbuffer_add(out, "\n", 1);
		}
		failed += differs(out, r->expect, "h2 row", i, r->why);
		parsed_free(&pr);
		evbuffer_free(out);
	}
	forward_nv_free(&nv);
	assert_int_equal(failed, 0);
}

/* The fields whose value is new in every request go as never-indexed HPACK literals; the
 * others may be indexed. */
static void test_h2_never_indexed(void **state)
{
	struct parsed pr;
	const struct http_head *h = parse(&pr, GRPC_REQ("X-Request-Id: theirs\r\nX-Other: 1\r\n"));
	struct forward_nv nv;
	forward_nv_init(&nv);
	struct forward_req f = {
		.req = h, .endpoint = "127.0.0.1:9001", .peer_ip = "10.0.0.9", .reqid = "rid",
		.dl_present = pr.present, .wait_us = 950000, .attempt = 1, .grpc = true,
	};
	forward_h2_headers(&f, false, &nv);
	int never = 0;
	for (size_t j = 0; j < nv.n; j++) {
		const char *n = (const char *)nv.nv[j].name;
		size_t len = nv.nv[j].namelen;
		bool volatile_field = (len == 12 && (memcmp(n, "x-request-id", 12) == 0 ||
		                                     memcmp(n, "x-timeout-ms", 12) == 0 ||
		                                     memcmp(n, "grpc-timeout", 12) == 0));
		assert_int_equal(nv.nv[j].flags,
		                 volatile_field ? NGHTTP2_NV_FLAG_NO_INDEX : NGHTTP2_NV_FLAG_NONE);
		never += volatile_field;
	}
	assert_int_equal(never, 3);
	forward_nv_free(&nv);
	parsed_free(&pr);
}

#define BIG_VALUE 299      /* bytes of each X-Field-N's value: 'v's */

/* A GET whose head has EXTRA (whole lines) and then NFIELDS fields X-Field-N of BIG_VALUE
 * bytes, parsed into PR; its forward_req in F. Free with big_free(). */
static char *big_head(struct parsed *pr, struct forward_req *f, const char *extra, int nfields)
{
	struct evbuffer *req = evbuffer_new();
	evbuffer_add_printf(req, "GET / HTTP/1.1\r\nHost: svc\r\n%s", extra);
	char big[BIG_VALUE + 1];
	memset(big, 'v', BIG_VALUE);
	big[BIG_VALUE] = 0;
	for (int i = 0; i < nfields; i++)
		evbuffer_add_printf(req, "X-Field-%d: %s\r\n", i, big);
	evbuffer_add_printf(req, "\r\n");
	char *text = strndup((const char *)evbuffer_pullup(req, -1), evbuffer_get_length(req));
	evbuffer_free(req);
	*f = (struct forward_req){
		.req = parse(pr, text), .endpoint = "127.0.0.1:9001", .peer_ip = "10.0.0.9",
		.reqid = "rid", .dl_present = pr->present, .wait_us = 950000, .attempt = 1,
	};
	return text;
}

static void big_free(struct parsed *pr, struct forward_nv *nv, char *text)
{
	forward_nv_free(nv);
	parsed_free(pr);
	free(text);
}

/* A field list beyond the struct's own storage moves to the heap, every field intact. */
static void test_h2_large_list(void **state)
{
	struct parsed pr;
	struct forward_req f;
	char *text = big_head(&pr, &f, "", 60);
	struct forward_nv nv;
	forward_nv_init(&nv);
	char big[BIG_VALUE];
	memset(big, 'v', BIG_VALUE);
	for (int round = 0; round < 2; round++) {   /* and reused once grown */
		forward_h2_headers(&f, false, &nv);
		assert_int_equal(nv.n, 4 + 60 + 5);
		for (int i = 0; i < 60; i++) {
			char name[32];
			int nl = snprintf(name, sizeof(name), "x-field-%d", i);
			const nghttp2_nv *e = &nv.nv[4 + i];
			assert_int_equal(e->namelen, nl);
			assert_memory_equal(e->name, name, (size_t)nl);
			assert_int_equal(e->valuelen, BIG_VALUE);
			assert_memory_equal(e->value, big, BIG_VALUE);
		}
	}
	big_free(&pr, &nv, text);
}

/* Every name and value but retrygate's literal names lies in the arena, also when it grew
 * after them (an empty value included: it may point at the arena's end). */
static void test_h2_arena_moves(void **state)
{
	struct parsed pr;
	struct forward_req f;
	char *text = big_head(&pr, &f, "X-Empty:\r\n", 20);
	struct forward_nv nv;
	forward_nv_init(&nv);
	forward_h2_headers(&f, false, &nv);
	assert_true(nv.arena != nv.inl);
	const nghttp2_nv *e = &nv.nv[4];
	assert_int_equal(e->namelen, 7);
	assert_memory_equal(e->name, "x-empty", 7);
	assert_int_equal(e->valuelen, 0);
	for (size_t j = 0; j < nv.n; j++) {
		const char *v = (const char *)nv.nv[j].value;
		assert_true(v >= nv.arena && v + nv.nv[j].valuelen <= nv.arena + nv.used);
	}
	big_free(&pr, &nv, text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_h2_never_indexed),
		cmocka_unit_test(test_h2_large_list),
		cmocka_unit_test(test_h2_arena_moves),
		cmocka_unit_test(test_h2_rows),
		cmocka_unit_test(test_rows),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
