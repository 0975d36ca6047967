/*
 * fuzz_request: libFuzzer target for the request parser (http.c, SPEC §5 and §8).
 *
 * Input: byte 0 seeds the slicing and the body room, byte 1 picks the limits, the rest is
 * what a client sends. The bytes are parsed twice: fed whole with unlimited body room, and fed
 * in pseudo-random slices with a small, varying body room. Invariants, beyond ASan and UBSan
 * being quiet:
 *  - both runs give the same events, statuses and body bytes (slicing and backpressure never
 *    change a verdict);
 *  - every call makes progress or asks for more; body bytes never exceed the input, nor
 *    body_max per call; an error is final and carries a request-side status;
 *  - a delivered head is safe to re-serialize: method and header names are tokens, values,
 *    target and path hold no CR, LF or NUL, one Host at most, framing is one of none,
 *    Content-Length or chunked, and the framing headers are marked hop-by-hop.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "http/h1_parser.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c) do { if (!(c)) abort(); } while (0)

static bool tchar(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static bool safe_bytes(const char *p, size_t n)
{
	size_t i;
	for (i = 0; i < n; i++)
		if (p[i] == '\r' || p[i] == '\n' || p[i] == 0)
			return false;
	return true;
}

static bool name_is(const struct http_hdr *h, const char *name)
{
	return h->nlen == strlen(name) && strncasecmp(h->name, name, h->nlen) == 0;
}

static void check_head(const struct http_head *h, const struct http_limits *lim)
{
	size_t i, mlen = strlen(h->method);
	int k, hosts = 0;

	CHECK(mlen > 0 && mlen < sizeof h->method);
	for (i = 0; i < mlen; i++)
		CHECK(tchar((unsigned char)h->method[i]));
	CHECK(strcmp(h->method, "CONNECT") != 0);
	CHECK(h->version == 10 || h->version == 11);
	CHECK(h->target != NULL && h->target_len > 0 && h->target_len <= lim->max_uri_bytes);
	for (i = 0; i < h->target_len; i++)
		CHECK((unsigned char)h->target[i] > 0x20 && (unsigned char)h->target[i] < 0x7f &&
		      h->target[i] != '#');
	CHECK(h->path != NULL && h->path_len > 0 && safe_bytes(h->path, h->path_len));
	CHECK(h->path[0] == '/' || (h->path_len == 1 && h->path[0] == '*' &&
	                            strcmp(h->method, "OPTIONS") == 0));
	CHECK(h->host == NULL || safe_bytes(h->host, h->host_len));
	CHECK(h->version == 10 || h->host != NULL);
	CHECK(h->nhdrs >= 0 && h->nhdrs <= HTTP_MAX_HEADERS);
	CHECK(h->content_length >= -1);
	CHECK(!(h->chunked && h->content_length >= 0));
	CHECK(!(h->chunked && h->version == 10));
	CHECK(!h->body_until_close);
	for (k = 0; k < h->nhdrs; k++) {
		const struct http_hdr *x = &h->hdrs[k];
		CHECK(x->nlen > 0);
		for (i = 0; i < x->nlen; i++)
			CHECK(tchar((unsigned char)x->name[i]));
		CHECK(safe_bytes(x->value, x->vlen));
		if (name_is(x, "host"))
			hosts++;
		if (name_is(x, "content-length") || name_is(x, "transfer-encoding") ||
		    name_is(x, "connection") || name_is(x, "upgrade") || name_is(x, "te") ||
		    name_is(x, "trailer") || name_is(x, "keep-alive"))
			CHECK(x->hop);
		CHECK(!name_is(x, "content_length") && !name_is(x, "transfer_encoding"));
	}
	CHECK(hosts <= 1);
	CHECK(http_head_count(h, "content-length") == (h->content_length >= 0));
	CHECK(http_head_count(h, "transfer-encoding") > 0 || !h->chunked);
}

/* A running digest of the events and body bytes. */
struct trace {
	uint64_t h;
	size_t body;
};

static void mix(struct trace *t, const void *p, size_t n)
{
	const unsigned char *b = p;
	size_t i;
	for (i = 0; i < n; i++)
		t->h = (t->h ^ b[i]) * 1099511628211ull;
}

static unsigned next_rand(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (*s >> 16) & 0x7fff;
}

/* Parse IN[0,N); SEED 0 feeds it whole with unlimited room, else in slices. */
static void run(const uint8_t *in_bytes, size_t n, const struct http_limits *lim, unsigned seed,
                struct trace *t)
{
	struct http_msg *m = http_msg_new(HTTP_REQUEST_KIND, lim);
	struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
	size_t pos = 0, steps = 0, max_steps = 8 * n + 64;
	bool eofed = false;

	t->h = 1469598103934665603ull;
	t->body = 0;
	for (;;) {
		size_t room = seed ? 1 + next_rand(&seed) % 64 : SIZE_MAX;
		size_t before_in = evbuffer_get_length(in), before_out = evbuffer_get_length(out);
		enum http_event ev;
		char tag;

		CHECK(++steps < max_steps);
		ev = http_msg_feed(m, in, out, room);
		CHECK(evbuffer_get_length(out) - before_out <= (ev == HTTP_BODY ? room : 0));
		if (ev == HTTP_NEED_MORE) {
			if (pos < n) {
				size_t k = seed ? 1 + next_rand(&seed) % 97 : n;
				if (k > n - pos)
					k = n - pos;
				evbuffer_add(in, in_bytes + pos, k);
				pos += k;
				continue;
			}
			if (eofed)
				break;
			eofed = true;
			ev = http_msg_eof(m);
			if (ev == HTTP_NEED_MORE)
				break;
		}
		tag = (char)ev;
		if (ev != HTTP_BODY)
			mix(t, &tag, 1);
		if (ev == HTTP_HEAD) {
			const struct http_head *h = http_msg_head(m);
			check_head(h, lim);
			mix(t, h->method, strlen(h->method));
			mix(t, h->path, h->path_len);
			CHECK(http_msg_head_bytes(m) <= lim->max_header_bytes);
		} else if (ev == HTTP_BODY) {
			size_t k = evbuffer_get_length(out);
			unsigned char buf[256];
			CHECK(k > 0);
			t->body += k;
			CHECK(t->body <= n);
			while (k > 0) {
				size_t c = k < sizeof buf ? k : sizeof buf;
				evbuffer_remove(out, buf, c);
				mix(t, buf, c);
				k -= c;
			}
		} else if (ev == HTTP_DONE) {
			http_msg_next(m);
			CHECK(http_msg_head_bytes(m) == 0);
		} else if (ev == HTTP_ERROR) {
			int st;
			const char *reason, *detail;
			http_msg_error(m, &st, &reason, &detail);
			CHECK(st == 400 || st == 414 || st == 431 || st == 501 || st == 505);
			CHECK(reason != NULL && detail != NULL);
			mix(t, &st, sizeof st);
			CHECK(http_msg_feed(m, in, out, room) == HTTP_ERROR);
			break;
		}
		if (eofed && ev != HTTP_BODY)
			break;
		/* no progress on a non-NEED_MORE event is only allowed for HEAD and DONE */
		CHECK(ev != HTTP_BODY || evbuffer_get_length(in) < before_in);
	}
	evbuffer_free(in);
	evbuffer_free(out);
	http_msg_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct http_limits lims[4] = {
		{ .max_header_bytes = 32768, .max_uri_bytes = 8192 },
		{ .max_header_bytes = 256, .max_uri_bytes = 64 },
		{ .max_header_bytes = 64, .max_uri_bytes = 128 },
		{ .max_header_bytes = 4096, .max_uri_bytes = 16 },
	};
	struct trace whole, sliced;
	const struct http_limits *lim;
	unsigned seed;

	if (size < 2)
		return 0;
	seed = 1u + data[0];
	lim = &lims[data[1] & 3];
	run(data + 2, size - 2, lim, 0, &whole);
	run(data + 2, size - 2, lim, seed, &sliced);
	CHECK(whole.h == sliced.h && whole.body == sliced.body);
	return 0;
}
