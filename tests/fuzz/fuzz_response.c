/*
 * fuzz_response: libFuzzer target for the response parser (http.c, SPEC §8).
 *
 * Input: byte 0 seeds the slicing and the body room, byte 1 picks the limits (bits 0-1) and
 * whether the request was HEAD (bit 2), the rest is what an upstream sends. The bytes are
 * parsed twice: fed whole with unlimited body room, and in pseudo-random slices with a small,
 * varying body room. Invariants, beyond ASan and UBSan being quiet:
 *  - both runs give the same events, statuses and body bytes;
 *  - every call makes progress or asks for more; body bytes never exceed the input, nor
 *    body_max per call; the only error status is 502, and it is final;
 *  - a delivered head has a status 100-599, version 1.0/1.1, header names that are tokens and
 *    values without CR, LF or NUL; 1xx, 204, 304 and HEAD responses carry no body bytes; a
 *    body until close is only announced for a final response without length.
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

static void check_head(const struct http_head *h, bool head_req)
{
	size_t i;
	int k;

	CHECK(h->status >= 100 && h->status <= 599);
	CHECK(h->version == 10 || h->version == 11);
	CHECK(h->reason != NULL || h->reason_len == 0);
	for (i = 0; i < h->reason_len; i++)
		CHECK(h->reason[i] != '\r' && h->reason[i] != '\n' && h->reason[i] != 0);
	CHECK(h->nhdrs >= 0 && h->nhdrs <= HTTP_MAX_HEADERS);
	CHECK(!(h->chunked && h->content_length >= 0));
	CHECK(h->content_length >= -1);
	if (h->body_until_close)
		CHECK(!head_req && h->status >= 200 && h->status != 204 && h->status != 304 &&
		      !h->chunked && h->content_length < 0 && !h->keep_alive);
	if (h->status == 204)
		CHECK(!h->chunked && h->content_length <= 0);
	for (k = 0; k < h->nhdrs; k++) {
		const struct http_hdr *x = &h->hdrs[k];
		CHECK(x->nlen > 0);
		for (i = 0; i < x->nlen; i++)
			CHECK(tchar((unsigned char)x->name[i]));
		for (i = 0; i < x->vlen; i++)
			CHECK(x->value[i] != '\r' && x->value[i] != '\n' && x->value[i] != 0);
	}
}

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

static void run(const uint8_t *in_bytes, size_t n, const struct http_limits *lim,
                bool head_req, unsigned seed, struct trace *t)
{
	struct http_msg *m = http_msg_new(HTTP_RESPONSE_KIND, lim);
	struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
	size_t pos = 0, steps = 0, max_steps = 8 * n + 64;
	bool eofed = false, no_body = false;

	t->h = 1469598103934665603ull;
	t->body = 0;
	http_msg_expect(m, head_req);
	for (;;) {
		size_t room = seed ? 1 + next_rand(&seed) % 64 : SIZE_MAX;
		size_t before_in = evbuffer_get_length(in);
		enum http_event ev;
		char tag;

		CHECK(++steps < max_steps);
		ev = http_msg_feed(m, in, out, room);
		CHECK(evbuffer_get_length(out) <= (ev == HTTP_BODY ? room : 0));
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
			check_head(h, head_req);
			mix(t, &h->status, sizeof h->status);
			no_body = head_req || h->status < 200 || h->status == 204 || h->status == 304;
			if (h->status == 101)
				break;                  /* the caller would tunnel */
			if (h->status < 200) {
				CHECK(http_msg_feed(m, in, out, room) == HTTP_DONE);
				http_msg_next(m);
			}
		} else if (ev == HTTP_BODY) {
			size_t k = evbuffer_get_length(out);
			unsigned char buf[256];
			CHECK(k > 0 && !no_body);
			CHECK(evbuffer_get_length(in) < before_in);
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
			CHECK(st == 502 && reason != NULL && strcmp(reason, "bad-response") == 0);
			CHECK(detail != NULL);
			CHECK(http_msg_feed(m, in, out, room) == HTTP_ERROR);
			break;
		}
		if (eofed && ev != HTTP_BODY)
			break;
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
		{ .max_header_bytes = 64, .max_uri_bytes = 64 },
		{ .max_header_bytes = 4096, .max_uri_bytes = 64 },
	};
	struct trace whole, sliced;
	const struct http_limits *lim;
	bool head_req;

	if (size < 2)
		return 0;
	lim = &lims[data[1] & 3];
	head_req = (data[1] & 4) != 0;
	run(data + 2, size - 2, lim, head_req, 0, &whole);
	run(data + 2, size - 2, lim, head_req, 1u + data[0], &sliced);
	CHECK(whole.h == sliced.h && whole.body == sliced.body);
	return 0;
}
