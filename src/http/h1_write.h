/*
 * h1_write: HTTP/1.1 heads written with memcpy into one stack buffer and one evbuffer_add
 * per head, never printf: these run for every request and every response, and printf-style
 * formatting, then the evbuffer calls, were a visible share of the per-request CPU; and the chunked body
 * writer, the framing of a body of unknown length. Pure serialisation:
 * no policy (which fields go out is the caller's decision).
 */
#ifndef RG_H1_WRITE_H
#define RG_H1_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct evbuffer;

/* Decimal digits of V into P (no NUL); returns the length (at most 20). */
size_t h1_fmt_int(char *p, int64_t v);

/* A head being written: its bytes gather in BUF (on the writer's stack) and go to the evbuffer
 * in one evbuffer_add at h1_out_end(). Each evbuffer_add costs a chain check and a run of the
 * buffer's callbacks (a stream's output schedules its send from one), ~20 of them per head.
 * A head that outgrows BUF is appended in pieces, the same bytes in the same order. */
#define H1_OUT_BUF 2048
struct h1_out {
	struct evbuffer *b;
	size_t n;
	char buf[H1_OUT_BUF];
};

static inline void h1_out_begin(struct h1_out *o, struct evbuffer *b)
{
	o->b = b;
	o->n = 0;
}

void h1_out_spill(struct h1_out *o, const void *p, size_t len);

static inline void h1_out_add(struct h1_out *o, const void *p, size_t len)
{
	if (len <= sizeof(o->buf) - o->n) {
		if (len)        /* an absent piece may be NULL: memcpy must not see it */
			memcpy(o->buf + o->n, p, len);
		o->n += len;
	} else {
		h1_out_spill(o, p, len);
	}
}

#define H1_OUT_LIT(o, lit) h1_out_add((o), lit, sizeof(lit) - 1)

/* Append what was gathered to the evbuffer (once). */
void h1_out_end(struct h1_out *o);

/* "name: v1v2v3\r\n" (absent pieces have length 0 and may be NULL) */
void h1_field3(struct h1_out *o, const char *name, size_t nlen, const char *v1, size_t l1,
               const char *v2, size_t l2, const char *v3, size_t l3);
void h1_field(struct h1_out *o, const char *name, size_t nlen, const char *v, size_t vlen);
void h1_field_int(struct h1_out *o, const char *name, size_t nlen, int64_t v);

#define H1_FIELD_STR(o, lit, v, vlen) h1_field((o), lit, sizeof(lit) - 1, (v), (vlen))
#define H1_FIELD_INT(o, lit, v) h1_field_int((o), lit, sizeof(lit) - 1, (v))

/* Append "<hex>\r\n<data>\r\n" for N bytes of SRC (moved, not copied), or the last chunk. */
void h1_chunk_encode(struct evbuffer *out, struct evbuffer *src, size_t n);
void h1_chunk_last(struct evbuffer *out);

/* "HTTP/1.1 STATUS REASON\r\n" (the reason is cut at 256 bytes) */
void h1_status_line(struct h1_out *o, int status, const char *reason, size_t rlen);

struct resp_head;

enum h1_framing {
	H1_NO_BODY,                     /* 1xx, 204, 304, a HEAD response without a length */
	H1_LENGTH,                      /* Content-Length: h->content_length */
	H1_CHUNKED,                     /* Transfer-Encoding: chunked */
	H1_UNTIL_CLOSE,                 /* HTTP/1.0 client, length unknown: the close ends it */
};
enum h1_conn { H1_CONN_NONE, H1_CONN_CLOSE, H1_CONN_KEEP_ALIVE };

/* A whole response head: status line (H's reason, else STD_REASON), H's fields (hop-marked
 * ones skipped), the framing field, the connection field, the blank line. */
void h1_response_head(struct evbuffer *b, const struct resp_head *h, const char *std_reason,
                      enum h1_framing fr, enum h1_conn conn);

#endif
