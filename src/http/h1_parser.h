/*
 * h1_parser: HTTP/1.x message parsing on top of llhttp 9 (every lenient flag off), plus the checks
 * llhttp leaves to us (SPEC §5, §8). One struct http_msg parses one direction of one
 * connection, message after message. It never writes to a socket: the caller feeds it an
 * evbuffer and gets events back; decoded body bytes are moved into the caller's evbuffer, so
 * framing (Content-Length, chunked, chunk extensions, trailers) never leaks through.
 *
 * Request side: reject, don't repair. A refused head yields HTTP_ERROR with the status and
 * SPEC reason to answer (400 bad-request, 414 uri-too-long, 431 headers-too-large,
 * 501 not-implemented, 505 version-not-supported) and the precedence 400 > 414/431 > 501/505.
 * Response side: anything invalid is HTTP_ERROR (the caller answers 502 bad-response).
 */
#ifndef RG_H1_PARSER_H
#define RG_H1_PARSER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;

#define HTTP_MAX_HEADERS 100        /* more header lines: 431 */
#define HTTP_MAX_CHUNK_LINE 4096    /* chunk size + extensions: 400 past this */

struct http_limits {
	size_t max_header_bytes;        /* whole head incl. request line, CRLFs: 431 past this */
	size_t max_uri_bytes;           /* request target: 414 past this */
};

struct http_hdr {
	const char *name;               /* as received, not NUL-terminated-guaranteed: use lens */
	const char *value;              /* leading/trailing OWS stripped */
	uint32_t nlen, vlen;
	bool hop;                       /* hop-by-hop: Connection, what it lists, Keep-Alive,
	                                 * Proxy-Connection, TE, Trailer, Transfer-Encoding, Upgrade,
	                                 * Content-Length (framing is recomputed by the writer) */
};

struct http_head {
	/* request */
	char method[32];                /* NUL-terminated, e.g. "GET" */
	bool method_head;               /* HEAD */
	const char *target; size_t target_len;  /* as received */
	const char *path; size_t path_len;      /* origin-form: path?query; from an absolute-form
	                                         * target its path part ("/" if empty); "*" as is */
	const char *host; size_t host_len;      /* Host header value (authority, port included) */
	/* response */
	int status;
	const char *reason; size_t reason_len;
	/* both */
	int version;                    /* 10 or 11 */
	struct http_hdr *hdrs;
	int nhdrs;
	int64_t content_length;         /* -1: none */
	bool chunked;                   /* Transfer-Encoding ends in chunked */
	bool keep_alive;                /* per version and Connection tokens */
	bool expect_continue;           /* request: Expect: 100-continue */
	bool upgrade;                   /* Connection: upgrade + Upgrade present */
	bool body_until_close;          /* response: no length, body runs until EOF */
	bool end_stream;                /* HTTP/2 response: its HEADERS ended the stream (a gRPC
	                                 * Trailers-Only response): no body, no trailers follow */
};

enum http_kind { HTTP_REQUEST_KIND, HTTP_RESPONSE_KIND };

enum http_event {
	HTTP_NEED_MORE = 0,             /* everything available was consumed; feed more later */
	HTTP_HEAD,                      /* a head is complete: http_msg_head() */
	HTTP_BODY,                      /* some decoded body bytes were appended to BODY_OUT */
	HTTP_DONE,                      /* the message is complete; call http_msg_next() before
	                                 * feeding the next one (pipelined bytes stay in IN) */
	HTTP_ERROR,                     /* http_msg_error(); the connection must be closed */
};

struct http_msg;

struct http_msg *http_msg_new(enum http_kind kind, const struct http_limits *lim);
void http_msg_free(struct http_msg *m);

/* Response parsing needs to know the request: a HEAD request's response has no body, and
 * after a CONNECT/Upgrade a 101/2xx ends the HTTP stream. Call before feeding each response. */
void http_msg_expect(struct http_msg *m, bool request_was_head);

/* Consume bytes from IN (drained as consumed). Decoded body bytes go to BODY_OUT, at most
 * BODY_MAX bytes per call (backpressure: the caller passes the room it has). Returns one event;
 * call again to continue. After HTTP_HEAD the caller may stop feeding (e.g. to wait). */
enum http_event http_msg_feed(struct http_msg *m, struct evbuffer *in,
                              struct evbuffer *body_out, size_t body_max);

/* A head read straight from DATA, bytes just received while nothing waits in the evbuffer
 * http_msg_feed() reads (so the order of bytes stays): returns the bytes taken, never one past
 * the head; none unless a head is being read. What the head came to (complete, refused) is
 * what the next http_msg_feed() returns, whatever IN holds: the caller feeds on as usual. The
 * head's bytes skip the evbuffer (a chain allocated, peeked at, drained, freed). */
size_t http_msg_take(struct http_msg *m, const char *data, size_t len);

/* The peer closed. For a response whose body runs until close: HTTP_DONE. Otherwise, if a
 * message was under way: HTTP_ERROR (truncated). If none was: HTTP_NEED_MORE. */
enum http_event http_msg_eof(struct http_msg *m);

/* After HTTP_DONE (or after a 1xx HTTP_HEAD): reset for the next message. */
void http_msg_next(struct http_msg *m);

/* Valid from HTTP_HEAD until http_msg_next()/free. */
const struct http_head *http_msg_head(const struct http_msg *m);

/* Bytes of the current head received so far (0 before the first byte of a message). */
size_t http_msg_head_bytes(const struct http_msg *m);

/* After HTTP_ERROR: the status to answer (request side) and the SPEC reason, plus a detail for
 * the log (e.g. "obs-fold in header line"). */
void http_msg_error(const struct http_msg *m, int *status, const char **reason,
                    const char **detail);

/* Methods served (RFC 9110, PATCH, RFC 4918): METH_OK; CONNECT is recognised to be refused
 * (METH_CONNECT); anything else is METH_OTHER (501 not-implemented). */
enum { METH_OK, METH_CONNECT, METH_OTHER };
int http_method_class(const char *s, size_t n);

/* First header named NAME (case-insensitive), or NULL; *len gets its value's length. */
const char *http_head_get(const struct http_head *h, const char *name, size_t *len);
/* How many header lines are named NAME. */
int http_head_count(const struct http_head *h, const char *name);

#endif
