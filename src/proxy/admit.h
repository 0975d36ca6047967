/*
 * admit: what a request is, decided once from its head before anything is sent: its route
 * (SPEC §2), its deadline (§3), the facts the retry rules need (§4 rules 2 and 4: marked as a
 * retry, method class, idempotency key, gRPC, idempotent path), the refusals of §5/§6/§10
 * that need no upstream (404, 501 for gRPC to an HTTP/1 upstream, 400 bad-deadline, 504
 * deadline-exceeded, 413, 400 idempotency-key-required), and how its
 * body travels (buffered for replay, or streamed). Pure: head and config in, admission out.
 */
#ifndef RG_ADMIT_H
#define RG_ADMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policy/deadline.h"
#include "policy/retry.h"

struct cfg_listener;
struct cfg_route;
struct http_head;

enum body_mode {
	BODY_NONE,
	BODY_BUFFER,                    /* whole, before the first attempt: replayable */
	BODY_STREAM,                    /* to the upstream as it comes: never re-sent */
	BODY_TEE,                       /* to the upstream as it comes, and kept while it fits
	                                 * retry.max_body: replayable until then (a gRPC stream,
	                                 * SPEC §10, whose peer may wait for answers) */
};

struct admission {
	int status;                     /* > 0: refused with STATUS and REASON */
	const char *reason;
	bool close;                     /* the refusal closes the connection */
	bool too_late;                  /* refused for its deadline (rejected_total{deadline-exceeded}) */
	struct cfg_route *route;        /* NULL: no route */
	int64_t budget_us;              /* the deadline, from the head's arrival */
	bool dl_present[DL_NKINDS];     /* the deadline headers it carried (all are rewritten) */
	bool nested;                    /* arrived marked as a retry: one attempt, markers kept */
	enum method_class mclass;
	const char *key;                /* the idempotency header's value, or NULL when empty */
	size_t keylen;
	bool idem;                      /* §6 enforced at this hop */
	enum body_mode bmode;
	bool grpc;                      /* SPEC §10: HTTP/2 with a gRPC content-type; routed to
	                                 * an upstream without protocol: h2 it is refused 501
	                                 * not-implemented (trailers cannot cross HTTP/1.1) */
	bool idempotent_path;           /* the path without its query starts with one of the
	                                 * upstream's retry.idempotent_paths (any method): mclass
	                                 * is then MC_IDEMPOTENT too */
};

void admit_request(const struct cfg_listener *l, const struct http_head *r, struct admission *a);

/* A response that says a deeper retrygate already retried or refused (§4 rule 2). */
bool admit_response_nested(const struct http_head *h);

#endif
