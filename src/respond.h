/*
 * reply: the responses retrygate makes itself (SPEC §5): a small JSON body
 * {"error":"REASON","upstream":"NAME","attempts":N} with X-Retrygate-Reason and
 * X-Retrygate-Attempts headers.
 */
#ifndef RG_REPLY_H
#define RG_REPLY_H

#include <stdbool.h>

struct evbuffer;

const char *reply_status_text(int status);

/* EXTRA: more header lines, each ending in CRLF, or NULL. CLOSE adds Connection: close;
 * KEEP_ALIVE_10 adds Connection: keep-alive (an HTTP/1.0 client that asked for it). */
void reply_error(struct evbuffer *out, int status, const char *reason, const char *upstream,
                 int attempts, bool close, bool keep_alive_10, const char *extra);
/* The same answer to a HEAD request: the same head (Content-Length included), no content
 * (RFC 9110 §9.3.2), so a keep-alive client stays in step. */
void reply_error_head(struct evbuffer *out, int status, const char *reason, const char *upstream,
                      int attempts, bool close, bool keep_alive_10, const char *extra);

#endif
