/*
 * test_idempotency: the SPEC §6 store. Naming (scope and fingerprint: every input counts, no
 * two encodings collide), the record codec (round trip with and without trailers, every
 * corruption refused, a record in the format before trailers still read), the
 * end-of-exchange rule over HTTP statuses and gRPC codes (§10), the job that records a
 * response (head, body, trailers) and settles its claim, then one table of scenarios — claim,
 * in progress, mismatch (also while in progress), replay byte-identical (trailers too),
 * keep-claimed until ttl, lapse after lock_timeout — run against the memory store and, when
 * redis-server is on PATH, against a real redis started on a free port. Then what only one
 * backend has: the memory store's cap (trailers counted), sweep and threads hammering one
 * table; redis' AUTH, SELECT, names, old and corrupt values, and failing closed in bounded
 * time when the server dies or hangs.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <hiredis/hiredis.h>

#include "base/clock.h"
#include "http/h1_parser.h"
#include "proxy/idem_job.h"
#include "idempotency/idempotency.h"
#include "base/loop.h"
#include "http/respond.h"
#include "http/responder.h"
#include "idempotency/store.h"
#include "base/util.h"

#define MS 1000LL
#define S  1000000LL

/* ------------------------------------------------------------------ helpers */

static struct cfg_idempotency memory_cfg(void)
{
	struct cfg_idempotency c;
	memset(&c, 0, sizeof c);
	c.store = (char *)"memory";
	return c;
}

/* A claim's outcome, with a private copy of the stored response. */
struct got {
	bool done;
	int calls;
	enum idem_result r;
	int status;
	char *headers, *body, *trailers;
	size_t headers_len, body_len, trailers_len;
};

static char *dup_bytes(const char *p, size_t n)
{
	char *d = malloc(n + 1);
	assert_non_null(d);
	if (n)
		memcpy(d, p, n);
	d[n] = '\0';
	return d;
}

static void got_clear(struct got *g)
{
	free(g->headers);
	free(g->body);
	free(g->trailers);
	memset(g, 0, sizeof *g);
}

static void got_cb(void *arg, enum idem_result r, const struct idem_response *stored)
{
	struct got *g = arg;
	g->calls++;
	g->done = true;
	g->r = r;
	if (r == IDEM_REPLAY && stored) {
		g->status = stored->status;
		g->headers = dup_bytes(stored->headers, stored->headers_len);
		g->headers_len = stored->headers_len;
		g->body = dup_bytes(stored->body, stored->body_len);
		g->body_len = stored->body_len;
		g->trailers = dup_bytes(stored->trailers, stored->trailers_len);
		g->trailers_len = stored->trailers_len;
	}
}

static void flag_cb(evutil_socket_t fd, short what, void *arg)
{
	*(bool *)arg = true;
}

/* Runs BASE's loop for MS milliseconds (I/O proceeds meanwhile). */
static void run_for(struct event_base *base, int64_t ms)
{
	bool fired = false;
	struct event *t = evtimer_new(base, flag_cb, &fired);
	struct timeval tv = clock_tv(ms * MS);
	evtimer_add(t, &tv);
	while (!fired)
		event_base_loop(base, EVLOOP_ONCE);
	event_free(t);
}

/* Runs BASE's loop until G has its answer, at most 10 s. */
static void wait_done(struct event_base *base, struct got *g)
{
	bool late = false;
	struct event *t = evtimer_new(base, flag_cb, &late);
	struct timeval tv = clock_tv(10 * S);
	evtimer_add(t, &tv);
	while (!g->done && !late)
		event_base_loop(base, EVLOOP_ONCE);
	event_free(t);
	assert_true(g->done);
	assert_int_equal(g->calls, 1);
}

/* Claims and runs the loop until the answer. The answer never comes from inside idem_claim. */
static enum idem_result claim_wait(struct event_base *base, struct idem_store *s,
                                   const struct idem_key *k, int64_t lock_us, struct got *g)
{
	got_clear(g);
	struct idem_op *op = idem_claim(s, k, lock_us, got_cb, g);
	assert_non_null(op);
	assert_false(g->done);
	wait_done(base, g);
	return g->r;
}

static void make_scope(struct idem_key *k, const char *name)
{
	const char *v[] = { "Bearer token-1" };
	size_t vl[] = { strlen(v[0]) };
	idem_scope(k->scope, "payments", v, vl, 1, name, strlen(name));
}

/* Request variant REQ (0, 1, ...): same method and path, different bodies. */
static void make_fp(struct idem_key *k, int req)
{
	char body[32];
	struct evbuffer *b = evbuffer_new();
	int n = snprintf(body, sizeof body, "{\"amount\":%d}", 100 + req);
	evbuffer_add(b, body, (size_t)n);
	idem_fingerprint(k->fp, "POST", 4, "/charge?x=1", 11, "application/json", 16, b);
	evbuffer_free(b);
}

static void make_key(struct idem_key *k, const char *name, int req)
{
	make_scope(k, name);
	make_fp(k, req);
}

static const char bin_body[] = { 'a', '\0', 'b', '\r', '\n', (char)0xff, '\0' };

/* a gRPC message: uncompressed, 3 bytes */
static const char grpc_msg[] = { 0, 0, 0, 0, 3, 'a', '\0', 'c' };
#define GRPC_HEAD "content-type: application/grpc\r\n"
#define GRPC_TRAILERS "grpc-status: 0\r\ngrpc-message: fine\r\n"

static const struct idem_response responses[] = {
	{ 201, "Content-Type: application/json\r\nX-Id: 1\r\n", 40, "{\"id\":1}", 8, NULL, 0 },
	{ 200, "X-Bin: yes\r\n", 12, bin_body, sizeof bin_body, NULL, 0 },
	{ 204, "", 0, "", 0, NULL, 0 },
	/* gRPC (SPEC §10): head, one message, trailers */
	{ 200, GRPC_HEAD, sizeof GRPC_HEAD - 1, grpc_msg, sizeof grpc_msg,
	  GRPC_TRAILERS, sizeof GRPC_TRAILERS - 1 },
	/* gRPC Trailers-Only: the status in the head, nothing after it */
	{ 200, GRPC_HEAD "grpc-status: 5\r\n", sizeof GRPC_HEAD - 1 + 16, "", 0, NULL, 0 },
	/* trailers after an empty body (headers, then trailers: linkerd2#7701's shape) */
	{ 200, GRPC_HEAD, sizeof GRPC_HEAD - 1, "", 0, "grpc-status: 6\r\n", 16 },
};

static void assert_response(const struct got *g, const struct idem_response *want)
{
	assert_int_equal(g->r, IDEM_REPLAY);
	assert_int_equal(g->status, want->status);
	assert_int_equal(g->headers_len, want->headers_len);
	assert_memory_equal(g->headers, want->headers, want->headers_len);
	assert_int_equal(g->body_len, want->body_len);
	if (want->body_len)
		assert_memory_equal(g->body, want->body, want->body_len);
	assert_int_equal(g->trailers_len, want->trailers_len);
	if (want->trailers_len)
		assert_memory_equal(g->trailers, want->trailers, want->trailers_len);
}

/* ------------------------------------------------------------------ naming */

struct fp_case {
	const char *what;
	const char *method, *target, *ctype, *body;
	bool same;      /* as the base request */
};

static void fp_of(unsigned char out[32], const struct fp_case *c, int chunks)
{
	struct evbuffer *b = evbuffer_new();
	size_t n = strlen(c->body);
	/* the body may arrive in several chains: the hash must not see where they split */
	for (int i = 0; i < chunks; i++) {
		size_t from = n * (size_t)i / (size_t)chunks, to = n * (size_t)(i + 1) / (size_t)chunks;
		struct evbuffer *piece = evbuffer_new();
		evbuffer_add(piece, c->body + from, to - from);
		evbuffer_add_buffer(b, piece);
		evbuffer_free(piece);
	}
	idem_fingerprint(out, c->method, strlen(c->method), c->target, strlen(c->target),
	                 c->ctype, c->ctype ? strlen(c->ctype) : 0, b);
	evbuffer_free(b);
}

static void test_fingerprint(void **state)
{
	static const struct fp_case base = { "base", "POST", "/pay?a=1", "application/json",
	                                     "{\"n\":1}", true };
	static const struct fp_case cases[] = {
		{ "identical", "POST", "/pay?a=1", "application/json", "{\"n\":1}", true },
		{ "method", "PATCH", "/pay?a=1", "application/json", "{\"n\":1}", false },
		{ "method case", "post", "/pay?a=1", "application/json", "{\"n\":1}", false },
		{ "path", "POST", "/pax?a=1", "application/json", "{\"n\":1}", false },
		{ "query", "POST", "/pay?a=2", "application/json", "{\"n\":1}", false },
		{ "no query", "POST", "/pay", "application/json", "{\"n\":1}", false },
		{ "content-type", "POST", "/pay?a=1", "text/plain", "{\"n\":1}", false },
		{ "content-type absent", "POST", "/pay?a=1", NULL, "{\"n\":1}", false },
		{ "content-type empty", "POST", "/pay?a=1", "", "{\"n\":1}", false },
		{ "body", "POST", "/pay?a=1", "application/json", "{\"n\":2}", false },
		{ "body empty", "POST", "/pay?a=1", "application/json", "", false },
		/* field boundaries move: still different */
		{ "shifted path/ctype", "POST", "/pay?a=1a", "pplication/json", "{\"n\":1}", false },
		{ "shifted method/path", "POS", "T/pay?a=1", "application/json", "{\"n\":1}", false },
	};
	unsigned char b[32], x[32], y[32];

	fp_of(b, &base, 1);
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		for (int chunks = 1; chunks <= 3; chunks++) {
			fp_of(x, &cases[i], chunks);
			if ((memcmp(b, x, 32) == 0) != cases[i].same)
				fail_msg("fingerprint case \"%s\" (%d chunks): expected %s", cases[i].what,
				         chunks, cases[i].same ? "same" : "different");
		}
	}
	/* a NULL body is the empty body */
	idem_fingerprint(x, "POST", 4, "/", 1, NULL, 0, NULL);
	struct evbuffer *e = evbuffer_new();
	idem_fingerprint(y, "POST", 4, "/", 1, NULL, 0, e);
	evbuffer_free(e);
	assert_memory_equal(x, y, 32);
	/* a fingerprint is never a scope of the same bytes */
	idem_scope(y, "POST", NULL, NULL, 0, "/", 1);
	assert_memory_not_equal(x, y, 32);
}

struct scope_case {
	const char *what;
	const char *upstream;
	int n;
	const char *v[3];
	const char *key;
	bool same;
};

static void scope_of(unsigned char out[32], const struct scope_case *c)
{
	size_t lens[3];
	for (int i = 0; i < c->n; i++)
		lens[i] = c->v[i] ? strlen(c->v[i]) : 0;
	idem_scope(out, c->upstream, c->v, lens, c->n, c->key, strlen(c->key));
}

static void test_scope(void **state)
{
	static const struct scope_case base = { "base", "payments", 2, { "Bearer a", "t1" }, "k1",
	                                        true };
	static const struct scope_case cases[] = {
		{ "identical", "payments", 2, { "Bearer a", "t1" }, "k1", true },
		{ "upstream", "orders", 2, { "Bearer a", "t1" }, "k1", false },
		{ "first header value", "payments", 2, { "Bearer b", "t1" }, "k1", false },
		{ "second header value", "payments", 2, { "Bearer a", "t2" }, "k1", false },
		{ "header absent", "payments", 2, { NULL, "t1" }, "k1", false },
		{ "header empty", "payments", 2, { "", "t1" }, "k1", false },
		{ "headers swapped", "payments", 2, { "t1", "Bearer a" }, "k1", false },
		{ "one header fewer", "payments", 1, { "Bearer a" }, "k1", false },
		{ "key", "payments", 2, { "Bearer a", "t1" }, "k2", false },
		{ "key case", "payments", 2, { "Bearer a", "t1" }, "K1", false },
		/* the same bytes, split differently between fields */
		{ "upstream/value boundary", "paymentsB", 2, { "earer a", "t1" }, "k1", false },
		{ "value/value boundary", "payments", 2, { "Bearer at", "1" }, "k1", false },
		{ "value/key boundary", "payments", 2, { "Bearer a", "t1k" }, "1", false },
		{ "values joined", "payments", 1, { "Bearer at1" }, "k1", false },
	};
	unsigned char b[32], x[32];

	scope_of(b, &base);
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		scope_of(x, &cases[i]);
		if ((memcmp(b, x, 32) == 0) != cases[i].same)
			fail_msg("scope case \"%s\": expected %s", cases[i].what,
			         cases[i].same ? "same" : "different");
	}
	/* ("ab","c") and ("a","bc") across upstream and key, with no scope headers */
	unsigned char p[32], q[32];
	idem_scope(p, "ab", NULL, NULL, 0, "c", 1);
	idem_scope(q, "a", NULL, NULL, 0, "bc", 2);
	assert_memory_not_equal(p, q, 32);
	/* and across two header values */
	const char *v1[] = { "ab", "c" }, *v2[] = { "a", "bc" };
	size_t l1[] = { 2, 1 }, l2[] = { 1, 2 };
	idem_scope(p, "u", v1, l1, 2, "k", 1);
	idem_scope(q, "u", v2, l2, 2, "k", 1);
	assert_memory_not_equal(p, q, 32);
	/* deterministic */
	idem_scope(q, "u", v1, l1, 2, "k", 1);
	assert_memory_equal(p, q, 32);
}

/* ------------------------------------------------------------------ the record codec */

static void test_record_codec(void **state)
{
	unsigned char fp[32], buf[256];
	struct rec r;

	for (int i = 0; i < 32; i++)
		fp[i] = (unsigned char)(i * 7 + 1);
	/* CLAIMED and KEPT: the head alone */
	static const enum rec_state bare[] = { REC_CLAIMED, REC_KEPT };
	for (int i = 0; i < 2; i++) {
		assert_int_equal(rec_size(bare[i], NULL), REC_HEAD_LEN);
		rec_encode(buf, bare[i], fp, NULL);
		assert_true(rec_decode(buf, REC_HEAD_LEN, &r));
		assert_int_equal(r.state, bare[i]);
		assert_memory_equal(r.fp, fp, 32);
		assert_false(rec_decode(buf, REC_HEAD_LEN + 1, &r));  /* trailing byte */
		assert_false(rec_decode(buf, REC_HEAD_LEN - 1, &r));  /* truncated */
	}
	/* DONE: every response round-trips byte for byte, trailers too; the version-2 form
	 * only when there are trailers */
	for (size_t i = 0; i < sizeof responses / sizeof *responses; i++) {
		const struct idem_response *want = &responses[i];
		size_t n = rec_size(REC_DONE, want);
		assert_int_equal(n, REC_HEAD_LEN + (want->trailers_len ? REC_RESP_HEAD2 : REC_RESP_HEAD) +
		                    want->headers_len + want->body_len + want->trailers_len);
		rec_encode(buf, REC_DONE, fp, want);
		assert_memory_equal(buf, want->trailers_len ? "RGI2" : "RGI1", 4);
		assert_true(rec_decode(buf, n, &r));
		assert_int_equal(r.state, REC_DONE);
		assert_int_equal(r.resp.status, want->status);
		assert_int_equal(r.resp.headers_len, want->headers_len);
		assert_memory_equal(r.resp.headers, want->headers, want->headers_len);
		assert_int_equal(r.resp.body_len, want->body_len);
		assert_memory_equal(r.resp.body, want->body, want->body_len);
		assert_int_equal(r.resp.trailers_len, want->trailers_len);
		if (want->trailers_len)
			assert_memory_equal(r.resp.trailers, want->trailers, want->trailers_len);
		/* every truncation and an extra byte are refused */
		for (size_t cut = 0; cut < n; cut++)
			assert_false(rec_decode(buf, cut, &r));
		buf[n] = 0;
		assert_false(rec_decode(buf, n + 1, &r));
	}
	/* corrupt fields */
	size_t n = rec_size(REC_DONE, &responses[0]);
	struct { const char *what; size_t at; unsigned char val; } bad[] = {
		{ "magic", 0, 'X' },
		{ "version", 3, '3' },
		{ "state", 4, 'Z' },
		{ "status high byte", REC_HEAD_LEN, 0x09 },           /* 0x09xx > 599 */
		{ "status 0", REC_HEAD_LEN + 1, 0 },                  /* 201 -> 0x0000 with the next */
		{ "headers length", REC_HEAD_LEN + 5, 41 },
		{ "body length", REC_HEAD_LEN + 9, 7 },
		{ "length overflow", REC_HEAD_LEN + 2, 0xff },
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		rec_encode(buf, REC_DONE, fp, &responses[0]);
		buf[bad[i].at] = bad[i].val;
		if (i == 4)
			buf[REC_HEAD_LEN] = 0;
		if (rec_decode(buf, n, &r))
			fail_msg("corrupt %s accepted", bad[i].what);
	}
	/* the same for the version-2 form's own fields */
	const struct idem_response *tr = &responses[3];
	n = rec_size(REC_DONE, tr);
	size_t tl_at = REC_HEAD_LEN + 10;
	struct { const char *what; size_t at; unsigned char val; } bad2[] = {
		{ "version 1 with trailers", 3, '1' },
		{ "trailers length + 1", tl_at + 3, (unsigned char)(tr->trailers_len + 1) },
		{ "trailers length - 1", tl_at + 3, (unsigned char)(tr->trailers_len - 1) },
		{ "trailers length high byte", tl_at, 0x01 },
	};
	for (size_t i = 0; i < sizeof bad2 / sizeof *bad2; i++) {
		rec_encode(buf, REC_DONE, fp, tr);
		buf[bad2[i].at] = bad2[i].val;
		if (rec_decode(buf, n, &r))
			fail_msg("corrupt %s accepted", bad2[i].what);
	}
	/* a version-2 record with no trailers would be a second spelling of a version-1 one,
	 * and the version-2 form is for DONE only */
	rec_encode(buf, REC_DONE, fp, &responses[0]);
	n = rec_size(REC_DONE, &responses[0]);
	unsigned char v2[256];
	memcpy(v2, buf, REC_HEAD_LEN + REC_RESP_HEAD);
	v2[3] = '2';
	memset(v2 + REC_HEAD_LEN + REC_RESP_HEAD, 0, 4);
	memcpy(v2 + REC_HEAD_LEN + REC_RESP_HEAD2, buf + REC_HEAD_LEN + REC_RESP_HEAD,
	       n - REC_HEAD_LEN - REC_RESP_HEAD);
	assert_false(rec_decode(v2, n + 4, &r));
	rec_encode(buf, REC_KEPT, fp, NULL);
	buf[3] = '2';
	assert_false(rec_decode(buf, REC_HEAD_LEN, &r));
	/* a response too large for the 32-bit lengths cannot be encoded */
	struct idem_response huge = { 200, "", 0, "", (size_t)UINT32_MAX + 1, NULL, 0 };
	assert_int_equal(rec_size(REC_DONE, &huge), 0);
	struct idem_response huge_tr = { 200, "", 0, "", 0, "", (size_t)UINT32_MAX + 1 };
	assert_int_equal(rec_size(REC_DONE, &huge_tr), 0);
}

/* A DONE record exactly as the version before trailers wrote it (spelled out byte by byte,
 * not made by rec_encode): a rolling deploy shares one redis, so it must still decode, as a
 * response with no trailers; and a response without trailers is written in exactly that
 * form, so the older version reads what this one writes. */
static const unsigned char old_record[] = {
	'R', 'G', 'I', '1', 'D',
	1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
	17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
	0x00, 0xc9,                 /* 201 */
	0x00, 0x00, 0x00, 0x0a,     /* headers: 10 bytes */
	0x00, 0x00, 0x00, 0x02,     /* body: 2 bytes */
	'X', '-', 'A', ':', ' ', 'b', 'c', 'd', '\r', '\n',
	'o', 'k',
};

static void test_record_old_format(void **state)
{
	struct rec r;
	unsigned char again[sizeof old_record];

	assert_true(rec_decode(old_record, sizeof old_record, &r));
	assert_int_equal(r.state, REC_DONE);
	for (int i = 0; i < 32; i++)
		assert_int_equal(r.fp[i], i + 1);
	assert_int_equal(r.resp.status, 201);
	assert_int_equal(r.resp.headers_len, 10);
	assert_memory_equal(r.resp.headers, "X-A: bcd\r\n", 10);
	assert_int_equal(r.resp.body_len, 2);
	assert_memory_equal(r.resp.body, "ok", 2);
	assert_null(r.resp.trailers);
	assert_int_equal(r.resp.trailers_len, 0);
	/* written back, it is the same bytes */
	assert_int_equal(rec_size(REC_DONE, &r.resp), sizeof old_record);
	rec_encode(again, REC_DONE, r.fp, &r.resp);
	assert_memory_equal(again, old_record, sizeof old_record);
}

static void test_judge_and_names(void **state)
{
	unsigned char a[32] = { 1 }, b[32] = { 2 };
	assert_int_equal(rec_judge(REC_CLAIMED, a, a), IDEM_IN_PROGRESS);
	assert_int_equal(rec_judge(REC_KEPT, a, a), IDEM_IN_PROGRESS);
	assert_int_equal(rec_judge(REC_DONE, a, a), IDEM_REPLAY);
	assert_int_equal(rec_judge(REC_CLAIMED, a, b), IDEM_MISMATCH);
	assert_int_equal(rec_judge(REC_KEPT, a, b), IDEM_MISMATCH);
	assert_int_equal(rec_judge(REC_DONE, a, b), IDEM_MISMATCH);
	assert_string_equal(idem_result_name(IDEM_CLAIMED), "claimed");
	assert_string_equal(idem_result_name(IDEM_REPLAY), "replay");
	assert_string_equal(idem_result_name(IDEM_MISMATCH), "mismatch");
	assert_string_equal(idem_result_name(IDEM_IN_PROGRESS), "in-progress");
	assert_string_equal(idem_result_name(IDEM_UNAVAILABLE), "unavailable");
}

/* ------------------------------------------------------------------ the end-of-exchange rule */

static void test_disposition(void **state)
{
	static const struct {
		const char *what;
		int status, grpc;
		bool reached;
		int64_t stored_len, max_response;
		enum idem_after want;
		bool refused;           /* every attempt a connect-failure or a release_on answer */
	} rows[] = {
		/* HTTP (grpc -1): as before gRPC came */
		{ "2xx stored", 200, -1, true, 10, 1024, IDEM_AFTER_STORE, false },
		{ "4xx stored", 404, -1, true, 10, 1024, IDEM_AFTER_STORE, false },
		{ "499 stored", 499, -1, true, 0, 1024, IDEM_AFTER_STORE, false },
		{ "empty body stored", 204, -1, true, 0, 0, IDEM_AFTER_STORE, false },
		{ "body exactly max_response", 200, -1, true, 1024, 1024, IDEM_AFTER_STORE, false },
		{ "body over max_response", 200, -1, true, 1025, 1024, IDEM_AFTER_KEEP, false },
		{ "body not buffered", 200, -1, true, -1, 1024, IDEM_AFTER_KEEP, false },
		{ "500 unknown", 500, -1, true, 10, 1024, IDEM_AFTER_EXPIRE, false },
		{ "503 unknown", 503, -1, true, 10, 1024, IDEM_AFTER_EXPIRE, false },
		{ "reset or timeout unknown", 0, -1, true, -1, 1024, IDEM_AFTER_EXPIRE, false },
		{ "connect-failure only: released", 0, -1, false, -1, 1024, IDEM_AFTER_RELEASE, false },
		{ "never sent: released", 0, -1, false, 0, 1024, IDEM_AFTER_RELEASE, false },
		/* gRPC under :status 200: the code decides (SPEC §10) */
		{ "grpc ok", 200, 0, true, 10, 1024, IDEM_AFTER_STORE, false },
		{ "grpc cancelled", 200, 1, true, 10, 1024, IDEM_AFTER_EXPIRE, false },
		{ "grpc unknown", 200, 2, true, 10, 1024, IDEM_AFTER_EXPIRE, false },
		{ "grpc invalid-argument", 200, 3, true, 10, 1024, IDEM_AFTER_STORE, false },
		{ "grpc deadline-exceeded", 200, 4, true, 10, 1024, IDEM_AFTER_EXPIRE, false },
		{ "grpc not-found", 200, 5, true, 10, 1024, IDEM_AFTER_STORE, false },
		{ "grpc already-exists", 200, 6, true, 10, 1024, IDEM_AFTER_STORE, false },
		{ "grpc permission-denied", 200, 7, true, 10, 1024, IDEM_AFTER_STORE, false },
		{ "grpc resource-exhausted", 200, 8, true, 10, 1024, IDEM_AFTER_EXPIRE, false },
		{ "grpc failed-precondition", 200, 9, true, 10, 1024, IDEM_AFTER_STORE, false },
		{ "grpc aborted", 200, 10, true, 10, 1024, IDEM_AFTER_EXPIRE, false },
		{ "grpc out-of-range", 200, 11, true, 10, 1024, IDEM_AFTER_STORE, false },
		{ "grpc unimplemented", 200, 12, true, 10, 1024, IDEM_AFTER_STORE, false },
		{ "grpc internal", 200, 13, true, 10, 1024, IDEM_AFTER_EXPIRE, false },
		{ "grpc unavailable", 200, 14, true, 10, 1024, IDEM_AFTER_EXPIRE, false },
		{ "grpc data-loss", 200, 15, true, 10, 1024, IDEM_AFTER_EXPIRE, false },
		{ "grpc unauthenticated", 200, 16, true, 10, 1024, IDEM_AFTER_STORE, false },
		{ "grpc code above 16", 200, 17, true, 10, 1024, IDEM_AFTER_EXPIRE, false },
		{ "grpc unknown, even not reached", 200, 14, false, 10, 1024, IDEM_AFTER_EXPIRE, false },
		{ "grpc ok over max_response", 200, 0, true, 1025, 1024, IDEM_AFTER_KEEP, false },
		{ "grpc ok not buffered", 200, 0, true, -1, 1024, IDEM_AFTER_KEEP, false },
		{ "grpc unavailable over max_response", 200, 14, true, 1025, 1024, IDEM_AFTER_EXPIRE, false },
		/* another :status is an HTTP outcome, whatever grpc-status says */
		{ "grpc call, HTTP 404", 404, 14, true, 10, 1024, IDEM_AFTER_STORE, false },
		{ "grpc call, HTTP 503", 503, 0, true, 10, 1024, IDEM_AFTER_EXPIRE, false },
		/* SPEC §6 release_on: the service said every time that it did not take it */
		{ "503 refused: released", 503, -1, true, 10, 1024, IDEM_AFTER_RELEASE, true },
		{ "429 refused: released, not stored", 429, -1, true, 10, 1024, IDEM_AFTER_RELEASE,
		  true },
		{ "grpc resource-exhausted refused", 200, 8, true, 0, 1024, IDEM_AFTER_RELEASE, true },
		{ "grpc unavailable refused (listed)", 200, 14, true, 0, 1024, IDEM_AFTER_RELEASE,
		  true },
		{ "connect-failure then 503, refused", 503, -1, true, 0, 1024, IDEM_AFTER_RELEASE,
		  true },
		{ "503 after a reset: unknown", 503, -1, true, 10, 1024, IDEM_AFTER_EXPIRE, false },
		{ "429 after a reset: stored as before", 429, -1, true, 10, 1024, IDEM_AFTER_STORE,
		  false },
	};
	for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
		enum idem_after got = idem_disposition(rows[i].status, rows[i].grpc, rows[i].reached,
		                                       rows[i].refused, rows[i].stored_len,
		                                       rows[i].max_response);
		if (got != rows[i].want)
			fail_msg("disposition \"%s\": got %d, want %d", rows[i].what, got, rows[i].want);
	}
}

/* SPEC §6 release_on and §4 rule 4: which outcomes cannot have executed, under the default
 * release_on [429, 503, resource-exhausted]. */
static void test_not_executed(void **state)
{
	struct cfg_idempotency ic;
	memset(&ic, 0, sizeof ic);
	ic.release_status[(429 - 400) / 8] |= (uint8_t)(1u << ((429 - 400) % 8));
	ic.release_status[(503 - 400) / 8] |= (uint8_t)(1u << ((503 - 400) % 8));
	ic.release_grpc = 1u << 8;
	static const struct {
		const char *what;
		enum outcome out;
		int status, grpc;
		bool want;
	} rows[] = {
		{ "connect-failure: nothing was sent", OUT_CONNECT_FAILURE, 0, -1, true },
		{ "reset: may have run", OUT_RESET, 0, -1, false },
		{ "timeout: may have run", OUT_TIMEOUT, 0, -1, false },
		{ "no outcome (yet): may have run", OUT_NONE, 0, -1, false },
		{ "503 listed", OUT_STATUS, 503, -1, true },
		{ "429 listed", OUT_STATUS, 429, -1, true },
		{ "502 not listed", OUT_STATUS, 502, -1, false },
		{ "500 not listed", OUT_STATUS, 500, -1, false },
		{ "200 never", OUT_STATUS, 200, -1, false },
		{ "gRPC resource-exhausted listed", OUT_STATUS, 200, 8, true },
		{ "gRPC unavailable not listed by default", OUT_STATUS, 200, 14, false },
		{ "gRPC ok never", OUT_STATUS, 200, 0, false },
		{ "gRPC call answered HTTP 503: the status decides", OUT_STATUS, 503, 2, true },
		{ "gRPC call answered HTTP 500", OUT_STATUS, 500, 8, false },
		{ "a status with a reset outcome is not an answer", OUT_RESET, 503, -1, false },
	};
	for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
		if (idem_not_executed(&ic, rows[i].out, rows[i].status, rows[i].grpc) != rows[i].want)
			fail_msg("not executed \"%s\": got %d", rows[i].what, !rows[i].want);
	/* release_on lists unavailable: then it releases */
	ic.release_grpc |= 1u << 14;
	assert_true(idem_not_executed(&ic, OUT_STATUS, 200, 14));
}

/* ------------------------------------------------------------------ one scenario table, two backends */

enum step_op { CLAIM, COMPLETE, KEEP, RELEASE, WAIT, END };

struct step {
	enum step_op op;
	int key;                /* which scope: the scenario's name + this */
	int req;                /* which request (fingerprint) */
	int64_t ms;             /* CLAIM: lock_timeout; COMPLETE/KEEP: ttl; WAIT: duration */
	enum idem_result want;  /* CLAIM */
	int resp;               /* COMPLETE: what to store; CLAIM REPLAY: what to expect */
};

struct scenario {
	const char *name;
	struct step steps[14];
};

/* Times generous enough for a loaded 2-CPU machine running the sanitizer build: a step
 * that must happen before a record expires has >= 200 ms to do so, and a wait past an
 * expiry overshoots it by >= 200 ms. */
#define LONG_MS  10000
#define SHORT_MS 200        /* a lock_timeout (or ttl) meant to run out */
#define PAST_MS  400        /* a wait past SHORT_MS */
#define TTL_MS   1200       /* a ttl outliving PAST_MS by far */

static const struct scenario scenarios[] = {
	{ "claim, in progress, mismatch, replay", {
		{ CLAIM, 0, 0, LONG_MS, IDEM_CLAIMED, 0 },
		{ CLAIM, 0, 0, LONG_MS, IDEM_IN_PROGRESS, 0 },
		{ CLAIM, 0, 1, LONG_MS, IDEM_MISMATCH, 0 },     /* mismatch while in progress */
		{ COMPLETE, 0, 0, LONG_MS, 0, 0 },
		{ CLAIM, 0, 0, LONG_MS, IDEM_REPLAY, 0 },
		{ CLAIM, 0, 0, LONG_MS, IDEM_REPLAY, 0 },       /* replays again */
		{ CLAIM, 0, 1, LONG_MS, IDEM_MISMATCH, 0 },     /* mismatch when done */
		{ COMPLETE, 0, 0, LONG_MS, 0, 1 },              /* a second outcome is ignored */
		{ CLAIM, 0, 0, LONG_MS, IDEM_REPLAY, 0 },
		{ .op = END } } },
	{ "binary and empty responses replay byte-identical", {
		{ CLAIM, 0, 0, LONG_MS, IDEM_CLAIMED, 0 },
		{ COMPLETE, 0, 0, LONG_MS, 0, 1 },
		{ CLAIM, 0, 0, LONG_MS, IDEM_REPLAY, 1 },
		{ CLAIM, 1, 0, LONG_MS, IDEM_CLAIMED, 0 },
		{ COMPLETE, 1, 0, LONG_MS, 0, 2 },
		{ CLAIM, 1, 0, LONG_MS, IDEM_REPLAY, 2 },
		{ .op = END } } },
	{ "gRPC responses replay with their trailers", {
		{ CLAIM, 0, 0, LONG_MS, IDEM_CLAIMED, 0 },
		{ COMPLETE, 0, 0, LONG_MS, 0, 3 },
		{ CLAIM, 0, 0, LONG_MS, IDEM_REPLAY, 3 },
		{ CLAIM, 0, 1, LONG_MS, IDEM_MISMATCH, 0 },
		{ CLAIM, 1, 0, LONG_MS, IDEM_CLAIMED, 0 },
		{ COMPLETE, 1, 0, LONG_MS, 0, 4 },              /* Trailers-Only */
		{ CLAIM, 1, 0, LONG_MS, IDEM_REPLAY, 4 },
		{ CLAIM, 2, 0, LONG_MS, IDEM_CLAIMED, 0 },
		{ COMPLETE, 2, 0, LONG_MS, 0, 5 },              /* trailers, no body */
		{ CLAIM, 2, 0, LONG_MS, IDEM_REPLAY, 5 },
		{ .op = END } } },
	{ "keep-claimed answers in progress until ttl", {
		{ CLAIM, 0, 0, SHORT_MS, IDEM_CLAIMED, 0 },
		{ KEEP, 0, 0, TTL_MS, 0, 0 },
		{ WAIT, 0, 0, PAST_MS, 0, 0 },                  /* past lock_timeout */
		{ CLAIM, 0, 0, LONG_MS, IDEM_IN_PROGRESS, 0 },
		{ CLAIM, 0, 1, LONG_MS, IDEM_MISMATCH, 0 },
		{ WAIT, 0, 0, TTL_MS, 0, 0 },                   /* past ttl */
		{ CLAIM, 0, 1, LONG_MS, IDEM_CLAIMED, 0 },
		{ .op = END } } },
	{ "an unknown outcome lapses at lock_timeout", {
		{ CLAIM, 0, 0, SHORT_MS, IDEM_CLAIMED, 0 },
		{ CLAIM, 0, 0, LONG_MS, IDEM_IN_PROGRESS, 0 },
		{ WAIT, 0, 0, PAST_MS, 0, 0 },
		{ CLAIM, 0, 0, LONG_MS, IDEM_CLAIMED, 0 },
		{ CLAIM, 0, 0, LONG_MS, IDEM_IN_PROGRESS, 0 },
		{ .op = END } } },
	{ "a late outcome never overwrites another request's claim", {
		{ CLAIM, 0, 0, SHORT_MS, IDEM_CLAIMED, 0 },
		{ WAIT, 0, 0, PAST_MS, 0, 0 },
		{ CLAIM, 0, 1, LONG_MS, IDEM_CLAIMED, 0 },
		{ COMPLETE, 0, 0, LONG_MS, 0, 0 },
		{ KEEP, 0, 0, LONG_MS, 0, 0 },
		{ RELEASE, 0, 0, 0, 0, 0 },
		{ CLAIM, 0, 0, LONG_MS, IDEM_MISMATCH, 0 },
		{ CLAIM, 0, 1, LONG_MS, IDEM_IN_PROGRESS, 0 },
		{ COMPLETE, 0, 1, LONG_MS, 0, 1 },
		{ CLAIM, 0, 1, LONG_MS, IDEM_REPLAY, 1 },
		{ .op = END } } },
	{ "an outcome after the claim lapsed is still recorded", {
		{ CLAIM, 0, 0, SHORT_MS, IDEM_CLAIMED, 0 },
		{ WAIT, 0, 0, PAST_MS, 0, 0 },
		{ COMPLETE, 0, 0, LONG_MS, 0, 2 },
		{ CLAIM, 0, 0, LONG_MS, IDEM_REPLAY, 2 },
		{ CLAIM, 0, 1, LONG_MS, IDEM_MISMATCH, 0 },
		{ CLAIM, 1, 0, SHORT_MS, IDEM_CLAIMED, 0 },
		{ WAIT, 0, 0, PAST_MS, 0, 0 },
		{ KEEP, 1, 0, LONG_MS, 0, 0 },
		{ CLAIM, 1, 0, LONG_MS, IDEM_IN_PROGRESS, 0 },
		{ .op = END } } },
	{ "release gives the key back at once, only to its owner", {
		{ CLAIM, 0, 0, LONG_MS, IDEM_CLAIMED, 0 },
		{ RELEASE, 0, 1, 0, 0, 0 },                     /* not its claim: no effect */
		{ CLAIM, 0, 0, LONG_MS, IDEM_IN_PROGRESS, 0 },
		{ RELEASE, 0, 0, 0, 0, 0 },
		{ CLAIM, 0, 1, LONG_MS, IDEM_CLAIMED, 0 },
		{ COMPLETE, 0, 1, LONG_MS, 0, 0 },
		{ RELEASE, 0, 1, 0, 0, 0 },                     /* a recorded outcome stays */
		{ CLAIM, 0, 1, LONG_MS, IDEM_REPLAY, 0 },
		{ .op = END } } },
	{ "a stored response expires after ttl", {
		{ CLAIM, 0, 0, LONG_MS, IDEM_CLAIMED, 0 },
		{ COMPLETE, 0, 0, SHORT_MS, 0, 0 },
		{ CLAIM, 0, 0, LONG_MS, IDEM_REPLAY, 0 },
		{ WAIT, 0, 0, PAST_MS, 0, 0 },
		{ CLAIM, 0, 0, LONG_MS, IDEM_CLAIMED, 0 },
		{ .op = END } } },
	{ "keys are independent", {
		{ CLAIM, 0, 0, LONG_MS, IDEM_CLAIMED, 0 },
		{ CLAIM, 1, 0, LONG_MS, IDEM_CLAIMED, 0 },
		{ CLAIM, 2, 1, LONG_MS, IDEM_CLAIMED, 0 },
		{ COMPLETE, 0, 0, LONG_MS, 0, 0 },
		{ CLAIM, 1, 0, LONG_MS, IDEM_IN_PROGRESS, 0 },
		{ CLAIM, 0, 0, LONG_MS, IDEM_REPLAY, 0 },
		{ CLAIM, 2, 0, LONG_MS, IDEM_MISMATCH, 0 },
		{ .op = END } } },
};

static void run_scenarios(struct event_base *base, struct idem_store *s, const char *backend)
{
	struct got g = { 0 };

	for (size_t i = 0; i < sizeof scenarios / sizeof *scenarios; i++) {
		const struct scenario *sc = &scenarios[i];
		for (int j = 0; sc->steps[j].op != END; j++) {
			const struct step *st = &sc->steps[j];
			char name[160];
			struct idem_key k;
			snprintf(name, sizeof name, "%s#%d", sc->name, st->key);
			make_key(&k, name, st->req);
			switch (st->op) {
			case CLAIM: {
				enum idem_result r = claim_wait(base, s, &k, st->ms * MS, &g);
				if (r != st->want)
					fail_msg("%s: \"%s\" step %d: got %s, want %s", backend, sc->name, j,
					         idem_result_name(r), idem_result_name(st->want));
				if (r == IDEM_REPLAY)
					assert_response(&g, &responses[st->resp]);
				break;
			}
			case COMPLETE:
				idem_complete(s, &k, &responses[st->resp], st->ms * MS);
				break;
			case KEEP:
				idem_keep_claimed(s, &k, st->ms * MS);
				break;
			case RELEASE:
				idem_release(s, &k);
				break;
			case WAIT:
				run_for(base, st->ms);
				break;
			case END:
				break;
			}
		}
	}
	got_clear(&g);
}

/* A 1 MiB binary body (the default max_response) goes in and comes back byte for byte. */
static void run_large(struct event_base *base, struct idem_store *s)
{
	size_t n = (size_t)1 << 20;
	char *body = malloc(n);
	struct idem_key k;
	struct got g = { 0 };

	assert_non_null(body);
	for (size_t i = 0; i < n; i++)
		body[i] = (char)(i * 131 + (i >> 9));
	struct idem_response big = { 200, "Content-Type: application/octet-stream\r\n", 40, body, n, NULL, 0 };
	make_key(&k, "large", 0);
	assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_CLAIMED);
	idem_complete(s, &k, &big, LONG_MS * MS);
	assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_REPLAY);
	assert_response(&g, &big);
	got_clear(&g);
	free(body);
}

/* ------------------------------------------------------------------ the job: record and settle */

/* What one request's response looked like going out, and what its settlement must do. */
struct job_row {
	const char *what;
	int status, grpc;               /* as the exchange passes them to settle */
	bool reached, complete;
	const char *body;               /* NUL-free */
	bool trailers;                  /* the gRPC trailer block below, relayed after the body */
	bool head_status;               /* grpc-status in the head (Trailers-Only) */
	enum idem_after want;
	bool refused;                   /* as the exchange passes it: no attempt can have run */
};

#define JOB_MAX_RESPONSE 64
#define BODY40 "0123456789012345678901234567890123456789"

static const struct job_row job_rows[] = {
	{ "HTTP 201", 201, -1, true, true, "{\"id\":1}", false, false, IDEM_AFTER_STORE, false },
	{ "HTTP 404", 404, -1, true, true, "no", false, false, IDEM_AFTER_STORE, false },
	{ "HTTP 503", 503, -1, true, true, "busy", false, false, IDEM_AFTER_EXPIRE, false },
	{ "HTTP cut short", 200, -1, true, false, "par", false, false, IDEM_AFTER_KEEP, false },
	{ "HTTP body at 40 of 64", 201, -1, true, true, BODY40, false, false, IDEM_AFTER_STORE, false },
	{ "reset", 0, -1, true, false, "", false, false, IDEM_AFTER_EXPIRE, false },
	{ "connect-failure", 0, -1, false, false, "", false, false, IDEM_AFTER_RELEASE, false },
	{ "gRPC ok + trailers", 200, 0, true, true, "\1msg", true, false, IDEM_AFTER_STORE, false },
	{ "gRPC not-found, Trailers-Only", 200, 5, true, true, "", false, true, IDEM_AFTER_STORE, false },
	{ "gRPC unavailable, Trailers-Only", 200, 14, true, true, "", false, true,
	  IDEM_AFTER_EXPIRE, false },
	{ "gRPC internal after a message", 200, 13, true, true, "\1msg", true, false,
	  IDEM_AFTER_EXPIRE, false },
	{ "gRPC deadline-exceeded", 200, 4, true, true, "", true, false, IDEM_AFTER_EXPIRE, false },
	{ "gRPC ok, body + trailers over 64", 200, 0, true, true, BODY40, true, false,
	  IDEM_AFTER_KEEP, false },
	{ "gRPC call answered HTTP 503", 503, -1, true, true, "", false, false,
	  IDEM_AFTER_EXPIRE, false },
	/* SPEC §6 release_on */
	{ "HTTP 503, refused", 503, -1, true, true, "busy", false, false, IDEM_AFTER_RELEASE,
	  true },
	{ "HTTP 429, refused", 429, -1, true, true, "slow down", false, false,
	  IDEM_AFTER_RELEASE, true },
	{ "gRPC resource-exhausted, Trailers-Only, refused", 200, 8, true, true, "", false, true,
	  IDEM_AFTER_RELEASE, true },
	/* a message went out: the call was committed, it ran whatever its trailers say */
	{ "gRPC resource-exhausted after a message", 200, 8, true, true, "\1msg", true, false,
	  IDEM_AFTER_EXPIRE, true },
};

/* The trailers as the upstream sent them: what is not a trailer is not stored. */
static const struct http_hdr job_trailers[] = {
	{ "grpc-status", "0", 11, 1, false },
	{ ":status", "200", 7, 3, false },
	{ "grpc-message", "fine", 12, 4, false },
	{ "connection", "close", 10, 5, false },
	{ "x-hop", "1", 5, 1, true },
};
#define JOB_TRAILERS_STORED "grpc-status: 0\r\ngrpc-message: fine\r\n"

struct job_env {
	struct loop loop;
	struct cfg_idempotency ic;
	char *methods[1];
};

static void job_env_init(struct job_env *e)
{
	memset(e, 0, sizeof *e);
	e->loop.base = event_base_new();
	e->methods[0] = (char *)"POST";
	e->ic = memory_cfg();
	e->ic.enabled = true;
	e->ic.header = (char *)"Idempotency-Key";
	e->ic.methods = e->methods;
	e->ic.nmethods = 1;
	e->ic.ttl_us = LONG_MS * MS;
	e->ic.lock_timeout_us = SHORT_MS * MS;
	e->ic.max_response = JOB_MAX_RESPONSE;
}

/* Row I's request, claimed through a job; the answer in G. */
static struct idem_job *job_claim(struct job_env *e, int i, struct got *g)
{
	char key[32];
	snprintf(key, sizeof key, "job-row-%d", i);
	struct http_hdr h[] = {
		{ "Idempotency-Key", key, 15, (uint32_t)strlen(key), false },
		{ "Content-Type", "application/grpc", 12, 16, false },
	};
	struct http_head req;
	memset(&req, 0, sizeof req);
	strcpy(req.method, "POST");
	req.path = "/shop.Orders/Place";
	req.path_len = strlen(req.path);
	req.hdrs = h;
	req.nhdrs = 2;
	struct evbuffer *body = evbuffer_new();
	evbuffer_add(body, "order", 5);
	const char *err = NULL;
	got_clear(g);
	struct idem_job *j = idem_job_claim(&e->loop, &e->ic, "shop", &req, body, got_cb, g, &err);
	evbuffer_free(body);
	assert_non_null(j);
	wait_done(e->loop.base, g);
	return j;
}

/* What row R's repeat gets: the response it stored, exactly as relayed. */
static void assert_job_replay(const struct got *g, const struct job_row *r)
{
	assert_int_equal(g->r, IDEM_REPLAY);
	assert_int_equal(g->status, r->status);
	const char *head = r->head_status ? "content-type: application/grpc\r\ngrpc-status: 5\r\n"
	                                  : "content-type: application/grpc\r\n";
	assert_int_equal(g->headers_len, strlen(head));
	assert_memory_equal(g->headers, head, strlen(head));
	assert_int_equal(g->body_len, strlen(r->body));
	assert_memory_equal(g->body, r->body, strlen(r->body));
	const char *tr = r->trailers ? JOB_TRAILERS_STORED : "";
	assert_int_equal(g->trailers_len, strlen(tr));
	assert_memory_equal(g->trailers, tr, strlen(tr));
}

/* Every row: claim, record head, body and trailers, settle; then a repeat of the same
 * request right away and again after lock_timeout tells what the claim became: STORE
 * replays, KEEP stays in progress past lock_timeout, EXPIRE is in progress until it and
 * claimable after, RELEASE is claimable at once. */
static void test_job_settle(void **state)
{
	struct job_env e;
	struct got g = { 0 };
	size_t nrows = sizeof job_rows / sizeof *job_rows;

	job_env_init(&e);
	for (size_t i = 0; i < nrows; i++) {
		const struct job_row *r = &job_rows[i];
		struct idem_job *j = job_claim(&e, (int)i, &g);
		assert_int_equal(g.r, IDEM_CLAIMED);
		assert_true(idem_job_owns(j));
		if (r->status > 0) {
			struct http_hdr f[] = {
				{ "content-type", "application/grpc", 12, 16, false },
				{ "grpc-status", "5", 11, 1, false },
				{ "X-Retrygate-Attempts", "1", 20, 1, false },     /* ours: not stored */
			};
			struct http_hdr fields[2] = { f[0], r->head_status ? f[1] : f[2] };
			struct resp_head h = { .status = r->status, .hdrs = fields, .nhdrs = 2,
			                       .content_length = -1, .end_stream = r->head_status };
			idem_job_record_head(j, &h);
			struct evbuffer *b = evbuffer_new();
			evbuffer_add(b, r->body, strlen(r->body));
			idem_job_record_body(j, b);
			assert_int_equal(evbuffer_get_length(b), strlen(r->body));   /* untouched */
			evbuffer_free(b);
			if (r->trailers)
				idem_job_record_trailers(j, job_trailers,
				                         (int)(sizeof job_trailers / sizeof *job_trailers));
		}
		bool stored = idem_job_settle(j, r->status, r->grpc, r->reached, r->refused,
		                              r->complete);
		if (stored != (r->want == IDEM_AFTER_STORE))
			fail_msg("job \"%s\": settle said stored=%d", r->what, stored);
		assert_false(idem_job_owns(j));
		/* settled once: a second settle does nothing */
		assert_false(idem_job_settle(j, 200, 0, true, false, true));
		idem_job_free(j);
	}
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1)
			run_for(e.loop.base, PAST_MS);
		for (size_t i = 0; i < nrows; i++) {
			const struct job_row *r = &job_rows[i];
			struct idem_job *j = job_claim(&e, (int)i, &g);
			enum idem_result want =
				r->want == IDEM_AFTER_STORE ? IDEM_REPLAY :
				r->want == IDEM_AFTER_RELEASE ? IDEM_CLAIMED :
				r->want == IDEM_AFTER_KEEP ? IDEM_IN_PROGRESS :
				pass == 0 ? IDEM_IN_PROGRESS : IDEM_CLAIMED;
			if (g.r != want)
				fail_msg("job \"%s\", %s lock_timeout: got %s, want %s", r->what,
				         pass ? "after" : "before", idem_result_name(g.r),
				         idem_result_name(want));
			if (g.r == IDEM_REPLAY)
				assert_job_replay(&g, r);
			/* a repeat that claimed leaves it unsettled: it lapses at lock_timeout */
			idem_job_free(j);
		}
	}
	got_clear(&g);
	idem_store_release_all();
	event_base_free(e.loop.base);
}

/* ------------------------------------------------------------------ the replay */

/* A responder that writes down what it was given, in order. */
struct rec_rsp {
	char log[256];
	size_t loglen;
	bool end_stream;
	int64_t content_length;
	char body[64];
	size_t body_len;
	char trailers[128];
};

static void rr_note(struct rec_rsp *r, const char *what)
{
	r->loglen += (size_t)snprintf(r->log + r->loglen, sizeof r->log - r->loglen, "%s%s",
	                              r->loglen ? "," : "", what);
}

static void rr_head(void *arg, const struct resp_head *h)
{
	struct rec_rsp *r = arg;
	rr_note(r, "head");
	r->end_stream = h->end_stream;
	r->content_length = h->content_length;
}

static void rr_body(void *arg, struct evbuffer *data)
{
	struct rec_rsp *r = arg;
	rr_note(r, "body");
	size_t n = evbuffer_get_length(data);
	assert_true(r->body_len + n <= sizeof r->body);
	evbuffer_remove(data, r->body + r->body_len, n);
	r->body_len += n;
}

static void rr_trailers(void *arg, const struct http_hdr *t, int n)
{
	struct rec_rsp *r = arg;
	size_t k = 0;
	rr_note(r, "trailers");
	for (int i = 0; i < n; i++)
		k += (size_t)snprintf(r->trailers + k, sizeof r->trailers - k, "%.*s=%.*s;",
		                      (int)t[i].nlen, t[i].name, (int)t[i].vlen, t[i].value);
}

/* A stored response goes back out as it was relayed (SPEC §6, §10): replay marker in the
 * first header block, the body, the trailers after it; Trailers-Only stays Trailers-Only. */
static void test_replay(void **state)
{
	static const struct {
		const char *what;
		int resp;                   /* index in responses[] */
		const char *seq;            /* the responder calls */
		bool end_stream;
		int64_t content_length;
		const char *trailers;
	} rows[] = {
		{ "HTTP with a body", 0, "head,body", false, 8, "" },
		{ "HTTP 204", 2, "head", false, -1, "" },
		{ "gRPC message and trailers", 3, "head,body,trailers", false, -1,
		  "grpc-status=0;grpc-message=fine;" },
		{ "gRPC Trailers-Only", 4, "head", true, -1, "" },
		{ "gRPC headers then trailers", 5, "head,trailers", false, -1, "grpc-status=6;" },
	};
	for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
		const struct idem_response *st = &responses[rows[i].resp];
		struct idem_replay m;
		idem_replay(&m, st);
		/* the stored fields, then the replay's own two */
		int n = m.head.nhdrs;
		assert_true(n >= 2);
		assert_true(str_ieq(m.fields[n - 2].name, m.fields[n - 2].nlen,
		                    "Idempotency-Replayed", 20));
		assert_memory_equal(m.fields[n - 2].value, "true", 4);
		assert_true(str_ieq(m.fields[n - 1].name, m.fields[n - 1].nlen,
		                    "X-Retrygate-Attempts", 20));
		respond_request_id(&m.head, m.fields, (int)(sizeof m.fields / sizeof *m.fields),
		                   "req-1");
		struct rec_rsp r;
		memset(&r, 0, sizeof r);
		struct responder rsp = { .head = rr_head, .body = rr_body, .trailers = rr_trailers,
		                         .arg = &r };
		idem_replay_send(&rsp, &m, st->body);
		if (strcmp(r.log, rows[i].seq) != 0)
			fail_msg("replay \"%s\": calls %s, want %s", rows[i].what, r.log, rows[i].seq);
		assert_int_equal(r.end_stream, rows[i].end_stream);
		assert_int_equal(r.content_length, rows[i].content_length);
		size_t blen = rows[i].resp == 2 ? 0 : st->body_len;
		assert_int_equal(r.body_len, blen);
		assert_memory_equal(r.body, st->body, blen);
		assert_string_equal(r.trailers, rows[i].trailers);
	}
}

/* ------------------------------------------------------------------ memory store */

static void test_memory_scenarios(void **state)
{
	struct cfg_idempotency c = memory_cfg();
	struct event_base *base = event_base_new();
	const char *err = NULL;
	struct idem_store *s = idem_store_get(&c, base, NULL, &err);
	assert_non_null(s);
	/* cached per base */
	assert_ptr_equal(idem_store_get(&c, base, NULL, &err), s);
	run_scenarios(base, s, "memory");
	run_large(base, s);
	idem_store_release_all();
	event_base_free(base);
}

static void test_memory_shared_across_bases(void **state)
{
	struct cfg_idempotency c = memory_cfg();
	struct event_base *b1 = event_base_new(), *b2 = event_base_new();
	struct idem_store *s1 = idem_store_get(&c, b1, NULL, NULL);
	struct idem_store *s2 = idem_store_get(&c, b2, NULL, NULL);
	struct idem_key k;
	struct got g = { 0 };

	assert_ptr_not_equal(s1, s2);
	make_key(&k, "shared", 0);
	assert_int_equal(claim_wait(b1, s1, &k, LONG_MS * MS, &g), IDEM_CLAIMED);
	assert_int_equal(claim_wait(b2, s2, &k, LONG_MS * MS, &g), IDEM_IN_PROGRESS);
	idem_complete(s1, &k, &responses[0], LONG_MS * MS);
	assert_int_equal(claim_wait(b2, s2, &k, LONG_MS * MS, &g), IDEM_REPLAY);
	assert_response(&g, &responses[0]);
	got_clear(&g);
	/* a worker going away leaves the records to the others */
	idem_store_release_base(b1);
	assert_int_equal(claim_wait(b2, s2, &k, LONG_MS * MS, &g), IDEM_REPLAY);
	got_clear(&g);
	idem_store_release_all();
	event_base_free(b1);
	event_base_free(b2);
}

static void test_memory_cancel(void **state)
{
	struct cfg_idempotency c = memory_cfg();
	struct event_base *base = event_base_new();
	struct idem_store *s = idem_store_get(&c, base, NULL, NULL);
	struct idem_key k;
	struct got g = { 0 }, never = { 0 };

	make_key(&k, "cancel", 0);
	struct idem_op *op = idem_claim(s, &k, LONG_MS * MS, got_cb, &never);
	assert_false(never.done);
	idem_cancel(op);
	run_for(base, 20);
	assert_int_equal(never.calls, 0);
	/* the claim itself was made: unreported, it lapses like any unknown outcome */
	assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_IN_PROGRESS);
	/* a pending op still queued when its handle goes is freed, never called */
	idem_claim(s, &k, LONG_MS * MS, got_cb, &never);
	idem_store_release_base(base);
	run_for(base, 10);
	assert_int_equal(never.calls, 0);
	got_clear(&g);
	idem_store_release_all();
	event_base_free(base);
}

static void test_memory_limit(void **state)
{
	struct cfg_idempotency c = memory_cfg();
	struct event_base *base = event_base_new();
	struct idem_store *s = idem_store_get(&c, base, NULL, NULL);
	struct idem_key k[5];
	struct got g = { 0 };
	size_t records, bytes, one;
	char name[32];

	for (int i = 0; i < 5; i++) {
		snprintf(name, sizeof name, "limit-%d", i);
		make_key(&k[i], name, 0);
	}
	idem_memory_stats(&records, &bytes);
	assert_int_equal(records, 0);
	assert_int_equal(claim_wait(base, s, &k[0], LONG_MS * MS, &g), IDEM_CLAIMED);
	idem_memory_stats(&records, &one);
	assert_int_equal(records, 1);
	/* room for three bare records */
	idem_memory_set_limit(3 * one);
	assert_int_equal(claim_wait(base, s, &k[1], LONG_MS * MS, &g), IDEM_CLAIMED);
	assert_int_equal(claim_wait(base, s, &k[2], LONG_MS * MS, &g), IDEM_CLAIMED);
	/* full: a new claim fails closed; existing keys still answer */
	assert_int_equal(claim_wait(base, s, &k[3], LONG_MS * MS, &g), IDEM_UNAVAILABLE);
	assert_int_equal(claim_wait(base, s, &k[0], LONG_MS * MS, &g), IDEM_IN_PROGRESS);
	/* a response that does not fit is kept claimed, never dropped */
	idem_complete(s, &k[0], &responses[0], LONG_MS * MS);
	assert_int_equal(claim_wait(base, s, &k[0], LONG_MS * MS, &g), IDEM_IN_PROGRESS);
	idem_memory_stats(&records, &bytes);
	assert_int_equal(records, 3);
	assert_true(bytes <= 3 * one);
	/* a dead record makes room, once the store looks again (at most every 100 ms when full) */
	idem_release(s, &k[2]);
	run_for(base, 150);
	assert_int_equal(claim_wait(base, s, &k[3], LONG_MS * MS, &g), IDEM_CLAIMED);
	/* with room, responses are stored again */
	idem_memory_set_limit(0);
	idem_complete(s, &k[1], &responses[1], LONG_MS * MS);
	assert_int_equal(claim_wait(base, s, &k[1], LONG_MS * MS, &g), IDEM_REPLAY);
	assert_response(&g, &responses[1]);
	got_clear(&g);
	idem_store_release_all();
	idem_memory_stats(&records, &bytes);
	assert_int_equal(records, 0);
	assert_int_equal(bytes, 0);
	event_base_free(base);
}

/* Trailers count against the cap like the body: two records that differ only in their
 * trailers differ in size by exactly the trailer bytes, and a response that fits without its
 * trailers but not with them is kept claimed, not stored. */
static void test_memory_limit_trailers(void **state)
{
	struct cfg_idempotency c = memory_cfg();
	struct event_base *base = event_base_new();
	struct idem_store *s = idem_store_get(&c, base, NULL, NULL);
	struct idem_key k[3];
	struct got g = { 0 };
	size_t records, b0, b1, b2;
	const struct idem_response *with = &responses[3];
	struct idem_response without = *with;
	without.trailers = NULL;
	without.trailers_len = 0;

	make_key(&k[0], "limit-tr-0", 0);
	make_key(&k[1], "limit-tr-1", 0);
	make_key(&k[2], "limit-tr-2", 0);
	idem_memory_stats(&records, &b0);
	assert_int_equal(claim_wait(base, s, &k[0], LONG_MS * MS, &g), IDEM_CLAIMED);
	idem_complete(s, &k[0], &without, LONG_MS * MS);
	idem_memory_stats(&records, &b1);
	assert_int_equal(claim_wait(base, s, &k[1], LONG_MS * MS, &g), IDEM_CLAIMED);
	idem_complete(s, &k[1], with, LONG_MS * MS);
	idem_memory_stats(&records, &b2);
	assert_int_equal(records, 2);
	assert_int_equal(b2 - b1, (b1 - b0) + with->trailers_len);
	assert_int_equal(claim_wait(base, s, &k[1], LONG_MS * MS, &g), IDEM_REPLAY);
	assert_response(&g, with);
	/* room for one more record of the trailer-less size, not one byte more */
	idem_memory_set_limit(b2 + (b1 - b0));
	assert_int_equal(claim_wait(base, s, &k[2], LONG_MS * MS, &g), IDEM_CLAIMED);
	idem_complete(s, &k[2], with, LONG_MS * MS);
	assert_int_equal(claim_wait(base, s, &k[2], LONG_MS * MS, &g), IDEM_IN_PROGRESS);
	got_clear(&g);
	idem_memory_set_limit(0);
	idem_store_release_all();
	idem_memory_stats(&records, &b0);
	assert_int_equal(records, 0);
	assert_int_equal(b0, 0);
	event_base_free(base);
}

static void test_memory_sweep(void **state)
{
	struct cfg_idempotency c = memory_cfg();
	struct event_base *base = event_base_new();
	struct idem_store *s = idem_store_get(&c, base, NULL, NULL);
	struct got g = { 0 };
	size_t records, bytes;
	char name[32];

	/* enough records to make the table grow a few times */
	for (int i = 0; i < 5000; i++) {
		struct idem_key k;
		snprintf(name, sizeof name, "sweep-%d", i);
		make_key(&k, name, 0);
		assert_int_equal(claim_wait(base, s, &k, i % 2 ? 30 * MS : LONG_MS * MS, &g),
		                 IDEM_CLAIMED);
		if (i % 4 == 0)
			idem_complete(s, &k, &responses[0], i % 8 ? 30 * MS : LONG_MS * MS);
	}
	/* claims sweep a few buckets each, so some short ones may be gone already */
	idem_memory_stats(&records, &bytes);
	assert_true(records <= 5000 && records >= 5000 / 2 - 5000 / 8);
	run_for(base, 60);
	idem_store_sweep();
	idem_memory_stats(&records, &bytes);
	/* left: the even ones with a long lock, of which every 4th was completed with a long
	 * ttl when i % 8 == 0 and a short one when i % 8 == 4 */
	assert_int_equal(records, 5000 / 2 - 5000 / 8);
	/* the survivors still answer */
	struct idem_key k;
	make_key(&k, "sweep-8", 0);
	assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_REPLAY);
	make_key(&k, "sweep-2", 0);
	assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_IN_PROGRESS);
	got_clear(&g);
	idem_store_release_all();
	event_base_free(base);
}

/* Threads, each with its own event_base and handle, claim the same keys in different
 * orders; whoever gets CLAIMED completes. Exactly one CLAIMED per key, ever. */
#define NTHREADS 8
#define NKEYS    256
#define ROUNDS   3

struct hammer {
	int id;
	pthread_barrier_t *go;
	atomic_int *claimed;            /* [NKEYS] */
	int in_progress, replayed, bad;
};

static void *hammer_thread(void *arg)
{
	struct hammer *h = arg;
	struct cfg_idempotency c = memory_cfg();
	struct event_base *base = event_base_new();
	const char *err = NULL;
	struct idem_store *s = idem_store_get(&c, base, NULL, &err);
	struct got g = { 0 };
	char name[32], body[32];

	pthread_barrier_wait(h->go);
	for (int round = 0; round < ROUNDS; round++) {
		for (int n = 0; n < NKEYS; n++) {
			/* thread i walks the keys with stride 2i+1 (odd: a permutation of NKEYS) */
			int i = (n * (2 * h->id + 1) + h->id * 17) % NKEYS;
			struct idem_key k;
			snprintf(name, sizeof name, "hammer-%d", i);
			make_key(&k, name, 0);
			got_clear(&g);
			idem_claim(s, &k, LONG_MS * MS, got_cb, &g);
			while (!g.done)
				event_base_loop(base, EVLOOP_ONCE);
			int blen = snprintf(body, sizeof body, "key %d", i);
			switch (g.r) {
			case IDEM_CLAIMED: {
				atomic_fetch_add(&h->claimed[i], 1);
				struct idem_response resp = { 200, "", 0, body, (size_t)blen, NULL, 0 };
				idem_complete(s, &k, &resp, LONG_MS * MS);
				break;
			}
			case IDEM_IN_PROGRESS:
				h->in_progress++;
				break;
			case IDEM_REPLAY:
				h->replayed++;
				if (g.body_len != (size_t)blen || memcmp(g.body, body, (size_t)blen) != 0)
					h->bad++;
				break;
			default:
				h->bad++;
				break;
			}
		}
	}
	got_clear(&g);
	idem_store_release_base(base);
	event_base_free(base);
	return NULL;
}

static void test_memory_threads(void **state)
{
	pthread_barrier_t go;
	atomic_int claimed[NKEYS];
	struct hammer h[NTHREADS];
	pthread_t th[NTHREADS];

	for (int i = 0; i < NKEYS; i++)
		atomic_init(&claimed[i], 0);
	pthread_barrier_init(&go, NULL, NTHREADS);
	for (int i = 0; i < NTHREADS; i++) {
		h[i] = (struct hammer){ .id = i, .go = &go, .claimed = claimed };
		assert_int_equal(pthread_create(&th[i], NULL, hammer_thread, &h[i]), 0);
	}
	int total = 0, replayed = 0;
	for (int i = 0; i < NTHREADS; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(h[i].bad, 0);
		total += h[i].in_progress + h[i].replayed;
		replayed += h[i].replayed;
	}
	pthread_barrier_destroy(&go);
	for (int i = 0; i < NKEYS; i++)
		if (atomic_load(&claimed[i]) != 1)
			fail_msg("key %d claimed %d times", i, atomic_load(&claimed[i]));
	assert_int_equal(total + NKEYS, NTHREADS * NKEYS * ROUNDS);
	/* a thread replays at least the keys it claimed itself, in its later rounds */
	assert_true(replayed >= NKEYS * (ROUNDS - 1));
	size_t records, bytes;
	idem_memory_stats(&records, &bytes);
	assert_int_equal(records, NKEYS);
	/* afterwards every key replays its one response */
	struct cfg_idempotency c = memory_cfg();
	struct event_base *base = event_base_new();
	struct idem_store *s = idem_store_get(&c, base, NULL, NULL);
	struct got g = { 0 };
	for (int i = 0; i < NKEYS; i++) {
		char name[32], body[32];
		struct idem_key k;
		snprintf(name, sizeof name, "hammer-%d", i);
		make_key(&k, name, 0);
		int blen = snprintf(body, sizeof body, "key %d", i);
		assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_REPLAY);
		assert_int_equal(g.body_len, (size_t)blen);
		assert_memory_equal(g.body, body, (size_t)blen);
	}
	got_clear(&g);
	idem_store_release_all();
	event_base_free(base);
}

/* ------------------------------------------------------------------ redis store */

/* The store's reply timeout in these tests: generous by default, so a loaded machine running
 * the sanitizer build does not fail a scenario, and short where a test measures the bound. */
#define RELAXED_US (5 * S)
#define BOUND_US   (400 * MS)

struct redis_proc {
	pid_t pid;
	int port;
};

/* Every server this binary started and has not stopped: a failing test leaves through a
 * longjmp, so its servers are killed by the teardown, never left running. */
static pid_t servers[8];

static void servers_add(pid_t pid)
{
	for (size_t i = 0; i < sizeof servers / sizeof *servers; i++) {
		if (!servers[i]) {
			servers[i] = pid;
			return;
		}
	}
	kill(pid, SIGKILL);
	fail_msg("too many redis-servers at once");
}

static void server_kill(pid_t pid)
{
	for (size_t i = 0; i < sizeof servers / sizeof *servers; i++)
		if (servers[i] == pid)
			servers[i] = 0;
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

static int kill_servers(void **state)
{
	for (size_t i = 0; i < sizeof servers / sizeof *servers; i++)
		if (servers[i])
			server_kill(servers[i]);
	idem_redis_set_timeout(RELAXED_US);
	return 0;
}

static bool find_redis(char *path, size_t cap)
{
	const char *p = getenv("PATH");
	if (!p)
		return false;
	while (*p) {
		const char *e = strchr(p, ':');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		snprintf(path, cap, "%.*s/redis-server", (int)n, p);
		if (n && access(path, X_OK) == 0)
			return true;
		p += n + (e ? 1 : 0);
	}
	return false;
}

static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof a;
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* A blocking client for the test's own checks (never used by the store). */
static redisContext *sync_client(int port)
{
	struct timeval tv = { 0, 200000 };
	redisContext *rc = redisConnectWithTimeout("127.0.0.1", port, tv);
	if (!rc || rc->err) {
		if (rc)
			redisFree(rc);
		return NULL;
	}
	redisSetTimeout(rc, (struct timeval){ 2, 0 });
	return rc;
}

/* Starts redis-server on PORT with EXTRA args (NULL-terminated) and waits until it answers;
 * false when there is none on PATH. */
static bool redis_start_on(struct redis_proc *rp, int port, const char *const *extra)
{
	char path[4096], portstr[16];
	if (!find_redis(path, sizeof path))
		return false;
	rp->port = port;
	snprintf(portstr, sizeof portstr, "%d", port);
	const char *argv[32] = { "redis-server", "--port", portstr, "--bind", "127.0.0.1",
	                         "--save", "", "--appendonly", "no", "--daemonize", "no",
	                         "--loglevel", "warning" };
	int n = 13;
	for (int i = 0; extra && extra[i] && n < 31; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	rp->pid = fork();
	assert_true(rp->pid >= 0);
	if (rp->pid == 0) {
		int null = open("/dev/null", O_RDWR);
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
		execv(path, (char *const *)argv);
		_exit(127);
	}
	servers_add(rp->pid);
	int64_t until = clock_now_us() + 10 * S;
	while (clock_now_us() < until) {
		redisContext *rc = sync_client(port);
		if (rc) {
			redisReply *r = redisCommand(rc, "PING");
			bool up = r != NULL;
			if (r)
				freeReplyObject(r);
			redisFree(rc);
			if (up)
				return true;
		}
		usleep(20000);
	}
	fail_msg("redis-server did not come up on port %d", port);
	return false;
}

static bool redis_start(struct redis_proc *rp, const char *const *extra)
{
	return redis_start_on(rp, free_port(), extra);
}

static void redis_stop(struct redis_proc *rp)
{
	if (rp->pid > 0) {
		server_kill(rp->pid);
		rp->pid = 0;
	}
}

static struct cfg_idempotency redis_cfg(char *url, size_t cap, const char *host, int port,
                                        int db, const char *user, const char *password)
{
	struct cfg_idempotency c;
	memset(&c, 0, sizeof c);
	snprintf(url, cap, "redis://%s%s%s%s%s:%d/%d", user ? user : "", password ? ":" : "",
	         password ? password : "", password ? "@" : "", host, port, db);
	c.store = url;
	c.store_host = (char *)host;
	c.store_port = port;
	c.store_db = db;
	c.store_user = (char *)user;
	c.store_password = (char *)password;
	return c;
}

#define NEED_REDIS(rp, extra) do { if (!redis_start((rp), (extra))) { \
	print_message("redis-server not on PATH: skipped\n"); skip(); } } while (0)

static void test_redis_scenarios(void **state)
{
	struct redis_proc rp;
	char url[256];
	NEED_REDIS(&rp, NULL);
	struct cfg_idempotency c = redis_cfg(url, sizeof url, "127.0.0.1", rp.port, 0, NULL, NULL);
	struct event_base *base = event_base_new();
	const char *err = NULL;
	struct idem_store *s = idem_store_get(&c, base, NULL, &err);
	assert_non_null(s);
	assert_ptr_equal(idem_store_get(&c, base, NULL, &err), s);
	run_scenarios(base, s, "redis");
	run_large(base, s);
	idem_store_release_all();
	event_base_free(base);
	redis_stop(&rp);
}

/* The layout a second replica (or an operator) sees: the key, the record, the expiry, the db. */
static void test_redis_layout_and_db(void **state)
{
	struct redis_proc rp;
	char url[256], keyname[128];
	NEED_REDIS(&rp, NULL);
	struct cfg_idempotency c = redis_cfg(url, sizeof url, "127.0.0.1", rp.port, 3, NULL, NULL);
	struct event_base *base = event_base_new();
	struct idem_store *s = idem_store_get(&c, base, NULL, NULL);
	struct idem_key k;
	struct got g = { 0 };

	make_key(&k, "layout", 0);
	assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_CLAIMED);
	idem_complete(s, &k, &responses[1], 60 * S);
	assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_REPLAY);

	int n = snprintf(keyname, sizeof keyname, "retrygate:idem:");
	for (int i = 0; i < 32; i++)
		n += snprintf(keyname + n, sizeof keyname - (size_t)n, "%02x", k.scope[i]);
	redisContext *rc = sync_client(rp.port);
	assert_non_null(rc);
	redisReply *r = redisCommand(rc, "EXISTS %s", keyname);
	assert_int_equal(r->integer, 0);    /* not in db 0 */
	freeReplyObject(r);
	freeReplyObject(redisCommand(rc, "SELECT 3"));
	r = redisCommand(rc, "GET %s", keyname);
	assert_int_equal(r->type, REDIS_REPLY_STRING);
	struct rec rec;
	assert_true(rec_decode((const unsigned char *)r->str, (size_t)r->len, &rec));
	assert_int_equal(rec.state, REC_DONE);
	assert_memory_equal(rec.fp, k.fp, 32);
	assert_int_equal(rec.resp.body_len, responses[1].body_len);
	assert_memory_equal(rec.resp.body, responses[1].body, responses[1].body_len);
	freeReplyObject(r);
	r = redisCommand(rc, "PTTL %s", keyname);
	assert_true(r->integer > 50000 && r->integer <= 60000);
	freeReplyObject(r);

	/* a record written by another replica is understood; a corrupt one fails closed */
	struct idem_key other;
	make_key(&other, "layout", 1);
	unsigned char rec_bytes[REC_HEAD_LEN];
	rec_encode(rec_bytes, REC_KEPT, other.fp, NULL);
	freeReplyObject(redisCommand(rc, "SET %s %b", keyname, rec_bytes, sizeof rec_bytes));
	assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_MISMATCH);
	assert_int_equal(claim_wait(base, s, &other, LONG_MS * MS, &g), IDEM_IN_PROGRESS);
	static const char *const garbage[] = { "", "hello", "RGI1", "RGI1Dxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" };
	for (size_t i = 0; i < sizeof garbage / sizeof *garbage; i++) {
		freeReplyObject(redisCommand(rc, "SET %s %s", keyname, garbage[i]));
		assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_UNAVAILABLE);
	}
	/* a key of the wrong type is an error reply: fail closed too */
	freeReplyObject(redisCommand(rc, "DEL %s", keyname));
	freeReplyObject(redisCommand(rc, "LPUSH %s x", keyname));
	assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_UNAVAILABLE);
	/* and the connection survived all that */
	freeReplyObject(redisCommand(rc, "DEL %s", keyname));
	assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_CLAIMED);
	redisFree(rc);
	got_clear(&g);
	idem_store_release_all();
	event_base_free(base);
	redis_stop(&rp);
}

static void redis_key_name(char out[128], const struct idem_key *k)
{
	int n = snprintf(out, 128, "retrygate:idem:");
	for (int i = 0; i < 32; i++)
		n += snprintf(out + n, 128 - (size_t)n, "%02x", k->scope[i]);
}

/* Rolling deploy: one redis, two versions. A record the version before trailers wrote (the
 * literal old_record) replays as a response without trailers; this version writes a response
 * without trailers in exactly that form, and one with trailers in the version-2 form. */
static void test_redis_old_record(void **state)
{
	struct redis_proc rp;
	char url[256], name[128];
	NEED_REDIS(&rp, NULL);
	struct cfg_idempotency c = redis_cfg(url, sizeof url, "127.0.0.1", rp.port, 0, NULL, NULL);
	struct event_base *base = event_base_new();
	struct idem_store *s = idem_store_get(&c, base, NULL, NULL);
	struct idem_key k;
	struct got g = { 0 };
	redisContext *rc = sync_client(rp.port);
	assert_non_null(rc);

	make_scope(&k, "old-record");
	memcpy(k.fp, old_record + 5, 32);
	redis_key_name(name, &k);
	freeReplyObject(redisCommand(rc, "SET %s %b PX 60000", name, old_record,
	                             sizeof old_record));
	assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_REPLAY);
	const struct idem_response want = { 201, "X-A: bcd\r\n", 10, "ok", 2, NULL, 0 };
	assert_response(&g, &want);

	/* what this version writes */
	for (int i = 0; i < 2; i++) {
		const struct idem_response *resp = i == 0 ? &want : &responses[3];
		make_key(&k, i == 0 ? "written-1" : "written-2", 0);
		redis_key_name(name, &k);
		assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_CLAIMED);
		idem_complete(s, &k, resp, 60 * S);
		assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_REPLAY);
		assert_response(&g, resp);
		redisReply *r = redisCommand(rc, "GET %s", name);
		assert_int_equal(r->type, REDIS_REPLY_STRING);
		assert_int_equal((size_t)r->len, rec_size(REC_DONE, resp));
		assert_memory_equal(r->str, i == 0 ? "RGI1" : "RGI2", 4);
		if (i == 0)
			assert_memory_equal(r->str + REC_HEAD_LEN, old_record + REC_HEAD_LEN,
			                    sizeof old_record - REC_HEAD_LEN);
		freeReplyObject(r);
	}
	redisFree(rc);
	got_clear(&g);
	idem_store_release_all();
	event_base_free(base);
	redis_stop(&rp);
}

static void test_redis_auth(void **state)
{
	static const char *const extra[] = { "--requirepass", "s3cret", NULL };
	struct redis_proc rp;
	char url1[256], url2[256], url3[256], url4[256];
	NEED_REDIS(&rp, extra);
	struct event_base *base = event_base_new();
	struct idem_key k;
	struct got g = { 0 };
	make_key(&k, "auth", 0);

	struct cfg_idempotency good = redis_cfg(url1, sizeof url1, "127.0.0.1", rp.port, 0, NULL,
	                                        "s3cret");
	struct cfg_idempotency acl = redis_cfg(url2, sizeof url2, "127.0.0.1", rp.port, 0,
	                                       "default", "s3cret");
	struct cfg_idempotency bad = redis_cfg(url3, sizeof url3, "127.0.0.1", rp.port, 0, NULL,
	                                       "wrong");
	struct cfg_idempotency none = redis_cfg(url4, sizeof url4, "127.0.0.1", rp.port, 0, NULL,
	                                        NULL);
	struct idem_store *sg = idem_store_get(&good, base, NULL, NULL);
	struct idem_store *sa = idem_store_get(&acl, base, NULL, NULL);
	struct idem_store *sb = idem_store_get(&bad, base, NULL, NULL);
	struct idem_store *sn = idem_store_get(&none, base, NULL, NULL);
	assert_int_equal(claim_wait(base, sg, &k, LONG_MS * MS, &g), IDEM_CLAIMED);
	assert_int_equal(claim_wait(base, sa, &k, LONG_MS * MS, &g), IDEM_IN_PROGRESS);
	assert_int_equal(claim_wait(base, sb, &k, LONG_MS * MS, &g), IDEM_UNAVAILABLE);
	assert_int_equal(claim_wait(base, sn, &k, LONG_MS * MS, &g), IDEM_UNAVAILABLE);
	got_clear(&g);
	idem_store_release_all();
	event_base_free(base);
	redis_stop(&rp);
}

/* A host name goes through evdns (here from the hosts file), never a blocking lookup. */
static void test_redis_host_name(void **state)
{
	static const char *const extra[] = { "--bind", "127.0.0.1", "-::1", NULL };
	struct redis_proc rp;
	char url[256];
	NEED_REDIS(&rp, extra);
	struct event_base *base = event_base_new();
	struct evdns_base *dns = evdns_base_new(base, 0);
	evdns_base_load_hosts(dns, NULL);
	struct cfg_idempotency c = redis_cfg(url, sizeof url, "localhost", rp.port, 0, NULL, NULL);
	const char *err = NULL;
	struct idem_key k;
	struct got g = { 0 };

	assert_null(idem_store_get(&c, base, NULL, &err));
	assert_non_null(err);
	struct idem_store *s = idem_store_get(&c, base, dns, &err);
	assert_non_null(s);
	make_key(&k, "name", 0);
	/* "localhost" may name ::1 first where IPv6 is off: the store moves to the next address
	 * on its next connect, so allow a few rounds */
	enum idem_result r = IDEM_UNAVAILABLE;
	for (int i = 0; i < 40 && r == IDEM_UNAVAILABLE; i++) {
		r = claim_wait(base, s, &k, LONG_MS * MS, &g);
		if (r == IDEM_UNAVAILABLE)
			run_for(base, 100);
	}
	assert_int_equal(r, IDEM_CLAIMED);
	got_clear(&g);
	idem_store_release_base(base);
	evdns_base_free(dns, 0);
	idem_store_release_all();
	event_base_free(base);
	redis_stop(&rp);
}

static void test_redis_cancel(void **state)
{
	struct redis_proc rp;
	char url[256];
	NEED_REDIS(&rp, NULL);
	struct cfg_idempotency c = redis_cfg(url, sizeof url, "127.0.0.1", rp.port, 0, NULL, NULL);
	struct event_base *base = event_base_new();
	struct idem_store *s = idem_store_get(&c, base, NULL, NULL);
	struct idem_key k;
	struct got g = { 0 }, never = { 0 };

	/* connected first, so that the claim below is sent at once (before the handshake's
	 * TIME has answered, a claim waits in the store and a cancel takes it back unsent) */
	make_key(&k, "cancel-warm", 0);
	assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_CLAIMED);
	got_clear(&g);
	make_key(&k, "cancel", 0);
	idem_cancel(idem_claim(s, &k, LONG_MS * MS, got_cb, &never));
	run_for(base, 100);
	assert_int_equal(never.calls, 0);
	assert_int_equal(claim_wait(base, s, &k, LONG_MS * MS, &g), IDEM_IN_PROGRESS);
	/* ops in flight when the handle goes are freed, never called */
	idem_claim(s, &k, LONG_MS * MS, got_cb, &never);
	idem_claim(s, &k, LONG_MS * MS, got_cb, &never);
	idem_store_release_base(base);
	run_for(base, 50);
	assert_int_equal(never.calls, 0);
	got_clear(&g);
	idem_store_release_all();
	event_base_free(base);
	redis_stop(&rp);
}

static int64_t timed_claim(struct event_base *base, struct idem_store *s, const struct idem_key *k,
                           struct got *g, enum idem_result *r)
{
	int64_t t0 = clock_now_us();
	*r = claim_wait(base, s, k, LONG_MS * MS, g);
	return clock_now_us() - t0;
}

/* Claims K until the store answers anything but UNAVAILABLE (it reconnects with a backoff of
 * up to 2 s): at most 100 tries, 50 ms apart. That answer. */
static enum idem_result claim_when_up(struct event_base *base, struct idem_store *s,
                                      const struct idem_key *k, struct got *g)
{
	enum idem_result r = IDEM_UNAVAILABLE;
	for (int i = 0; i < 100 && r == IDEM_UNAVAILABLE; i++) {
		r = claim_wait(base, s, k, LONG_MS * MS, g);
		if (r == IDEM_UNAVAILABLE)
			run_for(base, 50);
	}
	return r;
}

/* The server dies: the claim in flight and the ones after fail closed at once; when a server
 * is back on the port, the store reconnects by itself. */
static void test_redis_killed(void **state)
{
	struct redis_proc rp;
	char url[256];
	NEED_REDIS(&rp, NULL);
	struct cfg_idempotency c = redis_cfg(url, sizeof url, "127.0.0.1", rp.port, 0, NULL, NULL);
	struct event_base *base = event_base_new();
	struct idem_store *s = idem_store_get(&c, base, NULL, NULL);
	struct idem_key k;
	struct got g = { 0 };
	enum idem_result r;

	idem_redis_set_timeout(BOUND_US);
	make_key(&k, "killed", 0);
	/* the first claim also connects and loads the scripts: on a busy machine that can
	 * outlast the short reply timeout set above, so it may take more than one try */
	assert_int_equal(claim_when_up(base, s, &k, &g), IDEM_CLAIMED);
	/* in flight at the moment of death */
	struct got inflight = { 0 };
	idem_claim(s, &k, LONG_MS * MS, got_cb, &inflight);
	redis_stop(&rp);
	wait_done(base, &inflight);
	assert_int_equal(inflight.r, IDEM_UNAVAILABLE);
	for (int i = 0; i < 5; i++) {
		int64_t took = timed_claim(base, s, &k, &g, &r);
		assert_int_equal(r, IDEM_UNAVAILABLE);
		assert_true(took < BOUND_US + 1500 * MS);
	}
	/* writes while down are dropped (logged), never block or crash */
	idem_complete(s, &k, &responses[0], LONG_MS * MS);
	idem_keep_claimed(s, &k, LONG_MS * MS);
	idem_release(s, &k);

	/* a new server on the same port: the store comes back on its own (backoff <= 2 s) */
	assert_true(redis_start_on(&rp, rp.port, NULL));
	r = claim_when_up(base, s, &k, &g);
	assert_int_equal(r, IDEM_CLAIMED);     /* a fresh server: the old claim is gone */
	got_clear(&g);
	idem_store_release_all();
	event_base_free(base);
	redis_stop(&rp);
}

/* The server hangs (SIGSTOP): no reply ever comes, yet the claim answers UNAVAILABLE within
 * the command timeout; once it resumes, the store recovers. */
static void test_redis_hung(void **state)
{
	struct redis_proc rp;
	char url[256];
	NEED_REDIS(&rp, NULL);
	struct cfg_idempotency c = redis_cfg(url, sizeof url, "127.0.0.1", rp.port, 0, NULL, NULL);
	struct event_base *base = event_base_new();
	struct idem_store *s = idem_store_get(&c, base, NULL, NULL);
	struct idem_key k;
	struct got g = { 0 };
	enum idem_result r;

	idem_redis_set_timeout(BOUND_US);
	make_key(&k, "hung", 0);
	/* the first claim also connects and loads the scripts: on a busy machine that can
	 * outlast the short reply timeout set above, so it may take more than one try */
	assert_int_equal(claim_when_up(base, s, &k, &g), IDEM_CLAIMED);
	kill(rp.pid, SIGSTOP);
	int64_t took = timed_claim(base, s, &k, &g, &r);
	assert_int_equal(r, IDEM_UNAVAILABLE);
	assert_true(took >= BOUND_US - 50 * MS);
	assert_true(took < BOUND_US + 1500 * MS);
	/* still hung, after the store reconnected (the kernel accepts for the stopped process,
	 * and the handshake is never answered, so the backoff keeps growing: 50, 100, 200 ms):
	 * every claim waits out the timeout again, and no longer */
	for (int i = 0; i < 2; i++) {
		run_for(base, 450);
		took = timed_claim(base, s, &k, &g, &r);
		assert_int_equal(r, IDEM_UNAVAILABLE);
		assert_true(took >= BOUND_US - 50 * MS);
		assert_true(took < BOUND_US + 1500 * MS);
	}
	kill(rp.pid, SIGCONT);
	r = claim_when_up(base, s, &k, &g);
	assert_int_equal(r, IDEM_IN_PROGRESS);  /* the first claim survived the outage */
	got_clear(&g);
	idem_store_release_all();
	event_base_free(base);
	redis_stop(&rp);
}

/* A claim made late in a busy loop turn: the callback works BUSY_MS first (parsing, other
 * connections), so the loop's cached time, which libevent's timers count from, is that much
 * behind the clock by the time idem_claim runs. */
struct late_claim {
	struct idem_store *s;
	const struct idem_key *k;
	struct got *g;
	int64_t t0;             /* clock_now_us() just before idem_claim */
};
#define BUSY_MS 20

static void late_claim_cb(evutil_socket_t fd, short what, void *arg)
{
	struct late_claim *lc = arg;
	int64_t until = clock_now_us() + BUSY_MS * MS;
	while (clock_now_us() < until)
		;
	lc->t0 = clock_now_us();
	assert_non_null(idem_claim(lc->s, lc->k, LONG_MS * MS, got_cb, lc->g));
}

/* A stalled server (SIGSTOP) runs the claims it buffered once it resumes, after they were
 * answered UNAVAILABLE. The answer never comes before the claim's deadline, although
 * libevent's timer, counted from the loop's cached time, would fire early; and the deadline the
 * claim carries stops the server from taking the key even when it resumes right after the
 * answer. */
static void test_redis_stalled_claim_never_runs_after_its_answer(void **state)
{
	struct redis_proc rp;
	char url[256], name[48];
	NEED_REDIS(&rp, NULL);
	struct cfg_idempotency c = redis_cfg(url, sizeof url, "127.0.0.1", rp.port, 0, NULL, NULL);
	struct event_base *base = event_base_new();
	struct idem_store *s = idem_store_get(&c, base, NULL, NULL);
	struct idem_key k, probe;
	struct got g = { 0 };
	enum idem_result r;

	idem_redis_set_timeout(BOUND_US);
	make_key(&k, "stalled-warm", 0);
	/* connects and loads the scripts: may outlast the short timeout on a busy machine */
	assert_int_equal(claim_when_up(base, s, &k, &g), IDEM_CLAIMED);
	for (int round = 0; round < 3; round++) {
		snprintf(name, sizeof name, "stalled-%d", round);
		make_key(&k, name, 0);
		kill(rp.pid, SIGSTOP);
		got_clear(&g);
		struct late_claim lc = { .s = s, .k = &k, .g = &g };
		struct event *ev = evtimer_new(base, late_claim_cb, &lc);
		struct timeval now = { 0, 0 };
		evtimer_add(ev, &now);
		wait_done(base, &g);
		int64_t took = clock_now_us() - lc.t0;
		kill(rp.pid, SIGCONT);
		event_free(ev);
		assert_int_equal(g.r, IDEM_UNAVAILABLE);
		if (took < BOUND_US)
			fail_msg("round %d: UNAVAILABLE %lld us after the claim, before the %lld us "
			         "timeout", round, (long long)took, (long long)BOUND_US);
		/* the store reconnects (backoff); then the key is free: the late claim was refused */
		snprintf(name, sizeof name, "stalled-probe-%d", round);
		make_key(&probe, name, 0);
		assert_int_equal(claim_when_up(base, s, &probe, &g), IDEM_CLAIMED);
		r = claim_wait(base, s, &k, LONG_MS * MS, &g);
		if (r != IDEM_CLAIMED)
			fail_msg("round %d: the key answered %d after the outage: a ghost claim", round, r);
	}
	got_clear(&g);
	idem_store_release_all();
	event_base_free(base);
	redis_stop(&rp);
}

/* Nothing listens on the port from the start. */
static void test_redis_unreachable(void **state)
{
	char url[256];
	struct cfg_idempotency c = redis_cfg(url, sizeof url, "127.0.0.1", free_port(), 0, NULL,
	                                     NULL);
	struct event_base *base = event_base_new();
	struct idem_store *s = idem_store_get(&c, base, NULL, NULL);
	struct idem_key k;
	struct got g = { 0 };
	enum idem_result r;

	idem_redis_set_timeout(BOUND_US);
	make_key(&k, "unreachable", 0);
	for (int i = 0; i < 3; i++) {
		int64_t took = timed_claim(base, s, &k, &g, &r);
		assert_int_equal(r, IDEM_UNAVAILABLE);
		assert_true(took < BOUND_US + 1500 * MS);
		run_for(base, 30);
	}
	got_clear(&g);
	idem_store_release_all();
	event_base_free(base);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);   /* as the proxy does: a write to a dead server is an error */
	idem_redis_set_timeout(RELAXED_US);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fingerprint),
		cmocka_unit_test(test_scope),
		cmocka_unit_test(test_record_codec),
		cmocka_unit_test(test_record_old_format),
		cmocka_unit_test(test_judge_and_names),
		cmocka_unit_test(test_disposition),
		cmocka_unit_test(test_not_executed),
		cmocka_unit_test(test_job_settle),
		cmocka_unit_test(test_replay),
		cmocka_unit_test(test_memory_scenarios),
		cmocka_unit_test(test_memory_shared_across_bases),
		cmocka_unit_test(test_memory_cancel),
		cmocka_unit_test(test_memory_limit),
		cmocka_unit_test(test_memory_limit_trailers),
		cmocka_unit_test(test_memory_sweep),
		cmocka_unit_test(test_memory_threads),
		cmocka_unit_test_teardown(test_redis_unreachable, kill_servers),
		cmocka_unit_test_teardown(test_redis_scenarios, kill_servers),
		cmocka_unit_test_teardown(test_redis_layout_and_db, kill_servers),
		cmocka_unit_test_teardown(test_redis_old_record, kill_servers),
		cmocka_unit_test_teardown(test_redis_auth, kill_servers),
		cmocka_unit_test_teardown(test_redis_host_name, kill_servers),
		cmocka_unit_test_teardown(test_redis_cancel, kill_servers),
		cmocka_unit_test_teardown(test_redis_killed, kill_servers),
		cmocka_unit_test_teardown(test_redis_hung, kill_servers),
		cmocka_unit_test_teardown(test_redis_stalled_claim_never_runs_after_its_answer, kill_servers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
