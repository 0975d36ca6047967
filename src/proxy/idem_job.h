/*
 * idem_job: SPEC §6 enforcement for one request at this hop: name the request (scope and
 * fingerprint), claim its key, record the response that goes to the client (head fields,
 * body and trailers up to max_response), and settle the claim when the exchange ends — the
 * claim follows the last attempt (idem_disposition, which also knows §10's definite gRPC
 * codes). One job per enforced request; the exchange owns it. And the other way: a stored
 * response replayed to the client (idem_replay).
 */
#ifndef RG_IDEM_JOB_H
#define RG_IDEM_JOB_H

#include <stdbool.h>

#include "http/h1_parser.h"
#include "http/responder.h"
#include "idempotency/idempotency.h"

struct loop;
struct evbuffer;
struct idem_job;

/* Is this request enforced here: enabled, method listed, and a non-empty key? */
bool idem_job_applies(const struct cfg_idempotency *ic, const char *method, bool has_key);

/* Claim the key of REQ (BODY: its whole buffered body). FN gets the answer later, from the
 * loop; IDEM_CLAIMED makes the job the key's owner. NULL (with *ERR) when the store cannot be
 * had at all: answer 503 idempotency-store-unavailable. */
struct idem_job *idem_job_claim(struct loop *loop, const struct cfg_idempotency *ic,
                                const char *upstream, const struct http_head *req,
                                struct evbuffer *body, idem_claim_fn fn, void *arg,
                                const char **err);

bool idem_job_owns(const struct idem_job *j);

/* The response going to the client: its fields (our own markers are not stored), body bytes
 * (copied, DATA untouched) and trailer fields as relayed (pseudo-headers and
 * connection-specific fields are not stored). Only while the job owns the key. Body and
 * trailers together count against max_response: past it the response is relayed, not stored
 * (the key stays claimed until ttl). */
void idem_job_record_head(struct idem_job *j, const struct resp_head *h);
void idem_job_record_body(struct idem_job *j, struct evbuffer *data);
void idem_job_record_trailers(struct idem_job *j, const struct http_hdr *t, int n);

/* Settle the claim once (the exchange ends). LAST_STATUS: the last attempt's response status
 * (0: none); GRPC_STATUS: that response's grpc-status, from its trailers or from its head
 * for a Trailers-Only response (-1: not a gRPC response; a gRPC call whose response carried
 * none is GRPC_UNKNOWN, as its client reads it); REACHED: some attempt may have reached the
 * upstream; REFUSED: no attempt can have executed (each a connect-failure or an answer in
 * release_on, idem_not_executed) — except that a gRPC answer whose messages were relayed was
 * committed, whatever its code; COMPLETE: the relayed response went out whole.
 * idem_disposition() decides. Returns true when a response was stored. */
bool idem_job_settle(struct idem_job *j, int last_status, int grpc_status, bool reached,
                     bool refused, bool complete);

struct idem_replay {
	struct resp_head head;
	struct http_hdr fields[HTTP_MAX_HEADERS + 3];
	struct http_hdr trailers[HTTP_MAX_HEADERS];
	int ntrailers;
	size_t body_len;            /* the body bytes to send: 0 when the head says there is none */
};

/* A stored idempotent response (§6), with Idempotency-Replayed: true and
 * X-Retrygate-Attempts: 0 in its head, and its trailers (§10: gRPC's grpc-status) parsed into
 * TRAILERS. A response with trailers goes out as it was relayed, without a Content-Length,
 * the trailers after the body; one with neither body nor trailers whose head carries
 * grpc-status is gRPC Trailers-Only (head.end_stream); a 204 or 304 has no body. STORED stays
 * referenced. */
void idem_replay(struct idem_replay *m, const struct idem_response *stored);

/* Sends M (after idem_replay, and respond_request_id on its head) through RSP: the head,
 * M->body_len bytes of BODY (the stored body), then the trailers if any. end() is the
 * caller's. */
void idem_replay_send(const struct responder *rsp, const struct idem_replay *m,
                         const char *body);

/* Cancels a pending claim; settles nothing (call idem_job_settle first). */
void idem_job_free(struct idem_job *j);

#endif
