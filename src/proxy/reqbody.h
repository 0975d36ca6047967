/*
 * reqbody: the request body on its way upstream. Buffered whole before the first attempt, for
 * replay (up to retry.max_body; up to idempotency.max_body when this hop enforces keys, since
 * the fingerprint hashes it), or streamed to the attempt in flight when it is too large — and
 * then never re-sent. It counts what arrived against the limits and says when the body went
 * over one, or outgrew replay (a chunked body gets there only as it arrives).
 */
#ifndef RG_REQBODY_H
#define RG_REQBODY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/admit.h"

struct attempt;
struct evbuffer;

struct reqbody {
	enum body_mode mode;
	struct evbuffer *buf;           /* the buffered body (BODY_BUFFER), the teed one kept
	                                 * for replay (BODY_TEE: the attempts read it in place,
	                                 * reqbody_ref), or bytes that came before a streaming
	                                 * attempt started */
	int64_t len;                    /* bytes received so far */
	bool present;                   /* the request has a body at all */
	bool done;                      /* its last byte arrived */
};

enum reqbody_event {
	RB_TAKEN,
	RB_OVER_LIMIT,                  /* over limits.max_body, or over the strict keep limit */
	RB_OUTGREW,                     /* no longer replayable: now streamed; start the attempt */
};

/* BUF: an empty evbuffer (taken). */
void reqbody_init(struct reqbody *b, struct evbuffer *buf, bool present, enum body_mode mode);

/* DATA arrived (all of it is taken). LIMIT: limits.max_body (0: none); KEEP_MAX: the most kept
 * for replay; STRICT: past KEEP_MAX is over the limit instead of a switch to streaming. TO: the
 * attempt a streamed body goes to, or NULL. */
enum reqbody_event reqbody_take(struct reqbody *b, struct evbuffer *data, int64_t limit,
                                int64_t keep_max, bool strict, struct attempt *to);
/* The last byte arrived. */
void reqbody_end(struct reqbody *b, struct attempt *to);
/* What an attempt reads in place (its body, referenced): the buffered body, or the teed
 * body kept for replay, which grows while it streams (HTTP/2 only: a gRPC call's); NULL
 * when every byte is sent to it. */
struct evbuffer *reqbody_ref(const struct reqbody *b);
/* A streaming attempt TO just started: what arrived so far goes to it. */
void reqbody_stream_to(struct reqbody *b, struct attempt *to);
/* How many bytes the body takes now: 0 stops reading the client (a streaming attempt's
 * output is full, or none is ready). */
size_t reqbody_room(const struct reqbody *b, const struct attempt *to);

/* SPEC §4 rule 5: no body, or one fully buffered and <= MAX. */
static inline bool reqbody_replayable(const struct reqbody *b, int64_t max)
{
	return b->mode != BODY_STREAM && b->len <= max;    /* BODY_TEE: while it fits */
}
/* The connection cannot carry another request: the body was not read whole, unless it still
 * streams to the upstream (OURS: retrygate answers itself, nothing will read the rest). */
static inline bool reqbody_left_unread(const struct reqbody *b, bool ours)
{
	return b->present && !b->done && (ours || b->mode != BODY_STREAM);
}

#endif
