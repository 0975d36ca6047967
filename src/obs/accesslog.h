/*
 * accesslog: one JSON line per request (access_log: "off" | "stdout" | a path), buffered per
 * worker and written in whole lines; SIGUSR1 reopens the file (log rotation).
 *
 * struct access_rec is filled along the request's way without copying: it points into the
 * request head, which outlives the exchange's call to accesslog_write().
 */
#ifndef RG_ACCESSLOG_H
#define RG_ACCESSLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policy/retry.h"

struct http_head;
struct cfg_route;

#define ACCESS_MAX_ATTEMPTS 8

struct access_rec {
	const struct http_head *req;
	const char *reqid;
	uint64_t sid;
	const char *peer;
	const char *route_host, *route_prefix, *upstream;
	int status;
	int attempts;
	enum refusal refused;
	const char *reason;             /* retrygate's own reason, if it answered itself */
	struct {
		const char *ep;
		const char *outcome;
		int status;
		const char *fault;
		int grpc_status;            /* -1: none (not gRPC, or no grpc-status seen) */
		bool hedge, won;            /* SPEC §14: sent as a hedge; its response was relayed */
	} att[ACCESS_MAX_ATTEMPTS];
	int natt;
	int cur;                        /* the try the setters below address: the last one added,
	                                 * or the one access_select() named (hedges run together) */
	int64_t deadline_given_us, deadline_left_us, duration_us, body_bytes;
	const char *key; size_t keylen;
	bool client_abort;
	bool ok_response;               /* an upstream response was relayed */
	bool non_idempotent;            /* not a safe method, path not in retry.idempotent_paths */
	enum outcome last_out;
	int grpc_status;                /* a gRPC call: the code its client read (grpc.h); -1: HTTP */
	bool grpc_answered;             /* that code is an upstream's grpc-status, relayed */
	bool not_executed;              /* ... which says the call did not run (release_on) */
	const char *held_ep;            /* the retry was refused for this endpoint's hold ... */
	int64_t held_ms;                /* ... which had this long left */
};

/* REQ may be NULL: a request refused before its head was understood (malformed, oversized,
 * header timeout) gets a line with no method, path or route, outcome "failed". */
void access_begin(struct access_rec *r, uint64_t sid, const char *peer, const struct http_head *req,
                  const char *reqid);
void access_set_route(struct access_rec *r, const struct cfg_route *route, const char *upstream);
void access_set_key(struct access_rec *r, const char *key, size_t len);
void access_add_attempt(struct access_rec *r, const char *ep);
/* SPEC §14: the next setters address try IDX (0-based, as added); a hedge; the winner */
void access_select(struct access_rec *r, int idx);
void access_add_hedge(struct access_rec *r, const char *ep);
void access_set_won(struct access_rec *r, int idx);
void access_set_outcome(struct access_rec *r, const char *outcome);
void access_set_status(struct access_rec *r, int status);
/* The last attempt's SPEC §11 fault kind ("abort", ...): the line names it in that try. */
void access_set_fault(struct access_rec *r, const char *kind);
/* The retry was refused (retry_refused) because endpoint EP is held for MS more
 * milliseconds by another answer's Retry-After or pushback: the line says "held":
 * {"endpoint": EP, "ms_left": MS}. */
void access_set_held(struct access_rec *r, const char *ep, int64_t ms);
/* The grpc-status (0..16, grpc.h) of the attempt access_add_attempt began, from its
 * Trailers-Only head or its trailers (SPEC §10): that try gets "grpc_status": CODE and
 * "grpc_status_name": "unavailable" beside its "status". A code outside 0..16 is ignored. */
void access_set_grpc_status(struct access_rec *r, int code);

/* Why the request's outcome is unknown — it may have executed (SPEC §6, §10, §12) — or NULL.
 * A non-idempotent request with attempts is unknown when its last attempt ended in a reset or
 * a timeout ("reset", "timeout"), or, for a gRPC call, when the grpc-status relayed to its
 * client is one §6 does not take as definite (its name: "unavailable", ...) and not one that
 * says the call did not run (idempotency.release_on: not_executed). The one decision
 * behind both the log's outcome and the reconciliation queue's record. */
const char *access_unknown_cause(const struct access_rec *r);

/* "unknown" (access_unknown_cause), else "ok" — for a gRPC call when its client read OK, for
 * HTTP an upstream response below 500 — or "failed". */
const char *access_outcome(const struct access_rec *r);

int accesslog_open(const char *spec);    /* 0 or -1 (errno set) */
/* A reload's new access_log: the new target is opened first; on failure (-1, errno set) the
 * old one stays. */
int accesslog_switch(const char *spec);
void accesslog_reopen(void);
void accesslog_close(void);
void accesslog_write(const struct access_rec *r);
/* The line of a request a client codec refused before any exchange (no head to name it): a
 * new request id from RNG, STATUS and REASON. */
void accesslog_write_refusal(uint64_t sid, const char *peer, uint64_t *rng, int status,
                             const char *reason);
void accesslog_flush(void);

#endif
