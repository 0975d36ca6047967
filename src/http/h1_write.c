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
	if (v >= 0 && v < 10) {        /* attempt counts, most lengths of small bodies */
		p[0] = (char)('0' + v);
		return 1;
	}
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

void h1_out_spill(struct h1_out *o, const void *p, size_t len)
{
	if (o->n > 0)
		evbuffer_add(o->b, o->buf, o->n);
	o->n = 0;
	if (len > sizeof(o->buf)) {
		evbuffer_add(o->b, p, len);
		return;
	}
	memcpy(o->buf, p, len);
	o->n = len;
}

void h1_out_end(struct h1_out *o)
{
	if (o->n > 0)
		evbuffer_add(o->b, o->buf, o->n);
	o->n = 0;
}

void h1_field3(struct h1_out *o, const char *name, size_t nlen, const char *v1, size_t l1,
               const char *v2, size_t l2, const char *v3, size_t l3)
{
	h1_out_add(o, name, nlen);
	h1_out_add(o, ": ", 2);
	h1_out_add(o, v1, l1);
	h1_out_add(o, v2, l2);
	h1_out_add(o, v3, l3);
	h1_out_add(o, "\r\n", 2);
}

void h1_field(struct h1_out *o, const char *name, size_t nlen, const char *v, size_t vlen)
{
	h1_field3(o, name, nlen, v, vlen, NULL, 0, NULL, 0);
}

void h1_field_int(struct h1_out *o, const char *name, size_t nlen, int64_t v)
{
	char num[24];
	h1_field(o, name, nlen, num, h1_fmt_int(num, v));
}

void h1_status_line(struct h1_out *o, int status, const char *reason, size_t rlen)
{
	char num[24];
	size_t nlen;
	H1_OUT_LIT(o, "HTTP/1.1 ");
	if (status >= 100 && status <= 999) {   /* every status we write: no division loop */
		num[0] = (char)('0' + status / 100);
		num[1] = (char)('0' + status / 10 % 10);
		num[2] = (char)('0' + status % 10);
		nlen = 3;
	} else {
		nlen = h1_fmt_int(num, status);
	}
	h1_out_add(o, num, nlen);
	h1_out_add(o, " ", 1);
	h1_out_add(o, reason, rlen > 256 ? 256 : rlen);
	h1_out_add(o, "\r\n", 2);
}

void h1_response_head(struct evbuffer *b, const struct resp_head *h, const char *std_reason,
                      enum h1_framing fr, enum h1_conn conn)
{
	struct h1_out o;
	h1_out_begin(&o, b);
	if (h->reason)
		h1_status_line(&o, h->status, h->reason, h->reason_len);
	else
		h1_status_line(&o, h->status, std_reason, strlen(std_reason));
	for (int i = 0; i < h->nhdrs; i++) {
		const struct http_hdr *x = &h->hdrs[i];
		if (!x->hop)
			h1_field(&o, x->name, x->nlen, x->value, x->vlen);
	}
	if (fr == H1_LENGTH)
		H1_FIELD_INT(&o, "Content-Length", h->content_length);
	else if (fr == H1_CHUNKED)
		H1_OUT_LIT(&o, "Transfer-Encoding: chunked\r\n");
	if (conn == H1_CONN_CLOSE)
		H1_OUT_LIT(&o, "Connection: close\r\n");
	else if (conn == H1_CONN_KEEP_ALIVE)
		H1_OUT_LIT(&o, "Connection: keep-alive\r\n");
	H1_OUT_LIT(&o, "\r\n");
	h1_out_end(&o);
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
