/*
 * respond: every response retrygate makes itself, built in one place as a protocol-neutral
 * resp_head + body that the client codec frames: the errors of SPEC §5 (a small JSON body
 * {"error":"REASON","upstream":"NAME","attempts":N} with X-Retrygate-Reason and
 * X-Retrygate-Attempts), and the fields of a relayed upstream response with this hop's
 * markers (§4). The replay of a stored idempotent response (§6) is proxy/idem_job's.
 *
 * The structs hold the strings the resp_head points into: keep them alive (and in place)
 * until the head was written.
 */
#ifndef RG_RESPOND_H
#define RG_RESPOND_H

#include <stdbool.h>
#include <stddef.h>

#include "http/h1_parser.h"
#include "http/responder.h"

const char *respond_status_text(int status);

/* F names NAME (a literal or other lasting string) with VALUE of VLEN bytes, not hop-by-hop. */
void respond_field(struct http_hdr *f, const char *name, const char *value, size_t vlen);

struct made_response {
	struct resp_head head;
	struct http_hdr fields[10];     /* the most a made response has (gRPC: 7), and room for
	                                 * respond_request_id's X-Request-Id */
	char attempts[24];
	char code[8];                   /* gRPC: the grpc-status */
	char pushback[24];              /* gRPC: grpc-retry-pushback-ms */
	char body[512];
	size_t body_len;
};

/* A §5 error. REFUSED: this hop's X-Retrygate-Retry-Refused reason, or NULL. RETRY_AFTER: a
 * Retry-After value (503 overloaded), or NULL. CLOSE: the connection closes after it. */
void respond_error(struct made_response *m, int status, const char *reason, const char *upstream,
                   int attempts, const char *refused, const char *retry_after, bool close);

/* The same error to a gRPC request (SPEC §10): :status 200, content-type application/grpc,
 * Trailers-Only (head.end_stream), grpc-status from grpc_status_for_reason(REASON),
 * grpc-message REASON, X-Retrygate-Reason, X-Retrygate-Attempts, X-Retrygate-Retry-Refused
 * when REFUSED, grpc-retry-pushback-ms 1000 for overloaded. No body (body_len 0, no length
 * field). UPSTREAM is not shown: a gRPC client reads only the status and the message.
 * head.close is false: where §5 closes, the caller sets it (the HTTP/2 responder then resets
 * a stream the client is still sending, after the response). */
void respond_grpc_error(struct made_response *m, const char *reason, const char *upstream,
                        int attempts, const char *refused);

struct relayed_head {
	struct resp_head head;
	struct http_hdr fields[HTTP_MAX_HEADERS + 5];
	char num[24];
};

/* Upstream response UP as it goes to the client: hop-by-hop fields dropped, the upstream's
 * X-Retrygate-Attempts replaced by ours (ATTEMPTS), its X-Retrygate-Retry-Refused passed
 * through unless this hop refused a retry itself (REFUSED non-NULL: ours replaces it). TUNNEL:
 * a 101 to an Upgrade request, which also carries Connection: upgrade and its Upgrade token.
 * UP stays referenced. */
void respond_relayed(struct relayed_head *r, const struct http_head *up, int attempts,
                     const char *refused, bool close, bool tunnel);

/* Send a whole response (head, then BODY of LEN bytes) through RSP. */
void respond_send(const struct responder *rsp, const struct resp_head *h, const char *body,
                  size_t len);

/* Every response to a request carries its X-Request-Id (the client's, else the one retrygate
 * made and sent upstream), so a caller that got a 502 can find its record (SPEC §12): any
 * X-Request-Id already in H (from the upstream, or a stored response) is replaced by REQID.
 * FIELDS is H's field array (H->hdrs), CAP its length; REQID stays referenced. */
void respond_request_id(struct resp_head *h, struct http_hdr *fields, int cap, const char *reqid);

#endif
