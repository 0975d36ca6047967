/*
 * test_http: the HTTP/1.x parser (http.c) against SPEC §5 and §8.
 *
 * Every table row is raw bytes and the trace the parser must produce, where a trace is the
 * events in order: "H" a request head, "H200" a response head with its status, "B:xyz" the
 * decoded body bytes (consecutive BODY events merged), "D" a message end, "E400" an error
 * with the status to answer. Each row is run with the bytes fed whole, one byte at a time and
 * in random slices, with EOF after the last byte: all must give the same trace.
 *
 * Precedence when several refusals apply (SPEC §8: "400 comes before 414/431, and those
 * before 501/505"): 400 > 414 > 431 > 501 > 505. The SPEC orders 414 before 431 ("checked
 * before the head size"); we read "501/505" the same way, so an unknown method with
 * HTTP/2.0 is 501.
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

#include "http/h1_parser.h"
#include "http/h1_write.h"
#include "http/responder.h"

#define S(lit) lit, sizeof(lit) - 1
#define TRACE_MAX 4096

static const struct http_limits small_lim = { .max_header_bytes = 1024, .max_uri_bytes = 128 };
static const struct http_limits big_lim = { .max_header_bytes = 65536, .max_uri_bytes = 8192 };
/* a URI limit above the head limit (SPEC §2: the smaller governs) */
static const struct http_limits uri_above_lim = { .max_header_bytes = 1024, .max_uri_bytes = 8192 };
/* a big head with a small target limit */
static const struct http_limits wide_lim = { .max_header_bytes = 65536, .max_uri_bytes = 128 };

/* ---------------------------------------------------------------- the driver */

enum { SPLIT_WHOLE = 0, SPLIT_BYTE = 1, SPLIT_RANDOM = -1 };

struct run_opt {
	enum http_kind kind;
	const struct http_limits *lim;
	int split;                      /* SPLIT_* or a fixed slice size */
	unsigned seed;
	size_t body_max;                /* 0: unlimited */
	bool expect_head;               /* response: the request was HEAD */
	bool no_eof;
	bool take;                      /* slices go to http_msg_take() first when IN is empty,
	                                 * as a stream hands over what it read */
};

static void tr_add(char *tr, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tr_add(char *tr, const char *fmt, ...)
{
	size_t len = strlen(tr);
	va_list ap;
	if (len > 0 && len + 1 < TRACE_MAX)
		tr[len++] = ' ';
	va_start(ap, fmt);
	vsnprintf(tr + len, TRACE_MAX - len, fmt, ap);
	va_end(ap);
}

static void flush_body(struct evbuffer *out, char *tr)
{
	size_t n = evbuffer_get_length(out);
	char buf[2048];
	if (n == 0)
		return;
	assert_true(n < sizeof buf);
	evbuffer_remove(out, buf, n);
	buf[n] = 0;
	tr_add(tr, "B:%s", buf);
}

/* Invariants of any delivered head. */
static void check_head(const struct http_msg *m, enum http_kind kind)
{
	const struct http_head *h = http_msg_head(m);
	int i;
	assert_true(h->version == 10 || h->version == 11);
	assert_true(h->nhdrs >= 0 && h->nhdrs <= HTTP_MAX_HEADERS);
	assert_false(h->chunked && h->content_length >= 0);
	for (i = 0; i < h->nhdrs; i++) {
		const struct http_hdr *x = &h->hdrs[i];
		assert_true(x->nlen > 0);
		if (x->vlen > 0)
			assert_true(x->value[0] != ' ' && x->value[x->vlen - 1] != ' ' &&
			            x->value[x->vlen - 1] != '\t');
		if ((x->nlen == 14 && strncasecmp(x->name, "content-length", 14) == 0) ||
		    (x->nlen == 17 && strncasecmp(x->name, "transfer-encoding", 17) == 0) ||
		    (x->nlen == 10 && strncasecmp(x->name, "connection", 10) == 0))
			assert_true(x->hop);
	}
	if (kind == HTTP_REQUEST_KIND) {
		assert_true(h->method[0] != 0);
		assert_non_null(h->path);
		assert_true(h->path_len > 0);
		assert_true(h->path[0] == '/' || (h->path_len == 1 && h->path[0] == '*'));
		assert_false(h->body_until_close);
	} else {
		assert_true(h->status >= 100 && h->status <= 599);
	}
}

/* The detail of the last error seen by run(), for failure messages. */
static const char *last_detail;

static unsigned rnd(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (*s >> 16) & 0x7fff;
}

/* Feed IN[0,N) per O, and write the trace into TR. */
static void run(const char *in_bytes, size_t n, const struct run_opt *o, char *tr)
{
	struct http_msg *m = http_msg_new(o->kind, o->lim ? o->lim : &small_lim);
	struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
	size_t pos = 0, body_max = o->body_max ? o->body_max : SIZE_MAX;
	unsigned seed = o->seed;
	bool eofed = false;
	int steps;

	tr[0] = 0;
	http_msg_expect(m, o->expect_head);
	for (steps = 0; steps < 1000000; steps++) {
		enum http_event ev = http_msg_feed(m, in, out, body_max);
		if (ev == HTTP_NEED_MORE) {
			if (pos < n) {
				size_t k = n - pos;
				if (o->split == SPLIT_RANDOM)
					k = 1 + rnd(&seed) % 7;
				else if (o->split > 0)
					k = (size_t)o->split;
				if (k > n - pos)
					k = n - pos;
				size_t took = 0;
				if (o->take && evbuffer_get_length(in) == 0)
					took = http_msg_take(m, in_bytes + pos, k);
				assert_true(took <= k);
				evbuffer_add(in, in_bytes + pos + took, k - took);
				pos += k;
				continue;
			}
			if (o->no_eof || eofed)
				break;
			eofed = true;
			ev = http_msg_eof(m);
			if (ev == HTTP_NEED_MORE)
				break;
		}
		if (ev != HTTP_BODY)
			flush_body(out, tr);
		if (ev == HTTP_HEAD) {
			const struct http_head *h = http_msg_head(m);
			check_head(m, o->kind);
			if (o->kind == HTTP_REQUEST_KIND) {
				tr_add(tr, "H");
				continue;
			}
			tr_add(tr, "H%d", h->status);
			if (h->status == 101)
				break;                  /* the caller tunnels */
			if (h->status < 200)
				http_msg_next(m);
		} else if (ev == HTTP_BODY) {
			assert_true(evbuffer_get_length(out) > 0);
		} else if (ev == HTTP_DONE) {
			tr_add(tr, "D");
			http_msg_next(m);
			assert_int_equal(http_msg_head_bytes(m), 0);
		} else if (ev == HTTP_ERROR) {
			int st;
			const char *reason, *detail;
			http_msg_error(m, &st, &reason, &detail);
			assert_non_null(reason);
			assert_non_null(detail);
			last_detail = detail;
			tr_add(tr, "E%d", st);
			/* an error is final */
			assert_int_equal(http_msg_feed(m, in, out, body_max), HTTP_ERROR);
			break;
		}
		if (eofed && ev != HTTP_BODY)
			break;
	}
	flush_body(out, tr);
	assert_true(steps < 1000000);
	evbuffer_free(in);
	evbuffer_free(out);
	http_msg_free(m);
}

/* Run a row whole, byte by byte and in random slices, each through the evbuffer alone and
 * through http_msg_take() where it applies; all must give WANT. */
static void expect_trace(const char *why, const char *in_bytes, size_t n,
                         const struct run_opt *base, const char *want)
{
	static const int splits[] = { SPLIT_WHOLE, SPLIT_BYTE, SPLIT_RANDOM, SPLIT_RANDOM, 3 };
	char tr[TRACE_MAX];
	size_t i;
	for (i = 0; i < 2 * sizeof splits / sizeof splits[0]; i++) {
		struct run_opt o = *base;
		size_t k = i % (sizeof splits / sizeof splits[0]);
		last_detail = "";
		o.split = splits[k];
		o.seed = (unsigned)(k * 7919 + n);
		o.take = i >= sizeof splits / sizeof splits[0];
		run(in_bytes, n, &o, tr);
		if (strcmp(tr, want) != 0) {
			print_error("row \"%s\" (split %d%s): got \"%s\" (%s), want \"%s\"\n", why,
			            splits[k], o.take ? ", taken" : "", tr, last_detail, want);
			fail();
		}
	}
}

struct row {
	const char *why;
	const char *in;
	size_t n;
	const char *want;
};

static void run_rows(const struct row *rows, size_t nrows, const struct run_opt *o)
{
	size_t i;
	for (i = 0; i < nrows; i++)
		expect_trace(rows[i].why, rows[i].in, rows[i].n, o, rows[i].want);
}

/* ---------------------------------------------------------------- requests: refused (400) */

#define H "Host: a\r\n"

static const struct row bad_requests[] = {
	/* bare CR / bare LF (llhttp CVE-2022-32214/32215, CVE-2023-30589) */
	{ "bare LF ends the request line", S("GET / HTTP/1.1\nHost: a\r\n\r\n"), "E400" },
	{ "bare LF ends every line", S("GET / HTTP/1.1\nHost: a\n\n"), "E400" },
	{ "bare LF ends a header line", S("GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n"), "E400" },
	{ "bare LF ends the head", S("GET / HTTP/1.1\r\n" H "\n"), "E400" },
	{ "bare CR inside a header value", S("GET / HTTP/1.1\r\n" H "X: a\rb\r\n\r\n"), "E400" },
	{ "bare CR ends a header line", S("GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n"), "E400" },
	{ "bare CR in the request line", S("GET /\r HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "bare LF before the request line", S("\nGET / HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "bare CR before the request line", S("\rGET / HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "CR CR LF", S("GET / HTTP/1.1\r\r\n" H "\r\n"), "E400" },
	/* obs-fold (RFC 9112 §5.2), also hiding Transfer-Encoding */
	{ "obs-fold with SP", S("GET / HTTP/1.1\r\n" H "X: a\r\n b\r\n\r\n"), "E400" },
	{ "obs-fold with HTAB", S("GET / HTTP/1.1\r\n" H "X: a\r\n\tb\r\n\r\n"), "E400" },
	{ "obs-fold continues Transfer-Encoding",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: gzip,\r\n chunked\r\n\r\n0\r\n\r\n"), "E400" },
	{ "Transfer-Encoding value on the folded line",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n"), "E400" },
	{ "space before the first header line (CVE-2022-35256 style)",
	  S("GET / HTTP/1.1\r\n Host: a\r\n\r\n"), "E400" },
	{ "space before the first header hides Transfer-Encoding",
	  S("POST / HTTP/1.1\r\n Transfer-Encoding: chunked\r\n" H "Content-Length: 3\r\n\r\nabc"),
	  "E400" },
	/* header names */
	{ "space before the colon", S("GET / HTTP/1.1\r\nHost : a\r\n\r\n"), "E400" },
	{ "Transfer-Encoding : chunked",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n"), "E400" },
	{ "tab before the colon",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding\t: chunked\r\n\r\n0\r\n\r\n"), "E400" },
	{ "empty header name (HAProxy CVE-2023-25725)", S("GET / HTTP/1.1\r\n" H ": x\r\n\r\n"),
	  "E400" },
	{ "empty name then Content-Length",
	  S("POST / HTTP/1.1\r\n" H ":\r\nContent-Length: 3\r\n\r\nabc"), "E400" },
	{ "header line without colon", S("GET / HTTP/1.1\r\n" H "Foo\r\n\r\n"), "E400" },
	{ "separator in a header name", S("GET / HTTP/1.1\r\n" H "X(y): z\r\n\r\n"), "E400" },
	{ "NUL in a header name", S("GET / HTTP/1.1\r\n" H "X\0Y: z\r\n\r\n"), "E400" },
	{ "NUL in a header value", S("GET / HTTP/1.1\r\n" H "X: a\0b\r\n\r\n"), "E400" },
	{ "control byte in a header value", S("GET / HTTP/1.1\r\n" H "X: a\x01" "b\r\n\r\n"),
	  "E400" },
	{ "DEL in a header value", S("GET / HTTP/1.1\r\n" H "X: a\x7f" "b\r\n\r\n"), "E400" },
	{ "vertical tab before chunked",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: \x0b" "chunked\r\n\r\n0\r\n\r\n"), "E400" },
	{ "HTAB after chunked: llhttp reads no chunked there, so the framing is ambiguous",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\t\r\n\r\n0\r\n\r\n"), "E400" },
	{ "form feed after chunked",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\x0c\r\n\r\n0\r\n\r\n"), "E400" },
	/* request line */
	{ "separator in the method", S("G(T / HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "tab after the method", S("GET\t/ HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "two spaces after the method", S("GET  / HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "two spaces before the version", S("GET /  HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "space after the version", S("GET / HTTP/1.1 \r\n" H "\r\n"), "E400" },
	{ "empty method", S(" / HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "method alone", S("GET\r\n" H "\r\n"), "E400" },
	{ "no version (HTTP/0.9 request line)", S("GET /\r\n" H "\r\n"), "E400" },
	{ "lower-case protocol name", S("GET / http/1.1\r\n" H "\r\n"), "E400" },
	{ "version without minor", S("GET / HTTP/1\r\n" H "\r\n"), "E400" },
	{ "two-digit minor", S("GET / HTTP/1.10\r\n" H "\r\n"), "E400" },
	{ "two-digit major", S("GET / HTTP/11.1\r\n" H "\r\n"), "E400" },
	{ "unknown version followed by garbage", S("GET / HTTP/1.2x\r\n" H "\r\n"), "E400" },
	{ "unknown version followed by a space", S("GET / HTTP/3.0 \r\n" H "\r\n"), "E400" },
	{ "HTTPS/1.1", S("GET / HTTPS/1.1\r\n" H "\r\n"), "E400" },
	{ "empty request line", S("\r\n\r\n\r\n \r\n"), "E400" },
	/* request target */
	{ "fragment in the target", S("GET /a#b HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "lone # target", S("GET # HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "non-ASCII byte in the target", S("GET /caf\xc3\xa9 HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "control byte in the target", S("GET /a\x01 HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "DEL in the target", S("GET /a\x7f HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "NUL in the target", S("GET /a\0b HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "tab in the target", S("GET /a\tb HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "* target with GET", S("GET * HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "* target with POST", S("POST * HTTP/1.1\r\n" H "Content-Length: 0\r\n\r\n"), "E400" },
	{ "relative target", S("GET foo HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "authority-form target with GET", S("GET a:80 HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "absolute-form with another scheme", S("GET ftp://a/ HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "absolute-form without authority", S("GET http:///x HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "absolute-form with userinfo", S("GET http://u@a/ HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "absolute-form authority differs from Host",
	  S("GET http://b/ HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "absolute-form port differs from Host's",
	  S("GET http://a:8080/ HTTP/1.1\r\nHost: a:8081\r\n\r\n"), "E400" },
	{ "absolute-form explicit port vs Host without port (not the default)",
	  S("GET http://a:8080/ HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "https default port is 443, not 80",
	  S("GET https://a:80/ HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "absolute-form with a Host on HTTP/1.0 that differs",
	  S("GET http://b/ HTTP/1.0\r\n" H "\r\n"), "E400" },
	/* Host */
	{ "missing Host on HTTP/1.1", S("GET / HTTP/1.1\r\nX: y\r\n\r\n"), "E400" },
	/* RFC 9112 §3.2: empty only for a target without authority, which we never route */
	{ "empty Host", S("GET / HTTP/1.1\r\nHost:\r\n\r\n"), "E400" },
	{ "Host of blanks only", S("GET / HTTP/1.1\r\nHost:  \t \r\n\r\n"), "E400" },
	{ "empty Host on HTTP/1.0", S("GET / HTTP/1.0\r\nHost:\r\n\r\n"), "E400" },
	{ "two identical Hosts", S("GET / HTTP/1.1\r\n" H H "\r\n"), "E400" },
	{ "two different Hosts", S("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), "E400" },
	{ "two Hosts on HTTP/1.0", S("GET / HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n"), "E400" },
	{ "Host with a space inside", S("GET / HTTP/1.1\r\nHost: a b\r\n\r\n"), "E400" },
	{ "Host with userinfo", S("GET / HTTP/1.1\r\nHost: u@a\r\n\r\n"), "E400" },
	{ "Host with a path", S("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n"), "E400" },
	{ "Host with a non-numeric port", S("GET / HTTP/1.1\r\nHost: a:b\r\n\r\n"), "E400" },
	{ "Host with an empty name", S("GET / HTTP/1.1\r\nHost: :80\r\n\r\n"), "E400" },
	{ "Host with an unclosed IPv6 literal", S("GET / HTTP/1.1\r\nHost: [::1\r\n\r\n"), "E400" },
	{ "Host list", S("GET / HTTP/1.1\r\nHost: a, b\r\n\r\n"), "E400" },
	{ "Host with a cut percent-encoding", S("GET / HTTP/1.1\r\nHost: a%4\r\n\r\n"), "E400" },
	{ "Host with a bad percent-encoding", S("GET / HTTP/1.1\r\nHost: a%4g\r\n\r\n"), "E400" },
	{ "Host with a six-digit port", S("GET / HTTP/1.1\r\nHost: a:123456\r\n\r\n"), "E400" },
	{ "Host IPv6 literal with a bad byte", S("GET / HTTP/1.1\r\nHost: [::g]\r\n\r\n"), "E400" },
	{ "Host empty IPv6 literal", S("GET / HTTP/1.1\r\nHost: []\r\n\r\n"), "E400" },
	{ "Host IPv6 literal followed by junk", S("GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n"),
	  "E400" },
	{ "absolute-form IPv6 differs from Host's port",
	  S("GET http://[::1]:8080/ HTTP/1.1\r\nHost: [::1]\r\n\r\n"), "E400" },
	/* Content-Length */
	{ "repeated identical Content-Length",
	  S("POST / HTTP/1.1\r\n" H "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc"), "E400" },
	{ "differing Content-Lengths",
	  S("POST / HTTP/1.1\r\n" H "Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"), "E400" },
	{ "Content-Length list", S("POST / HTTP/1.1\r\n" H "Content-Length: 3, 3\r\n\r\nabc"),
	  "E400" },
	{ "negative Content-Length", S("POST / HTTP/1.1\r\n" H "Content-Length: -1\r\n\r\n"),
	  "E400" },
	{ "signed Content-Length", S("POST / HTTP/1.1\r\n" H "Content-Length: +3\r\n\r\nabc"),
	  "E400" },
	{ "hex Content-Length", S("POST / HTTP/1.1\r\n" H "Content-Length: 0x3\r\n\r\nabc"),
	  "E400" },
	{ "HTAB after Content-Length (llhttp is stricter than RFC 9110 here)",
	  S("POST / HTTP/1.1\r\n" H "Content-Length: 5\t\r\n\r\nhello"), "E400" },
	{ "empty Content-Length", S("POST / HTTP/1.1\r\n" H "Content-Length:\r\n\r\n"), "E400" },
	{ "Content-Length with inner space",
	  S("POST / HTTP/1.1\r\n" H "Content-Length: 1 0\r\n\r\n0123456789"), "E400" },
	{ "Content-Length overflow",
	  S("POST / HTTP/1.1\r\n" H "Content-Length: 99999999999999999999\r\n\r\n"), "E400" },
	{ "Content-Length just over INT64_MAX",
	  S("POST / HTTP/1.1\r\n" H "Content-Length: 9223372036854775808\r\n\r\n"), "E400" },
	/* CL.TE, TE.CL, TE.TE */
	{ "CL.TE", S("POST / HTTP/1.1\r\n" H "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n"
	             "\r\n0\r\n\r\nG"), "E400" },
	{ "TE.CL", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n"
	             "\r\n8\r\nSMUGGLED\r\n0\r\n\r\n"), "E400" },
	{ "empty Transfer-Encoding with Content-Length",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding:\r\nContent-Length: 3\r\n\r\nabc"), "E400" },
	{ "Content-Length then an empty Transfer-Encoding",
	  S("POST / HTTP/1.1\r\n" H "Content-Length: 3\r\nTransfer-Encoding:\r\n\r\nabc"), "E400" },
	{ "Transfer-Encoding identity with Content-Length",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc"),
	  "E400" },
	{ "TE.TE: xchunked", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: xchunked\r\n\r\n"
	                       "0\r\n\r\n"), "E400" },
	{ "TE.TE: chunkedx", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunkedx\r\n\r\n"
	                       "0\r\n\r\n"), "E400" },
	{ "TE.TE: chunked ,", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked ,\r\n\r\n"
	                        "0\r\n\r\n"), "E400" },
	{ "TE.TE: , chunked", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: , chunked\r\n\r\n"
	                        "0\r\n\r\n"), "E400" },
	{ "TE.TE: gzip,,chunked", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: gzip,,chunked\r\n"
	                            "\r\n0\r\n\r\n"), "E400" },
	{ "TE.TE: quoted chunked", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: \"chunked\"\r\n"
	                             "\r\n0\r\n\r\n"), "E400" },
	{ "TE.TE: chunked with a parameter",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked;q=1\r\n\r\n0\r\n\r\n"), "E400" },
	{ "TE.TE: chunked twice in one line",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n"), "E400" },
	{ "TE.TE: chunked on two lines", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n"
	                                   "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), "E400" },
	{ "TE.TE: chunked then a line with another coding",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n"
	    "0\r\n\r\n"), "E400" },
	{ "Transfer-Encoding not ending in chunked", S("POST / HTTP/1.1\r\n" H
	                                               "Transfer-Encoding: gzip\r\n\r\nabc"), "E400" },
	{ "chunked before another coding", S("POST / HTTP/1.1\r\n" H
	                                     "Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n"),
	  "E400" },
	{ "empty Transfer-Encoding", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding:\r\n\r\n"), "E400" },
	{ "Transfer-Encoding of spaces", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding:   \r\n\r\n"),
	  "E400" },
	{ "Transfer-Encoding on HTTP/1.0", S("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"
	                                     "0\r\n\r\n"), "E400" },
	{ "Transfer_Encoding with an underscore",
	  S("POST / HTTP/1.1\r\n" H "Transfer_Encoding: chunked\r\n\r\n0\r\n\r\n"), "E400" },
	{ "Content_Length with an underscore",
	  S("POST / HTTP/1.1\r\n" H "Content_Length: 3\r\n\r\nabc"), "E400" },
	{ "CONTENT_LENGTH in capitals", S("POST / HTTP/1.1\r\n" H "CONTENT_LENGTH: 3\r\n\r\nabc"),
	  "E400" },
	{ "malformed coding parameter", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: gzip;, chunked"
	                                  "\r\n\r\n0\r\n\r\n"), "E400" },
	{ "coding parameter without value", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: gzip;q, "
	                                      "chunked\r\n\r\n0\r\n\r\n"), "E400" },
	{ "coding parameter with an empty value", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: "
	                                            "gzip;q=, chunked\r\n\r\n0\r\n\r\n"), "E400" },
	{ "coding parameter with an open quote", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: "
	                                           "gzip;q=\"x, chunked\r\n\r\n0\r\n\r\n"), "E400" },
	{ "coding followed by junk", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: gzip x, chunked"
	                               "\r\n\r\n0\r\n\r\n"), "E400" },
	/* incomplete */
	{ "head cut by EOF", S("GET / HTTP/1.1\r\nHost: a\r\n"), "E400" },
	{ "request line cut by EOF", S("GET / HT"), "E400" },
	{ "method cut by EOF", S("GE"), "E400" },
};

static void test_bad_requests(void **state)
{
	struct run_opt o = { .kind = HTTP_REQUEST_KIND };
	run_rows(bad_requests, sizeof bad_requests / sizeof bad_requests[0], &o);
}

/* ---------------------------------------------------------------- requests: bodies refused */

static const struct row bad_bodies[] = {
	{ "chunk size with a trailing space",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n"),
	  "H E400" },
	{ "chunk size ended by bare LF",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n"),
	  "H E400" },
	{ "chunk data longer than its size",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n5\r\nhelloX\r\n0\r\n\r\n"),
	  "H B:hello E400" },
	{ "chunk data ended by bare LF",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n"),
	  "H B:hello E400" },
	{ "0x prefix", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n"
	                 "0\r\n\r\n"), "H E400" },
	{ "negative chunk size", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
	                           "-5\r\nhello\r\n0\r\n\r\n"), "H E400" },
	{ "chunk size overflow", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
	                           "10000000000000000\r\n"), "H E400" },
	{ "empty chunk size", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
	                        "\r\nhello\r\n0\r\n\r\n"), "H E400" },
	{ "control byte in a chunk extension",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n5;a\x01\r\nhello\r\n0\r\n\r\n"),
	  "H E400" },
	{ "bare CR in a chunk extension",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n5;a\rb\r\nhello\r\n0\r\n\r\n"),
	  "H E400" },
	{ "bare LF after a chunk extension",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n5;a=b\nhello\r\n0\r\n\r\n"),
	  "H E400" },
	{ "obs-fold in a trailer",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n0\r\nA: b\r\n c\r\n\r\n"),
	  "H E400" },
	{ "bare LF in the trailers",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n0\r\nA: b\n\r\n"), "H E400" },
	{ "space before a trailer's colon",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n0\r\nA : b\r\n\r\n"),
	  "H E400" },
	{ "chunked body cut by EOF",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n5\r\nhel"), "H B:hel E400" },
	{ "chunked body without its last chunk",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"),
	  "H B:hello E400" },
	{ "trailers cut by EOF",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n0\r\nA: b\r\n"), "H E400" },
	{ "Content-Length body cut by EOF",
	  S("POST / HTTP/1.1\r\n" H "Content-Length: 5\r\n\r\nhel"), "H B:hel E400" },
};

static void test_bad_bodies(void **state)
{
	struct run_opt o = { .kind = HTTP_REQUEST_KIND };
	run_rows(bad_bodies, sizeof bad_bodies / sizeof bad_bodies[0], &o);
}

/* ---------------------------------------------------------------- requests: 501, 505 */

static const struct row refused_requests[] = {
	{ "CONNECT", S("CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n"), "E501" },
	{ "unknown method", S("FOO / HTTP/1.1\r\n" H "\r\n"), "E501" },
	{ "methods are case-sensitive", S("get / HTTP/1.1\r\n" H "\r\n"), "E501" },
	{ "a method llhttp knows but we don't serve", S("PURGE / HTTP/1.1\r\n" H "\r\n"), "E501" },
	{ "SEARCH is not in RFC 9110 nor RFC 4918", S("SEARCH / HTTP/1.1\r\n" H "\r\n"), "E501" },
	{ "QUERY", S("QUERY / HTTP/1.1\r\n" H "Content-Length: 0\r\n\r\n"), "E501" },
	{ "an RTSP method", S("DESCRIBE / HTTP/1.1\r\n" H "\r\n"), "E501" },
	{ "a long method token", S("ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFGHIJKLMNOP / HTTP/1.1\r\n" H
	                          "\r\n"), "E501" },
	{ "unknown method with a body", S("FOO / HTTP/1.1\r\n" H "Content-Length: 3\r\n\r\nabc"),
	  "E501" },
	{ "a coding before the final chunked",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"), "E501" },
	{ "a coding before chunked on two lines",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "0\r\n\r\n"), "E501" },
	{ "a coding with parameters before chunked",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: foo;a=\"b c\" ; d=e, chunked\r\n\r\n"
	    "0\r\n\r\n"), "E501" },
	{ "HTTP/2.0", S("GET / HTTP/2.0\r\n" H "\r\n"), "E505" },
	{ "HTTP/1.2", S("GET / HTTP/1.2\r\n" H "\r\n"), "E505" },
	{ "HTTP/0.9", S("GET / HTTP/0.9\r\n" H "\r\n"), "E505" },
	{ "HTTP/3.0", S("GET / HTTP/3.0\r\n" H "\r\n"), "E505" },
	{ "HTTP/9.9", S("GET / HTTP/9.9\r\n" H "\r\n"), "E505" },
	{ "Host is required on HTTP/1.1 only: not on HTTP/1.2", S("GET / HTTP/1.2\r\n\r\n"),
	  "E505" },
	/* precedence */
	{ "400 over 501: unknown method and a bad header",
	  S("FOO / HTTP/1.1\r\n" H "Bad Header: x\r\n\r\n"), "E400" },
	{ "400 over 501: unknown method and no Host", S("FOO / HTTP/1.1\r\n\r\n"), "E400" },
	{ "400 over 501: unknown method and a * target", S("FOO * HTTP/1.1\r\n" H "\r\n"), "E400" },
	{ "400 over 501: the HTTP/2 preface (PRI * is not OPTIONS)",
	  S("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), "E400" },
	{ "400 over 501: CONNECT with obs-fold",
	  S("CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\nX: y\r\n z\r\n\r\n"), "E400" },
	{ "400 over 501: gzip, chunked with Content-Length",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: gzip, chunked\r\nContent-Length: 1\r\n\r\n"),
	  "E400" },
	{ "400 over 505: HTTP/1.2 and a bare LF", S("GET / HTTP/1.2\r\nHost: a\n\r\n"), "E400" },
	{ "400 over 505: HTTP/2.0 and CL+TE",
	  S("POST / HTTP/2.0\r\n" H "Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"),
	  "E400" },
	{ "400 over 505: HTTP/1.2 and a fragment", S("GET /#x HTTP/1.2\r\n" H "\r\n"), "E400" },
	{ "400 over 505: HTTP/1.2 and two Hosts", S("GET / HTTP/1.2\r\n" H H "\r\n"), "E400" },
	{ "501 over 505: unknown method and HTTP/2.0", S("FOO / HTTP/2.0\r\n" H "\r\n"), "E501" },
	{ "501 over 505: unknown method and HTTP/1.2", S("FOO / HTTP/1.2\r\n" H "\r\n"), "E501" },
	{ "501 over 505: gzip, chunked and HTTP/1.2",
	  S("POST / HTTP/1.2\r\n" H "Transfer-Encoding: gzip, chunked\r\n\r\n"), "E501" },
};

static void test_refused_requests(void **state)
{
	struct run_opt o = { .kind = HTTP_REQUEST_KIND };
	run_rows(refused_requests, sizeof refused_requests / sizeof refused_requests[0], &o);
}

/* ---------------------------------------------------------------- requests: accepted */

static const struct row good_requests[] = {
	{ "GET", S("GET / HTTP/1.1\r\n" H "\r\n"), "H D" },
	{ "HTTP/1.0 needs no Host", S("GET / HTTP/1.0\r\n\r\n"), "H D" },
	{ "Host with port and IPv6 literal", S("GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n"), "H D" },
	{ "Host with percent-encoding and sub-delims",
	  S("GET / HTTP/1.1\r\nHost: a%41b!$&'()*+,;=-._~\r\n\r\n"), "H D" },
	{ "absolute-form IPv6 matching Host",
	  S("GET http://[::1]:8080/x HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n"), "H D" },
	{ "absolute-form with an empty port is the default port",
	  S("GET http://a:/x HTTP/1.1\r\n" H "\r\n"), "H D" },
	{ "Content-Length body", S("POST / HTTP/1.1\r\n" H "Content-Length: 5\r\n\r\nhello"),
	  "H B:hello D" },
	{ "Content-Length 0", S("POST / HTTP/1.1\r\n" H "Content-Length: 0\r\n\r\n"), "H D" },
	{ "Content-Length with OWS", S("POST / HTTP/1.1\r\n" H "Content-Length: \t5  \r\n\r\nhello"),
	  "H B:hello D" },
	{ "Content-Length with leading zeros", S("POST / HTTP/1.1\r\n" H "Content-Length: 005\r\n\r\n"
	                                         "hello"), "H B:hello D" },
	{ "chunked", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
	               "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"), "H B:hello world D" },
	{ "chunked: extensions and trailers are dropped",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
	    "5;a=b;c=\"d e\"\r\nhello\r\nA;x\r\n0123456789\r\n0;last=1\r\nX-T: 1\r\nY: 2\r\n\r\n"),
	  "H B:hello0123456789 D" },
	{ "chunk sizes in upper and lower case hex",
	  S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
	    "a\r\n0123456789\r\nA\r\nabcdefghij\r\n0\r\n\r\n"), "H B:0123456789abcdefghij D" },
	{ "chunk size with leading zeros", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n"
	                                     "\r\n0005\r\nhello\r\n0000\r\n\r\n"), "H B:hello D" },
	{ "empty chunked body", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
	                          "0\r\n\r\n"), "H D" },
	{ "chunked in capitals", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding: CHUNKED\r\n\r\n"
	                           "1\r\nx\r\n0\r\n\r\n"), "H B:x D" },
	{ "OWS around list elements (and gzip before chunked: 501)", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding:\t gzip\t, "
	                                  "chunked  \r\n\r\n1\r\nx\r\n0\r\n\r\n"), "E501" },
	{ "Transfer-Encoding with leading HTAB", S("POST / HTTP/1.1\r\n" H "Transfer-Encoding:\t"
	                                           "chunked \r\n\r\n1\r\nx\r\n0\r\n\r\n"),
	  "H B:x D" },
	{ "transfer-encoding in lower case", S("POST / HTTP/1.1\r\n" H "transfer-encoding: chunked\r\n"
	                                       "\r\n1\r\nx\r\n0\r\n\r\n"), "H B:x D" },
	{ "OPTIONS *", S("OPTIONS * HTTP/1.1\r\n" H "\r\n"), "H D" },
	{ "absolute-form matching Host",
	  S("GET http://a/x?y HTTP/1.1\r\n" H "\r\n"), "H D" },
	{ "absolute-form matches case-insensitively",
	  S("GET HTTP://EXAMPLE.com/ HTTP/1.1\r\nHost: example.COM\r\n\r\n"), "H D" },
	{ "absolute-form with http's default port equals a Host without port",
	  S("GET http://a:80/ HTTP/1.1\r\n" H "\r\n"), "H D" },
	{ "a Host with http's default port equals absolute-form without port",
	  S("GET http://a/ HTTP/1.1\r\nHost: a:80\r\n\r\n"), "H D" },
	{ "absolute-form with https's default port",
	  S("GET https://a:443/ HTTP/1.1\r\n" H "\r\n"), "H D" },
	{ "absolute-form with the same explicit port",
	  S("GET http://a:8080/ HTTP/1.1\r\nHost: a:8080\r\n\r\n"), "H D" },
	{ "absolute-form on HTTP/1.0 without Host", S("GET http://a/ HTTP/1.0\r\n\r\n"), "H D" },
	{ "empty lines before the request line", S("\r\n\r\nGET / HTTP/1.1\r\n" H "\r\n"), "H D" },
	{ "underscore in another header name", S("GET / HTTP/1.1\r\n" H "X_Custom: y\r\n\r\n"),
	  "H D" },
	{ "obs-text in a header value", S("GET / HTTP/1.1\r\n" H "X: caf\xc3\xa9\r\n\r\n"), "H D" },
	{ "empty header value", S("GET / HTTP/1.1\r\n" H "X:\r\n\r\n"), "H D" },
	{ "HTAB inside a header value", S("GET / HTTP/1.1\r\n" H "X: a\tb\r\n\r\n"), "H D" },
	{ "every allowed method",
	  S("GET / HTTP/1.1\r\n" H "\r\nHEAD / HTTP/1.1\r\n" H "\r\nPOST / HTTP/1.1\r\n" H
	    "Content-Length: 0\r\n\r\nPUT / HTTP/1.1\r\n" H "Content-Length: 1\r\n\r\nx"
	    "DELETE / HTTP/1.1\r\n" H "\r\nOPTIONS / HTTP/1.1\r\n" H "\r\nTRACE / HTTP/1.1\r\n" H
	    "\r\nPATCH / HTTP/1.1\r\n" H "Content-Length: 1\r\n\r\ny" "PROPFIND / HTTP/1.1\r\n" H
	    "\r\nPROPPATCH / HTTP/1.1\r\n" H "\r\nMKCOL /d HTTP/1.1\r\n" H "\r\nCOPY / HTTP/1.1\r\n" H
	    "\r\nMOVE / HTTP/1.1\r\n" H "\r\nLOCK / HTTP/1.1\r\n" H "\r\nUNLOCK / HTTP/1.1\r\n" H
	    "\r\n"),
	  "H D H D H D H B:x D H D H D H D H B:y D H D H D H D H D H D H D H D" },
	{ "pipelined requests, each in order",
	  S("GET /a HTTP/1.1\r\n" H "\r\n"
	    "POST /b HTTP/1.1\r\n" H "Content-Length: 5\r\n\r\nhello"
	    "POST /c HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n3\r\nxyz\r\n0\r\n\r\n"
	    "GET /d HTTP/1.0\r\n\r\n"),
	  "H D H B:hello D H B:xyz D H D" },
	{ "a CRLF after a body before the next request",
	  S("POST / HTTP/1.1\r\n" H "Content-Length: 2\r\n\r\nok\r\nGET / HTTP/1.1\r\n" H "\r\n"),
	  "H B:ok D H D" },
	{ "a pipelined request after an error is not reached",
	  S("GET / HTTP/1.1\r\n" H "\r\nGET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n" H "\r\n"),
	  "H D E400" },
	{ "EOF between messages is not an error", S("GET / HTTP/1.1\r\n" H "\r\n\r\n"), "H D" },
};

static void test_good_requests(void **state)
{
	struct run_opt o = { .kind = HTTP_REQUEST_KIND };
	run_rows(good_requests, sizeof good_requests / sizeof good_requests[0], &o);
}

/* ---------------------------------------------------------------- responses */

static const struct row responses[] = {
	{ "Content-Length", S("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"), "H200 B:hello D" },
	{ "chunked", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	               "5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n"), "H200 B:hello D" },
	{ "no reason phrase", S("HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n"), "H200 D" },
	{ "empty reason phrase", S("HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n"), "H200 D" },
	{ "obs-text in the reason phrase", S("HTTP/1.1 200 \xc3\xa7" "a va\r\nContent-Length: 0\r\n\r\n"),
	  "H200 D" },
	{ "100 then 200", S("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
	                    "\r\nok"), "H100 H200 B:ok D" },
	{ "103 twice then 200", S("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
	                          "HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\n"
	                          "Content-Length: 0\r\n\r\n"), "H103 H103 H200 D" },
	{ "101 stops the parser", S("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
	                            "Connection: upgrade\r\n\r\n\x81\x05hello"), "H101" },
	{ "204 without body", S("HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n"
	                        "Content-Length: 0\r\n\r\n"), "H204 D H200 D" },
	{ "204 with Content-Length 0", S("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"),
	  "H204 D" },
	{ "304 with the Content-Length of the 200 has no body (RFC 9110 §8.6)",
	  S("HTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\n\r\nHTTP/1.1 200 OK\r\n"
	    "Content-Length: 0\r\n\r\n"), "H304 D H200 D" },
	{ "read until close", S("HTTP/1.1 200 OK\r\n\r\nuntil the end"), "H200 B:until the end D" },
	{ "HTTP/1.0 read until close", S("HTTP/1.0 200 OK\r\n\r\nabc"), "H200 B:abc D" },
	{ "Content-Length 0 then a pipelined response",
	  S("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nHTTP/1.1 404 Not Found\r\n"
	    "Content-Length: 1\r\n\r\nx"), "H200 D H404 B:x D" },
	{ "repeated identical Content-Length", S("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n"
	                                         "Content-Length: 1\r\n\r\nx"), "E502" },
	{ "differing Content-Lengths", S("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n"
	                                 "Content-Length: 2\r\n\r\nxx"), "E502" },
	{ "CL and TE", S("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
	                 "0\r\n\r\n"), "E502" },
	{ "TE not ending in chunked", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc"),
	  "E502" },
	{ "a coding before chunked", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
	                               "0\r\n\r\n"), "E502" },
	{ "chunked twice", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
	                     "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), "E502" },
	{ "Transfer_Encoding", S("HTTP/1.1 200 OK\r\nTransfer_Encoding: chunked\r\n\r\n0\r\n\r\n"),
	  "E502" },
	{ "204 with a Content-Length", S("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello"),
	  "E502" },
	{ "204 with Transfer-Encoding", S("HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n"
	                                  "\r\n0\r\n\r\n"), "E502" },
	{ "304 with Transfer-Encoding", S("HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n"
	                                  "\r\n0\r\n\r\n"), "E502" },
	{ "status line without version", S("200 OK\r\n\r\n"), "E502" },
	{ "lower-case protocol", S("http/1.1 200 OK\r\n\r\n"), "E502" },
	{ "HTTP/2.0", S("HTTP/2.0 200 OK\r\n\r\n"), "E502" },
	{ "HTTP/1.2", S("HTTP/1.2 200 OK\r\n\r\n"), "E502" },
	{ "HTTP/0.9", S("HTTP/0.9 200 OK\r\n\r\n"), "E502" },
	{ "two-digit status", S("HTTP/1.1 99 OK\r\n\r\n"), "E502" },
	{ "four-digit status", S("HTTP/1.1 2000 OK\r\n\r\n"), "E502" },
	{ "status 600", S("HTTP/1.1 600 OK\r\n\r\n"), "E502" },
	{ "status 099", S("HTTP/1.1 099 OK\r\n\r\n"), "E502" },
	{ "two spaces before the status", S("HTTP/1.1  200 OK\r\n\r\n"), "E502" },
	{ "control byte in the reason", S("HTTP/1.1 200 O\x01K\r\nContent-Length: 0\r\n\r\n"),
	  "E502" },
	{ "bare LF ending the status line", S("HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n"), "E502" },
	{ "bare LF in a header line", S("HTTP/1.1 200 OK\r\nA: b\nContent-Length: 0\r\n\r\n"),
	  "E502" },
	{ "bare CR in a header value", S("HTTP/1.1 200 OK\r\nA: b\rc\r\n\r\n"), "E502" },
	{ "NUL in a header value", S("HTTP/1.1 200 OK\r\nA: b\0c\r\nContent-Length: 0\r\n\r\n"),
	  "E502" },
	{ "obs-fold", S("HTTP/1.1 200 OK\r\nA: b\r\n c\r\nContent-Length: 0\r\n\r\n"), "E502" },
	{ "empty header name", S("HTTP/1.1 200 OK\r\n: b\r\nContent-Length: 0\r\n\r\n"), "E502" },
	{ "Content-Length body cut by EOF", S("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel"),
	  "H200 B:hel E502" },
	{ "chunked body cut by EOF", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	                               "5\r\nhello\r\n"), "H200 B:hello E502" },
	{ "bad chunk size", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
	  "H200 E502" },
	{ "head cut by EOF", S("HTTP/1.1 200 OK\r\nContent-"), "E502" },
	{ "nothing at all is not an error", S(""), "" },
	{ "101 header lines", S("HTTP/1.1 200 OK\r\n"
	                        "A:0\r\nA:1\r\nA:2\r\nA:3\r\nA:4\r\nA:5\r\nA:6\r\nA:7\r\nA:8\r\nA:9\r\n"
	                        "A:0\r\nA:1\r\nA:2\r\nA:3\r\nA:4\r\nA:5\r\nA:6\r\nA:7\r\nA:8\r\nA:9\r\n"
	                        "A:0\r\nA:1\r\nA:2\r\nA:3\r\nA:4\r\nA:5\r\nA:6\r\nA:7\r\nA:8\r\nA:9\r\n"
	                        "A:0\r\nA:1\r\nA:2\r\nA:3\r\nA:4\r\nA:5\r\nA:6\r\nA:7\r\nA:8\r\nA:9\r\n"
	                        "A:0\r\nA:1\r\nA:2\r\nA:3\r\nA:4\r\nA:5\r\nA:6\r\nA:7\r\nA:8\r\nA:9\r\n"
	                        "A:0\r\nA:1\r\nA:2\r\nA:3\r\nA:4\r\nA:5\r\nA:6\r\nA:7\r\nA:8\r\nA:9\r\n"
	                        "A:0\r\nA:1\r\nA:2\r\nA:3\r\nA:4\r\nA:5\r\nA:6\r\nA:7\r\nA:8\r\nA:9\r\n"
	                        "A:0\r\nA:1\r\nA:2\r\nA:3\r\nA:4\r\nA:5\r\nA:6\r\nA:7\r\nA:8\r\nA:9\r\n"
	                        "A:0\r\nA:1\r\nA:2\r\nA:3\r\nA:4\r\nA:5\r\nA:6\r\nA:7\r\nA:8\r\nA:9\r\n"
	                        "A:0\r\nA:1\r\nA:2\r\nA:3\r\nA:4\r\nA:5\r\nA:6\r\nA:7\r\nA:8\r\nA:9\r\n"
	                        "A:x\r\n\r\n"), "E502" },
	{ "head over max_header_bytes",
	  S("HTTP/1.1 200 OK\r\nX: 0123456789012345678901234567890123456789012345678901234567890123"
	    "4567890123456789012345678901234567890123456789012345678901234567890123456789012345678901"
	    "2345678901234567890123456789012345678901234567890123456789012345678901234567890123456789"
	    "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567"
	    "8901234567890123456789012345678901234567890123456789012345678901234567890123456789012345"
	    "6789012345678901234567890123456789012345678901234567890123456789012345678901234567890123"
	    "4567890123456789012345678901234567890123456789012345678901234567890123456789012345678901"
	    "2345678901234567890123456789012345678901234567890123456789012345678901234567890123456789"
	    "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567"
	    "8901234567890123456789012345678901234567890123456789012345678901234567890123456789012345"
	    "6789012345678901234567890123456789012345678901234567890123456789012345678901234567890123"
	    "4567890123456789012345678901234567890123456789012345678901234567890123456789012345678901"
	    "\r\n\r\n"), "E502" },
};

static void test_responses(void **state)
{
	struct run_opt o = { .kind = HTTP_RESPONSE_KIND };
	run_rows(responses, sizeof responses / sizeof responses[0], &o);
}

static const struct row head_responses[] = {
	{ "HEAD: Content-Length and no body, then the next response",
	  S("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n"),
	  "H200 D H200 D" },
	{ "HEAD: chunked and no body", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
	  "H200 D" },
	{ "HEAD: no length does not mean until close", S("HTTP/1.1 200 OK\r\n\r\n"), "H200 D" },
	{ "HEAD: 100 then 200, still without body (expect is sticky)",
	  S("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"),
	  "H100 H200 D" },
};

static void test_head_responses(void **state)
{
	struct run_opt o = { .kind = HTTP_RESPONSE_KIND, .expect_head = true };
	run_rows(head_responses, sizeof head_responses / sizeof head_responses[0], &o);
}

/* ---------------------------------------------------------------- limits and precedence */

/* A request whose target is ULEN bytes, plus EXTRA header text, under small_lim. */
static char *make_request(const char *method, size_t ulen, const char *version,
                          const char *extra, size_t nfill, size_t *n)
{
	size_t cap = ulen + strlen(extra) + nfill * 16 + 256, len = 0, i;
	char *b = malloc(cap);
	len += (size_t)snprintf(b + len, cap - len, "%s /", method);
	for (i = 1; i < ulen; i++)
		b[len++] = 'a';
	len += (size_t)snprintf(b + len, cap - len, " %s\r\nHost: a\r\n", version);
	for (i = 0; i < nfill; i++)
		len += (size_t)snprintf(b + len, cap - len, "X-%03zu: y\r\n", i);
	len += (size_t)snprintf(b + len, cap - len, "%s\r\n", extra);
	*n = len;
	return b;
}

struct gen_row {
	const char *why;
	const char *method;
	size_t ulen;
	const char *version, *extra;
	size_t nfill;
	const struct http_limits *lim;
	const char *want;
};

static const struct gen_row gen_rows[] = {
	{ "target of exactly max_uri_bytes", "GET", 128, "HTTP/1.1", "", 0, NULL, "H D" },
	{ "target one byte over max_uri_bytes", "GET", 129, "HTTP/1.1", "", 0, NULL, "E414" },
	{ "target over max_header_bytes too: 414, checked first", "GET", 5000, "HTTP/1.1", "", 0,
	  NULL, "E414" },
	{ "max_uri_bytes above max_header_bytes: the smaller governs, still 414", "GET", 2000,
	  "HTTP/1.1", "", 0, &uri_above_lim, "E414" },
	{ "400 over 414: long target and a bad header", "GET", 500, "HTTP/1.1", "Bad Header: x\r\n",
	  0, NULL, "E400" },
	{ "400 over 414: long target and a missing version", "GET", 500, "", "", 0, NULL, "E400" },
	{ "400 over 414: long target and two Content-Lengths", "POST", 500, "HTTP/1.1",
	  "Content-Length: 0\r\nContent-Length: 0\r\n", 0, NULL, "E400" },
	{ "414 over 501: long target and an unknown method", "FOO", 500, "HTTP/1.1", "", 0, NULL,
	  "E414" },
	{ "414 over 505: long target and HTTP/2.0", "GET", 500, "HTTP/2.0", "", 0, NULL, "E414" },
	{ "414 over 505: long target and HTTP/1.2", "GET", 500, "HTTP/1.2", "", 0, NULL, "E414" },
	{ "414 over 431: long target and too many header lines", "GET", 500, "HTTP/1.1", "", 120,
	  &wide_lim, "E414" },
	{ "100 header lines are fine", "GET", 1, "HTTP/1.1", "", 99, &big_lim, "H D" },
	{ "101 header lines: 431", "GET", 1, "HTTP/1.1", "", 100, &big_lim, "E431" },
	{ "400 over 431: too many lines and a repeated Content-Length", "POST", 1, "HTTP/1.1",
	  "Content-Length: 0\r\nContent-Length: 0\r\n", 120, &big_lim, "E400" },
	{ "400 over 431: too many lines and a Transfer-Encoding not ending in chunked", "POST", 1,
	  "HTTP/1.1",
	  "Transfer-Encoding: gzip\r\n", 120, &big_lim, "E400" },
	{ "431 over 501: too many lines and an unknown method", "FOO", 1, "HTTP/1.1", "", 120,
	  &big_lim, "E431" },
	{ "431 over 505: too many lines and HTTP/2.0", "GET", 1, "HTTP/1.1", "", 120, &big_lim,
	  "E431" },
	{ "head over max_header_bytes", "GET", 100, "HTTP/1.1", "", 99, NULL, "E431" },
	{ "431 over 501: big head and an unknown method", "FOO", 100, "HTTP/1.1", "", 99, NULL,
	  "E431" },
	{ "431 over 505: big head and HTTP/1.2", "GET", 100, "HTTP/1.2", "", 99, NULL, "E431" },
};

static void test_limits_precedence(void **state)
{
	size_t i, n;
	for (i = 0; i < sizeof gen_rows / sizeof gen_rows[0]; i++) {
		const struct gen_row *r = &gen_rows[i];
		struct run_opt o = { .kind = HTTP_REQUEST_KIND, .lim = r->lim };
		char *b = make_request(r->method, r->ulen, r->version, r->extra, r->nfill, &n);
		expect_trace(r->why, b, n, &o, r->want);
		free(b);
	}
}

/* The head limit counts every byte of the head, request line and CRLFs included. */
static void test_head_size_edge(void **state)
{
	char b[2048];
	size_t n, pad;
	struct run_opt o = { .kind = HTTP_REQUEST_KIND };
	/* "GET / HTTP/1.1\r\nHost: a\r\nX: <pad>\r\n\r\n" is 32 + pad bytes */
	for (pad = 1024 - 32 - 1; pad <= 1024 - 32 + 1; pad++) {
		memcpy(b, "GET / HTTP/1.1\r\nHost: a\r\nX: ", 28);
		memset(b + 28, 'v', pad);
		memcpy(b + 28 + pad, "\r\n\r\n", 4);
		n = 32 + pad;
		expect_trace("head around max_header_bytes", b, n, &o,
		             n <= 1024 ? "H D" : "E431");
	}
	/* a bad byte past the limit is never seen: the received part decides (431) */
	memcpy(b, "GET / HTTP/1.1\r\nHost: a\r\nX: ", 28);
	memset(b + 28, 'v', 1100);
	memcpy(b + 1128, "\n\r\n", 3);
	expect_trace("bad byte past the limit", b, 1131, &o, "E431");
	/* a bad byte inside the limit wins */
	memcpy(b, "GET / HTTP/1.1\r\nHost: a\r\nX: a\nb", 31);
	memset(b + 31, 'v', 1100);
	expect_trace("bad byte inside the limit", b, 1131, &o, "E400");
}

/* A chunk line (size and extensions) may be HTTP_MAX_CHUNK_LINE bytes, not one more. */
static void test_chunk_line_limit(void **state)
{
	static const char head[] = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
	struct run_opt o = { .kind = HTTP_REQUEST_KIND };
	size_t extra[] = { 0, 1, 100000 };
	size_t i, k;
	for (k = 0; k < 2; k++) {       /* as the first chunk, and after one */
		for (i = 0; i < sizeof extra / sizeof extra[0]; i++) {
			size_t line = HTTP_MAX_CHUNK_LINE + extra[i], n = 0;
			char *b = malloc(sizeof head + line + 64);
			memcpy(b, head, sizeof head - 1);
			n = sizeof head - 1;
			if (k) {
				memcpy(b + n, "1\r\nx\r\n", 6);
				n += 6;
			}
			b[n++] = '1';
			b[n++] = ';';
			memset(b + n, 'e', line - 2);
			n += line - 2;
			memcpy(b + n, "\r\ny\r\n0\r\n\r\n", 10);
			n += 10;
			expect_trace("unbounded chunk extension (llhttp CVE-2024-27982 class)", b, n,
			             &o, extra[i] == 0 ? (k ? "H B:xy D" : "H B:y D")
			                              : (k ? "H B:x E400" : "H E400"));
			free(b);
		}
	}
}

/* Trailers are bounded like a head: max_header_bytes and HTTP_MAX_HEADERS lines. */
static void test_trailer_limits(void **state)
{
	static const char head[] = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
	                           "0\r\n";
	struct run_opt o = { .kind = HTTP_REQUEST_KIND, .lim = &big_lim };
	char *b = malloc(70000);
	size_t n, i;

	memcpy(b, head, sizeof head - 1);
	n = sizeof head - 1;
	for (i = 0; i < 101; i++)
		n += (size_t)sprintf(b + n, "T%zu: x\r\n", i);
	memcpy(b + n, "\r\n", 2);
	expect_trace("101 trailer lines", b, n + 2, &o, "H E431");

	n = sizeof head - 1;
	memcpy(b + n, "T: ", 3);
	memset(b + n + 3, 'v', 66000);
	n += 66003;
	memcpy(b + n, "\r\n\r\n", 4);
	expect_trace("trailers over max_header_bytes", b, n + 4, &o, "H E431");
	free(b);
}

/* ---------------------------------------------------------------- head fields */

static struct http_msg *parse_one(enum http_kind kind, const char *s, size_t n,
                                  struct evbuffer *in)
{
	struct http_msg *m = http_msg_new(kind, &small_lim);
	evbuffer_add(in, s, n);
	assert_int_equal(http_msg_feed(m, in, NULL, 0), HTTP_HEAD);
	return m;
}

static bool span_is(const char *p, size_t n, const char *want)
{
	return p != NULL && n == strlen(want) && memcmp(p, want, n) == 0;
}

static bool hop_of(const struct http_head *h, const char *name)
{
	int i;
	for (i = 0; i < h->nhdrs; i++)
		if (span_is(h->hdrs[i].name, h->hdrs[i].nlen, name))
			return h->hdrs[i].hop;
	fail_msg("no header %s", name);
	return false;
}

static void test_request_fields(void **state)
{
	struct evbuffer *in = evbuffer_new();
	struct http_msg *m;
	const struct http_head *h;
	size_t len;
	const char *v;

	m = parse_one(HTTP_REQUEST_KIND, S("GET /p?q=1 HTTP/1.1\r\nHost: a:8080  \r\n"
	                                   "Connection: X-Foo, close\r\nX-Foo: 1\r\nX-Bar:  2 \r\n"
	                                   "Keep-Alive: 5\r\nProxy-Connection: x\r\nTE: trailers\r\n"
	                                   "Trailer: T\r\nUpgrade: ws\r\nExpect: 100-Continue\r\n"
	                                   "Content-Length: 0\r\n\r\n"), in);
	h = http_msg_head(m);
	assert_string_equal(h->method, "GET");
	assert_false(h->method_head);
	assert_true(span_is(h->target, h->target_len, "/p?q=1"));
	assert_true(span_is(h->path, h->path_len, "/p?q=1"));
	assert_true(span_is(h->host, h->host_len, "a:8080"));
	assert_int_equal(h->version, 11);
	assert_int_equal(h->content_length, 0);
	assert_false(h->chunked);
	assert_false(h->keep_alive);
	assert_true(h->expect_continue);
	assert_false(h->upgrade);       /* Upgrade without Connection: upgrade */
	assert_int_equal(h->nhdrs, 11);
	assert_true(hop_of(h, "Connection"));
	assert_true(hop_of(h, "X-Foo"));
	assert_false(hop_of(h, "X-Bar"));
	assert_false(hop_of(h, "Host"));
	assert_true(hop_of(h, "Keep-Alive"));
	assert_true(hop_of(h, "Proxy-Connection"));
	assert_true(hop_of(h, "TE"));
	assert_true(hop_of(h, "Trailer"));
	assert_true(hop_of(h, "Upgrade"));
	assert_true(hop_of(h, "Content-Length"));
	assert_false(hop_of(h, "Expect"));
	v = http_head_get(h, "x-bar", &len);
	assert_true(span_is(v, len, "2"));
	assert_null(http_head_get(h, "X-Baz", &len));
	assert_int_equal(http_head_count(h, "HOST"), 1);
	assert_int_equal(http_msg_feed(m, in, NULL, 0), HTTP_DONE);
	http_msg_free(m);

	m = parse_one(HTTP_REQUEST_KIND, S("HEAD http://Example.com?x=1 HTTP/1.0\r\n"
	                                   "Connection: Keep-Alive, Upgrade\r\nUpgrade: websocket\r\n"
	                                   "Expect: 100-continue\r\n\r\n"), in);
	h = http_msg_head(m);
	assert_true(h->method_head);
	assert_true(span_is(h->path, h->path_len, "/?x=1"));
	assert_true(span_is(h->host, h->host_len, "Example.com"));
	assert_int_equal(h->version, 10);
	assert_true(h->keep_alive);
	assert_true(h->upgrade);
	assert_false(h->expect_continue);       /* ignored on HTTP/1.0 (RFC 9110 §10.1.1) */
	assert_int_equal(h->content_length, -1);
	http_msg_free(m);

	m = parse_one(HTTP_REQUEST_KIND, S("OPTIONS * HTTP/1.1\r\nHost: a\r\n"
	                                   "Transfer-Encoding: chunked\r\n\r\n"), in);
	h = http_msg_head(m);
	assert_true(span_is(h->path, h->path_len, "*"));
	assert_true(h->chunked);
	assert_true(h->keep_alive);
	assert_int_equal(h->content_length, -1);
	http_msg_free(m);
	evbuffer_drain(in, evbuffer_get_length(in));

	m = parse_one(HTTP_REQUEST_KIND, S("GET https://a:443 HTTP/1.1\r\nHost: a\r\n\r\n"), in);
	h = http_msg_head(m);
	assert_true(span_is(h->path, h->path_len, "/"));
	assert_true(span_is(h->host, h->host_len, "a"));
	http_msg_free(m);

	m = parse_one(HTTP_REQUEST_KIND, S("GET / HTTP/1.0\r\nConnection: close, keep-alive\r\n\r\n"),
	              in);
	assert_false(http_msg_head(m)->keep_alive);     /* close wins */
	http_msg_free(m);
	m = parse_one(HTTP_REQUEST_KIND, S("GET / HTTP/1.0\r\n\r\n"), in);
	assert_false(http_msg_head(m)->keep_alive);
	assert_null(http_msg_head(m)->host);
	http_msg_free(m);
	evbuffer_free(in);
}

static void test_response_fields(void **state)
{
	struct evbuffer *in = evbuffer_new();
	struct http_msg *m;
	const struct http_head *h;

	m = parse_one(HTTP_RESPONSE_KIND, S("HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\n"
	                                    "Connection: close\r\nContent-Length: 0\r\n\r\n"), in);
	h = http_msg_head(m);
	assert_int_equal(h->status, 503);
	assert_true(span_is(h->reason, h->reason_len, "Service Unavailable"));
	assert_false(h->keep_alive);
	assert_false(h->body_until_close);
	assert_true(hop_of(h, "Content-Length"));
	http_msg_free(m);

	m = parse_one(HTTP_RESPONSE_KIND, S("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n"
	                                    "Content-Length: 3\r\n\r\n"), in);
	h = http_msg_head(m);
	assert_int_equal(h->version, 10);
	assert_true(h->keep_alive);
	assert_int_equal(h->content_length, 3);
	http_msg_free(m);

	m = parse_one(HTTP_RESPONSE_KIND, S("HTTP/1.1 200 OK\r\n\r\n"), in);
	h = http_msg_head(m);
	assert_true(h->body_until_close);
	assert_false(h->keep_alive);
	http_msg_free(m);
	evbuffer_free(in);
}

/* ---------------------------------------------------------------- feeding */

/* body_max is the room the caller has: 0 moves nothing, N moves at most N per call. */
static void test_backpressure(void **state)
{
	static const char req[] = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n0123456789"
	                          "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
	                          "7\r\nabcdefg\r\n0\r\n\r\n";
	struct http_msg *m = http_msg_new(HTTP_REQUEST_KIND, &small_lim);
	struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
	size_t before;
	int i;

	evbuffer_add(in, req, sizeof req - 1);
	assert_int_equal(http_msg_feed(m, in, out, 0), HTTP_HEAD);
	before = evbuffer_get_length(in);
	assert_int_equal(http_msg_feed(m, in, out, 0), HTTP_NEED_MORE);
	assert_int_equal(evbuffer_get_length(in), before);
	for (i = 0; i < 3; i++) {
		assert_int_equal(http_msg_feed(m, in, out, 4), HTTP_BODY);
		assert_int_equal(evbuffer_get_length(out), (size_t)(i < 2 ? 4 * (i + 1) : 10));
	}
	assert_int_equal(http_msg_feed(m, in, out, 4), HTTP_DONE);
	evbuffer_drain(out, 10);
	http_msg_next(m);

	assert_int_equal(http_msg_feed(m, in, out, 0), HTTP_HEAD);
	assert_int_equal(http_msg_feed(m, in, out, 0), HTTP_NEED_MORE);
	assert_int_equal(evbuffer_get_length(out), 0);
	assert_int_equal(http_msg_feed(m, in, out, 3), HTTP_BODY);
	assert_int_equal(evbuffer_get_length(out), 3);
	assert_int_equal(http_msg_feed(m, in, out, 0), HTTP_NEED_MORE);
	assert_int_equal(http_msg_feed(m, in, out, 100), HTTP_BODY);
	assert_int_equal(evbuffer_get_length(out), 7);
	assert_int_equal(http_msg_feed(m, in, out, 100), HTTP_DONE);
	assert_int_equal(evbuffer_get_length(in), 0);
	http_msg_free(m);
	evbuffer_free(in);
	evbuffer_free(out);
}

/* The header timer starts on the first byte of a head. */
static void test_head_bytes(void **state)
{
	struct http_msg *m = http_msg_new(HTTP_REQUEST_KIND, &small_lim);
	struct evbuffer *in = evbuffer_new();

	assert_int_equal(http_msg_head_bytes(m), 0);
	assert_int_equal(http_msg_feed(m, in, NULL, 0), HTTP_NEED_MORE);
	assert_int_equal(http_msg_head_bytes(m), 0);
	evbuffer_add(in, "G", 1);
	assert_int_equal(http_msg_feed(m, in, NULL, 0), HTTP_NEED_MORE);
	assert_int_equal(http_msg_head_bytes(m), 1);
	evbuffer_add(in, "ET / HTTP/1.1\r\nHo", 17);
	assert_int_equal(http_msg_feed(m, in, NULL, 0), HTTP_NEED_MORE);
	assert_int_equal(http_msg_head_bytes(m), 18);
	evbuffer_add(in, "st: a\r\n\r\nGET", 12);
	assert_int_equal(http_msg_feed(m, in, NULL, 0), HTTP_HEAD);
	assert_int_equal(http_msg_head_bytes(m), 27);
	assert_int_equal(evbuffer_get_length(in), 3);   /* the next request is not touched */
	assert_int_equal(http_msg_feed(m, in, NULL, 0), HTTP_DONE);
	assert_int_equal(http_msg_feed(m, in, NULL, 0), HTTP_DONE);     /* until next() */
	assert_int_equal(evbuffer_get_length(in), 3);
	http_msg_next(m);
	assert_int_equal(http_msg_head_bytes(m), 0);
	assert_int_equal(http_msg_feed(m, in, NULL, 0), HTTP_NEED_MORE);
	assert_int_equal(http_msg_head_bytes(m), 3);
	http_msg_free(m);
	evbuffer_free(in);
}

/* The head stays valid while the body is read, though hbuf is not touched by bodies. */
static void test_head_survives_body(void **state)
{
	struct http_msg *m = http_msg_new(HTTP_REQUEST_KIND, &small_lim);
	struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
	const struct http_head *h;
	const char *v;
	size_t len;
	evbuffer_add_printf(in, "PUT /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
	assert_int_equal(http_msg_feed(m, in, out, SIZE_MAX), HTTP_HEAD);
	h = http_msg_head(m);
	evbuffer_add_printf(in, "3\r\nabc\r\n0\r\nTrailer-Host: evil\r\n\r\n");
	assert_int_equal(http_msg_feed(m, in, out, SIZE_MAX), HTTP_BODY);
	assert_int_equal(http_msg_feed(m, in, out, SIZE_MAX), HTTP_DONE);
	assert_true(span_is(h->path, h->path_len, "/x"));
	v = http_head_get(h, "host", &len);
	assert_true(span_is(v, len, "h"));
	assert_int_equal(h->nhdrs, 2);  /* trailers never join the head */
	http_msg_free(m);
	evbuffer_free(in);
	evbuffer_free(out);
}

/* Errors carry the SPEC reason for their status, and a detail for the log. */
static void test_error_reasons(void **state)
{
	static const struct { const char *in; int st; const char *reason; } rows[] = {
		{ "GET / HTTP/1.1\r\n\r\n", 400, "bad-request" },
		/* no version: refused at the end of the request line, not after a timeout */
		{ "GET /\r\n", 400, "bad-request" },
		{ "GET /x?y=1\r", 400, "bad-request" },
		{ "FOO /\r\n", 400, "bad-request" },
		{ "GET / HTTP/1.1\r\nHost:\r\n\r\n", 400, "bad-request" },
		{ "FOO / HTTP/1.1\r\nHost: a\r\n\r\n", 501, "not-implemented" },
		{ "GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505, "version-not-supported" },
	};
	size_t i;
	for (i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		struct evbuffer *in = evbuffer_new();
		struct http_msg *m = http_msg_new(HTTP_REQUEST_KIND, &small_lim);
		int st;
		const char *reason, *detail;
		evbuffer_add(in, rows[i].in, strlen(rows[i].in));
		assert_int_equal(http_msg_feed(m, in, NULL, 0), HTTP_ERROR);
		http_msg_error(m, &st, &reason, &detail);
		assert_int_equal(st, rows[i].st);
		assert_string_equal(reason, rows[i].reason);
		assert_true(strlen(detail) > 0);
		http_msg_free(m);
		evbuffer_free(in);
	}
	{
		struct evbuffer *in = evbuffer_new();
		struct http_msg *m = http_msg_new(HTTP_RESPONSE_KIND, NULL);
		int st;
		const char *reason;
		evbuffer_add(in, "HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n", 29);
		assert_int_equal(http_msg_feed(m, in, NULL, 0), HTTP_ERROR);
		http_msg_error(m, &st, &reason, NULL);
		assert_int_equal(st, 502);
		assert_string_equal(reason, "bad-response");
		http_msg_free(m);
		evbuffer_free(in);
	}
}

/* Input spread over many evbuffer chains (one per byte): heads and bodies cross chains, and
 * a body step covers more chains than one peek returns. */
static void test_many_chains(void **state)
{
	static const char req[] = "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 40\r\n\r\n"
	                          "0123456789012345678901234567890123456789"
	                          "POST /y HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
	                          "28;e=1\r\nabcdefghijabcdefghijabcdefghijabcdefghij\r\n0\r\n\r\n";
	struct http_msg *m = http_msg_new(HTTP_REQUEST_KIND, &small_lim);
	struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
	enum http_event ev;
	size_t i;
	int k;

	for (i = 0; i < sizeof req - 1; i++)
		evbuffer_add_reference(in, req + i, 1, NULL, NULL);
	for (k = 0; k < 2; k++) {
		assert_int_equal(http_msg_feed(m, in, out, SIZE_MAX), HTTP_HEAD);
		while ((ev = http_msg_feed(m, in, out, SIZE_MAX)) == HTTP_BODY)
			;
		assert_int_equal(ev, HTTP_DONE);
		assert_int_equal(evbuffer_get_length(out), 40);
		evbuffer_drain(out, 40);
		http_msg_next(m);
	}
	assert_int_equal(evbuffer_get_length(in), 0);
	http_msg_free(m);
	evbuffer_free(in);
	evbuffer_free(out);
}

/* EOF: the end of a message delimited by close; a truncation otherwise; nothing between
 * messages. */
static void test_eof_states(void **state)
{
	static const struct {
		enum http_kind kind;
		const char *in;
		enum http_event after_head, at_eof;
	} rows[] = {
		{ HTTP_REQUEST_KIND, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", HTTP_NEED_MORE, HTTP_DONE },
		{ HTTP_REQUEST_KIND, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok",
		  HTTP_BODY, HTTP_DONE },
		{ HTTP_REQUEST_KIND, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nok",
		  HTTP_BODY, HTTP_ERROR },
		{ HTTP_RESPONSE_KIND, "HTTP/1.1 204 No Content\r\n\r\n", HTTP_NEED_MORE, HTTP_DONE },
		{ HTTP_RESPONSE_KIND, "HTTP/1.1 200 OK\r\n\r\nabc", HTTP_BODY, HTTP_DONE },
		{ HTTP_RESPONSE_KIND, "HTTP/1.1 100 Continue\r\n\r\n", HTTP_NEED_MORE, HTTP_NEED_MORE },
		{ HTTP_RESPONSE_KIND, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
		  HTTP_NEED_MORE, HTTP_ERROR },
	};
	size_t i;
	for (i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		struct http_msg *m = http_msg_new(rows[i].kind, &small_lim);
		struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
		evbuffer_add(in, rows[i].in, strlen(rows[i].in));
		assert_int_equal(http_msg_feed(m, in, out, SIZE_MAX), HTTP_HEAD);
		if (rows[i].after_head == HTTP_BODY)
			assert_int_equal(http_msg_feed(m, in, out, SIZE_MAX), HTTP_BODY);
		/* no more feeding: the peer closed right here */
		assert_int_equal(http_msg_eof(m), rows[i].at_eof);
		if (rows[i].at_eof == HTTP_DONE)
			assert_int_equal(http_msg_eof(m), HTTP_NEED_MORE);
		http_msg_free(m);
		evbuffer_free(in);
		evbuffer_free(out);
	}
}

/* ---------------------------------------------------------------- chunk writer */

static void test_chunk_encode(void **state)
{
	struct evbuffer *src = evbuffer_new(), *out = evbuffer_new(), *in = evbuffer_new();
	struct http_msg *m = http_msg_new(HTTP_REQUEST_KIND, &small_lim);
	char buf[512], big[300];
	size_t n;

	evbuffer_add(src, "hello", 5);
	h1_chunk_encode(out, src, 5);
	h1_chunk_encode(out, src, 5);         /* nothing left: no zero-size chunk */
	h1_chunk_last(out);
	n = evbuffer_get_length(out);
	evbuffer_remove(out, buf, n);
	assert_int_equal(n, 15);
	assert_memory_equal(buf, "5\r\nhello\r\n0\r\n\r\n", 15);

	memset(big, 'z', sizeof big);
	evbuffer_add(src, big, sizeof big);
	h1_chunk_encode(out, src, 1000);      /* clamped to what src holds */
	n = evbuffer_get_length(out);
	evbuffer_copyout(out, buf, 5);
	assert_memory_equal(buf, "12c\r\n", 5);
	assert_int_equal(n, 5 + 300 + 2);
	assert_int_equal(evbuffer_get_length(src), 0);

	/* what the writer makes, the parser reads back */
	evbuffer_add_printf(in, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
	evbuffer_add_buffer(in, out);
	h1_chunk_last(in);
	assert_int_equal(http_msg_feed(m, in, out, SIZE_MAX), HTTP_HEAD);
	while (http_msg_feed(m, in, out, 7) == HTTP_BODY)
		;
	assert_int_equal(evbuffer_get_length(out), 300);
	assert_int_equal(evbuffer_get_length(in), 0);
	http_msg_free(m);
	evbuffer_free(src);
	evbuffer_free(out);
	evbuffer_free(in);
}

/* ---------------------------------------------------------------- head writer */

static void count_adds(struct evbuffer *b, const struct evbuffer_cb_info *info, void *arg)
{
	if (info->n_added > 0)
		(*(int *)arg)++;
}

/* Pieces around the writer's stack buffer: the bytes come out whole and in order, in one
 * append to the evbuffer (one run of its callbacks) as long as they fit. */
static void test_head_writer(void **state)
{
	static const struct {
		size_t piece[4];
		int appends;
	} rows[] = {
		{ { 5, 0, 7, 0 }, 1 },
		{ { 0, 0, 0, 0 }, 0 },                          /* nothing: no append at all */
		{ { H1_OUT_BUF, 0, 0, 0 }, 1 },                 /* exactly full */
		{ { H1_OUT_BUF - 1, 1, 0, 0 }, 1 },
		{ { H1_OUT_BUF - 1, 2, 0, 0 }, 2 },             /* spills, the rest follows */
		{ { 10, H1_OUT_BUF + 5, 3, 0 }, 3 },            /* larger than the buffer: as is */
		{ { 3 * H1_OUT_BUF, 0, 0, 0 }, 1 },
		{ { H1_OUT_BUF / 2, H1_OUT_BUF / 2, H1_OUT_BUF / 2, 1 }, 2 },
	};
	static char src[4 * H1_OUT_BUF], want[16 * H1_OUT_BUF], got[16 * H1_OUT_BUF];
	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (char)('a' + (i * 7) % 26);
	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
		struct evbuffer *b = evbuffer_new();
		int adds = 0;
		evbuffer_add_cb(b, count_adds, &adds);
		struct h1_out o;
		size_t n = 0;
		h1_out_begin(&o, b);
		for (int k = 0; k < 4; k++) {
			size_t len = rows[r].piece[k];
			/* each piece starts at a different place of SRC: an order mix-up shows */
			h1_out_add(&o, len ? src + k * 3 : NULL, len);
			memcpy(want + n, src + k * 3, len);
			n += len;
		}
		h1_out_end(&o);
		assert_int_equal(evbuffer_get_length(b), n);
		evbuffer_remove(b, got, n);
		assert_memory_equal(got, want, n);
		assert_int_equal(adds, rows[r].appends);
		evbuffer_free(b);
	}
}

/* A response head with more fields than the stack buffer holds: the same bytes as a small
 * one would have, field by field. */
static void test_response_head_long(void **state)
{
	enum { NF = 140 };
	static char names[NF][16], values[NF][40], want[16384], got[16384];
	struct http_hdr f[NF];
	size_t n = 0;
	n += (size_t)sprintf(want + n, "HTTP/1.1 200 Fine\r\n");
	for (int i = 0; i < NF; i++) {
		f[i].nlen = (uint32_t)sprintf(names[i], "X-Field-%d", i);
		f[i].vlen = (uint32_t)sprintf(values[i], "value %d of a long head", i * 1000);
		f[i].name = names[i];
		f[i].value = values[i];
		f[i].hop = i % 7 == 3;
		if (!f[i].hop)
			n += (size_t)sprintf(want + n, "%s: %s\r\n", names[i], values[i]);
	}
	n += (size_t)sprintf(want + n, "Content-Length: 1234567\r\nConnection: close\r\n\r\n");
	assert_true(n > 2 * H1_OUT_BUF);
	struct resp_head h = {
		.status = 200, .reason = "Fine", .reason_len = 4, .hdrs = f, .nhdrs = NF,
		.content_length = 1234567,
	};
	struct evbuffer *b = evbuffer_new();
	h1_response_head(b, &h, "OK", H1_LENGTH, H1_CONN_CLOSE);
	assert_int_equal(evbuffer_get_length(b), n);
	evbuffer_remove(b, got, n);
	assert_memory_equal(got, want, n);

	/* and a short one, with the standard reason, chunked, keep-alive */
	h.reason = NULL;
	h.nhdrs = 1;
	h1_response_head(b, &h, "OK", H1_CHUNKED, H1_CONN_KEEP_ALIVE);
	const char *small = "HTTP/1.1 200 OK\r\nX-Field-0: value 0 of a long head\r\n"
	                    "Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n";
	n = evbuffer_get_length(b);
	evbuffer_remove(b, got, n);
	assert_int_equal(n, strlen(small));
	assert_memory_equal(got, small, n);
	evbuffer_free(b);
}

static void test_fmt_int(void **state)
{
	static const struct {
		int64_t v;
		const char *want;
	} rows[] = {
		{ 0, "0" }, { 9, "9" }, { 10, "10" }, { 13, "13" }, { 200, "200" }, { -1, "-1" },
		{ -10, "-10" }, { INT64_MAX, "9223372036854775807" },
		{ INT64_MIN, "-9223372036854775808" },
	};
	char buf[32];
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		size_t n = h1_fmt_int(buf, rows[i].v);
		buf[n] = 0;
		assert_string_equal(buf, rows[i].want);
	}
	/* status lines: three digits the short way, anything else the long one */
	static const struct {
		int status;
		const char *want;
	} st[] = {
		{ 200, "HTTP/1.1 200 R\r\n\r\n" }, { 100, "HTTP/1.1 100 R\r\n\r\n" },
		{ 599, "HTTP/1.1 599 R\r\n\r\n" }, { 999, "HTTP/1.1 999 R\r\n\r\n" },
		{ 99, "HTTP/1.1 99 R\r\n\r\n" }, { 1000, "HTTP/1.1 1000 R\r\n\r\n" },
	};
	struct evbuffer *b = evbuffer_new();
	for (size_t i = 0; i < sizeof(st) / sizeof(st[0]); i++) {
		struct resp_head h = { .status = st[i].status };
		h1_response_head(b, &h, "R", H1_NO_BODY, H1_CONN_NONE);
		size_t n = evbuffer_get_length(b);
		assert_int_equal(n, strlen(st[i].want));
		evbuffer_remove(b, buf, n);
		assert_memory_equal(buf, st[i].want, n);
	}
	evbuffer_free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_requests),
		cmocka_unit_test(test_bad_bodies),
		cmocka_unit_test(test_refused_requests),
		cmocka_unit_test(test_good_requests),
		cmocka_unit_test(test_responses),
		cmocka_unit_test(test_head_responses),
		cmocka_unit_test(test_limits_precedence),
		cmocka_unit_test(test_head_size_edge),
		cmocka_unit_test(test_chunk_line_limit),
		cmocka_unit_test(test_trailer_limits),
		cmocka_unit_test(test_request_fields),
		cmocka_unit_test(test_response_fields),
		cmocka_unit_test(test_backpressure),
		cmocka_unit_test(test_head_bytes),
		cmocka_unit_test(test_head_survives_body),
		cmocka_unit_test(test_error_reasons),
		cmocka_unit_test(test_many_chains),
		cmocka_unit_test(test_eof_states),
		cmocka_unit_test(test_chunk_encode),
		cmocka_unit_test(test_head_writer),
		cmocka_unit_test(test_response_head_long),
		cmocka_unit_test(test_fmt_int),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
