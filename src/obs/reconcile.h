/*
 * reconcile: the queue of unknown outcomes (SPEC §12). Every request whose outcome is unknown
 * (a non-idempotent request whose last attempt ended in a reset or a timeout) is recorded once,
 * in memory, shared by all workers (a mutex: only unknown outcomes pass here, off the hot
 * path), bounded by reconcile.keep (the oldest dropped), read by GET /unknown and settled by
 * POST /unknown/ack. With reconcile.redis, reconcile_publish.c appends each record to a Redis
 * stream; a record stays in memory whether or not it reached the stream.
 */
#ifndef RG_RECONCILE_H
#define RG_RECONCILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;

/* One unknown outcome, as the exchange knows it; every string is copied (and truncated to a
 * bounded size) by reconcile_record. KEY NULL: no Idempotency-Key. */
struct reconcile_rec {
	const char *id;                 /* X-Request-Id */
	const char *upstream, *method;
	const char *path;
	size_t path_len;
	const char *key;
	size_t key_len;
	int attempts;
	const char *last_outcome;       /* "reset" | "timeout" */
	const char *endpoint;           /* of the last attempt */
};

/* Any thread. */
void reconcile_record(const struct reconcile_rec *r);
/* Main thread, at start and on every reload: the bound (the oldest records beyond it go). */
void reconcile_set_keep(int64_t keep);

/* GET /unknown: a JSON array, newest first; UPSTREAM non-NULL: only its records. */
void reconcile_render(struct evbuffer *out, const char *upstream);
/* POST /unknown/ack: remove every record with ID; false when there was none. */
bool reconcile_ack(const char *id);
/* At exit. */
void reconcile_clear(void);

/* ------------------------------------------------------------------ for the publisher */

/* One record as the Redis stream gets it: "field", "value" pairs, the strings inside the
 * record (valid until reconcile_publish_done for its seq). */
#define RECONCILE_FIELDS 9
struct reconcile_fields {
	uint64_t seq;
	const char *argv[RECONCILE_FIELDS * 2];
	size_t lens[RECONCILE_FIELDS * 2];
	int n;
};

/* Under the queue's lock: calls FN for up to MAX records not yet published nor in flight,
 * oldest first, marking each in flight. FN must not call back into reconcile. Returns how
 * many. */
int reconcile_take_unpublished(int max, void (*fn)(void *arg, const struct reconcile_fields *f),
                               void *arg);
/* The XADD of record SEQ ended: OK, or not (the record waits for the next try). A record
 * acked or dropped meanwhile is simply gone. */
void reconcile_publish_done(uint64_t seq, bool ok);
/* Records waiting to be published (none in flight). */
bool reconcile_have_unpublished(void);
/* Every record in flight goes back to waiting (the connection that carried it is gone). */
void reconcile_unflight_all(void);
/* A failed publish attempt, for retrygate_reconcile_publish_errors_total. */
void reconcile_count_error(void);

#endif
