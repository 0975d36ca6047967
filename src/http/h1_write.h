/*
 * h1_write: HTTP/1.1 head lines written with memcpy into one stack buffer and one
 * evbuffer_add each, never printf: these run for every request and every response, and
 * printf-style formatting was a visible share of the per-request CPU; and the chunked body
 * writer, the framing of a body of unknown length. Pure serialisation:
 * no policy (which fields go out is the caller's decision).
 */
#ifndef RG_H1_WRITE_H
#define RG_H1_WRITE_H

#include <stddef.h>
#include <stdint.h>

struct evbuffer;

/* Decimal digits of V into P (no NUL); returns the length (at most 20). */
size_t h1_fmt_int(char *p, int64_t v);

/* "name: v1v2v3\r\n" (absent pieces have length 0 and may be NULL) */
void h1_field3(struct evbuffer *b, const char *name, size_t nlen, const char *v1, size_t l1,
               const char *v2, size_t l2, const char *v3, size_t l3);
void h1_field(struct evbuffer *b, const char *name, size_t nlen, const char *v, size_t vlen);
void h1_field_int(struct evbuffer *b, const char *name, size_t nlen, int64_t v);

#define H1_FIELD_STR(b, lit, v, vlen) h1_field((b), lit, sizeof(lit) - 1, (v), (vlen))
#define H1_FIELD_INT(b, lit, v) h1_field_int((b), lit, sizeof(lit) - 1, (v))

/* Append "<hex>\r\n<data>\r\n" for N bytes of SRC (moved, not copied), or the last chunk. */
void h1_chunk_encode(struct evbuffer *out, struct evbuffer *src, size_t n);
void h1_chunk_last(struct evbuffer *out);

/* "HTTP/1.1 STATUS REASON\r\n" (the reason is cut at 256 bytes) */
void h1_status_line(struct evbuffer *b, int status, const char *reason, size_t rlen);

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
