/*
 * h1_write: HTTP/1.1 head lines without printf, and the chunked body writer (see h1_write.h).
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "http/h1_write.h"
#include "http/h1_parser.h"
#include "http/responder.h"

size_t h1_fmt_int(char *p, int64_t v)
{
	char tmp[24];
	size_t n = 0;
	uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
	do {
		tmp[n++] = (char)('0' + u % 10);
		u /= 10;
	} while (u);
	size_t o = 0;
	if (v < 0)
		p[o++] = '-';
	while (n)
		p[o++] = tmp[--n];
	return o;
}

void h1_field3(struct evbuffer *b, const char *name, size_t nlen, const char *v1, size_t l1,
               const char *v2, size_t l2, const char *v3, size_t l3)
{
	char tmp[512];
	const char *part[5] = { name, ": ", v1, v2, v3 };
	size_t len[5] = { nlen, 2, l1, l2, l3 };
	if (nlen + l1 + l2 + l3 + 4 > sizeof(tmp)) {
		for (int i = 0; i < 5; i++)
			if (len[i] > 0)
				evbuffer_add(b, part[i], len[i]);
		evbuffer_add(b, "\r\n", 2);
		return;
	}
	size_t n = 0;
	for (int i = 0; i < 5; i++) {
		if (len[i] == 0)
			continue;       /* an absent piece is NULL: memcpy must not see it */
		memcpy(tmp + n, part[i], len[i]);
		n += len[i];
	}
	tmp[n++] = '\r';
	tmp[n++] = '\n';
	evbuffer_add(b, tmp, n);
}

void h1_field(struct evbuffer *b, const char *name, size_t nlen, const char *v, size_t vlen)
{
	h1_field3(b, name, nlen, v, vlen, NULL, 0, NULL, 0);
}

void h1_field_int(struct evbuffer *b, const char *name, size_t nlen, int64_t v)
{
	char num[24];
	h1_field(b, name, nlen, num, h1_fmt_int(num, v));
}


void h1_status_line(struct evbuffer *b, int status, const char *reason, size_t rlen)
{
	char line[300];
	size_t n = 9;
	memcpy(line, "HTTP/1.1 ", 9);
	n += h1_fmt_int(line + n, status);
	line[n++] = ' ';
	if (rlen > 256)
		rlen = 256;
	if (rlen > 0)
		memcpy(line + n, reason, rlen);
	n += rlen;
	line[n++] = '\r';
	line[n++] = '\n';
	evbuffer_add(b, line, n);
}

void h1_response_head(struct evbuffer *b, const struct resp_head *h, const char *std_reason,
                      enum h1_framing fr, enum h1_conn conn)
{
	if (h->reason)
		h1_status_line(b, h->status, h->reason, h->reason_len);
	else
		h1_status_line(b, h->status, std_reason, strlen(std_reason));
	for (int i = 0; i < h->nhdrs; i++) {
		const struct http_hdr *x = &h->hdrs[i];
		if (!x->hop)
			h1_field(b, x->name, x->nlen, x->value, x->vlen);
	}
	if (fr == H1_LENGTH)
		H1_FIELD_INT(b, "Content-Length", h->content_length);
	else if (fr == H1_CHUNKED)
		evbuffer_add(b, "Transfer-Encoding: chunked\r\n", 28);
	if (conn == H1_CONN_CLOSE)
		evbuffer_add(b, "Connection: close\r\n", 19);
	else if (conn == H1_CONN_KEEP_ALIVE)
		evbuffer_add(b, "Connection: keep-alive\r\n", 24);
	evbuffer_add(b, "\r\n", 2);
}

#define CHUNK_STEP ((size_t)1 << 30)

void h1_chunk_encode(struct evbuffer *out, struct evbuffer *src, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	char line[24];
	size_t len = 0, i;

	n = n < evbuffer_get_length(src) ? n : evbuffer_get_length(src);
	if (n == 0)             /* a zero-size chunk would end the body */
		return;
	for (i = sizeof(size_t) * 2; i-- > 0;)
		if (len > 0 || ((n >> (i * 4)) & 0xf) != 0)
			line[len++] = hex[(n >> (i * 4)) & 0xf];
	line[len++] = '\r';
	line[len++] = '\n';
	evbuffer_add(out, line, len);
	while (n > 0) {          /* evbuffer_remove_buffer() counts in int */
		size_t step = n < CHUNK_STEP ? n : CHUNK_STEP;
		if (evbuffer_remove_buffer(src, out, step) != (int)step)
			abort();        /* step was available: libevent broke its contract */
		n -= step;
	}
	evbuffer_add(out, "\r\n", 2);
}

void h1_chunk_last(struct evbuffer *out)
{
	evbuffer_add(out, "0\r\n\r\n", 5);
}
