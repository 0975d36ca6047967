/*
 * idempotency: the store behind SPEC §6 — who owns an Idempotency-Key, and what it produced.
 *
 * A request is named by a struct idem_key: `scope` (idem_scope: upstream, the scope header
 * values and the key, hashed) picks the record; `fp` (idem_fingerprint: method, path with
 * query, Content-Type, body hash) says whether a repeat is the same request. A record moves:
 *
 *   (none)  --idem_claim------------> CLAIMED(fp)            for lock_timeout
 *   CLAIMED --idem_complete---------> DONE(fp, response)     for ttl  (final status < 500, stored)
 *                                                                     (gRPC: a definite code)
 *   CLAIMED --idem_keep_claimed-----> KEPT(fp)               for ttl  (response too large to store)
 *   CLAIMED --idem_release----------> (none)                 (provably never executed: nothing
 *                                                                     reached the upstream, or
 *                                                                     it refused (release_on))
 *   CLAIMED --lock_timeout passes---> (none)                 (outcome unknown: claimable again)
 *
 * A claim on an existing record answers MISMATCH when fp differs (whatever the state, so a
 * different request under a key in progress gets 422, not 409), else REPLAY for DONE and
 * IN_PROGRESS for CLAIMED or KEPT. complete/keep/release only act on the CLAIMED(fp) record of
 * the same fp, or on no record at all (the claim lapsed and nobody took it: storing the outcome
 * then still spares a repeat a second execution); they never overwrite another request's claim
 * or an outcome already recorded. idem_disposition() says which of them applies.
 *
 * Backends, by `idempotency.store`:
 *  - "memory": one table per process, shared by every worker (mutex), records expire on their
 *    own clock; memory is capped (idem_memory_set_limit): past the cap a new claim is
 *    UNAVAILABLE (fail closed) and a response that does not fit is kept as KEPT, never lost
 *    into a second execution. Expired records are dropped as claims pass by (a few buckets
 *    per call) and by idem_store_sweep().
 *  - "redis://...": one async hiredis connection per (URL, event_base), never blocking the
 *    loop (a host name is resolved with the evdns base given). Each operation is one EVAL,
 *    atomic on the server; records live under "retrygate:idem:<hex scope>" with the expiry
 *    as the key's PX (the user needs GET, SET, DEL, EVAL). The connection reconnects with
 *    backoff (50 ms doubling to 2 s) after any error; meanwhile, or when a command sees no
 *    reply within the timeout (idem_redis_set_timeout), claims answer UNAVAILABLE and the
 *    proxy fails closed (503). A claim that timed out may still have been made on the
 *    server: a repeat then gets 409 until lock_timeout, never a second execution.
 *
 * Threads: idem_store_get and the release functions are thread-safe. A struct idem_store
 * belongs to the event_base it was got for: use it, and its ops, only on that base's thread.
 */
#ifndef RG_IDEMPOTENCY_H
#define RG_IDEMPOTENCY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "idempotency/idem_types.h"
#include "policy/retry.h"

struct event_base;
struct evdns_base;
struct evbuffer;

/* "claimed" "replay" "mismatch" "in-progress" "unavailable": for logs */
const char *idem_result_name(enum idem_result r);

/* ------------------------------------------------------------------ naming a request */

/* The record name: SHA-256 over a length-prefixed encoding of the upstream name, the values
 * of the configured scope_headers in their configured order (values[i] NULL: header absent,
 * which differs from an empty value) and the key, so no two different inputs share an
 * encoding (("ab","c") is not ("a","bc")). Nothing of the key or of an Authorization value is
 * stored in clear. A header that occurs several times is the caller's to join (", "). */
void idem_scope(unsigned char out[32], const char *upstream,
                const char *const *values, const size_t *value_lens, int nvalues,
                const char *key, size_t key_len);

/* The request identity: SHA-256 over method, request target (path with query, as received),
 * Content-Type (NULL: absent, which differs from empty) and the SHA-256 of the body (NULL:
 * empty). The body buffer is only read; libevent's peek API wants it non-const. */
void idem_fingerprint(unsigned char out[32], const char *method, size_t method_len,
                      const char *target, size_t target_len,
                      const char *ctype, size_t ctype_len, struct evbuffer *body);

/* ------------------------------------------------------------------ what to do at the end */

enum idem_after {
	IDEM_AFTER_STORE,   /* idem_complete(): the response is stored for ttl */
	IDEM_AFTER_KEEP,    /* idem_keep_claimed(): stays claimed for ttl, a repeat gets 409 */
	IDEM_AFTER_EXPIRE,  /* nothing: outcome unknown, the claim lapses at lock_timeout */
	IDEM_AFTER_RELEASE, /* idem_release(): nothing executed, a repeat may go now */
};

/* SPEC §6 release_on and §4 rule 4: an attempt's outcome that cannot have executed — OUT is a
 * connect-failure (nothing was sent), or OUT_STATUS answered with a status or gRPC code in
 * c->release_on (GRPC_STATUS: the grpc-status of a gRPC answer, -1 for HTTP; a gRPC call
 * answered with another :status than 200 is judged by the status). Any other outcome (a
 * reset, a timeout, another answer, none yet) may have executed. */
bool idem_not_executed(const struct cfg_idempotency *c, enum outcome out, int status,
                       int grpc_status);

/* SPEC §6 "the claim follows the last attempt", its definite refusals, and §10's definite gRPC
 * answers, as a pure function:
 *   last_status  the last attempt's final response status; 0 when it had none (connect
 *                failure, reset, timeout, cancelled) or no attempt was made;
 *   grpc_status  that response's grpc-status (from its trailers, or its head for a
 *                Trailers-Only response), or -1 when it is not a gRPC response;
 *   reached      whether any attempt's request may have reached the upstream (every outcome
 *                but connect-failure and "never sent");
 *   refused      every attempt's outcome was one that cannot have executed
 *                (idem_not_executed: connect-failures and release_on answers);
 *   stored_len   the bytes to store, body plus trailers, when they were fully buffered; -1
 *                when not (streamed past max_response);
 * RELEASE when refused, or when no response and !reached; STORE when 0 < last_status < 500,
 * the answer is definite and 0 <= stored_len <= max_response; KEEP when 0 < last_status <
 * 500 and definite otherwise; else EXPIRE (a 5xx, or reset/timeout: even if an earlier
 * attempt's response was relayed). A response is definite unless it is gRPC (grpc_status >=
 * 0) with :status 200 and a code grpc_definite() refuses (UNAVAILABLE, INTERNAL, ...): that
 * outcome is unknown exactly as a 5xx, EXPIRE. A gRPC call answered with another :status is
 * an HTTP outcome (§10), judged by the status alone. */
enum idem_after idem_disposition(int last_status, int grpc_status, bool reached, bool refused,
                                 int64_t stored_len, int64_t max_response);

/* ------------------------------------------------------------------ the store */

struct idem_store;
struct idem_op;


/* The store for this upstream's idempotency block, on this event_base (required, for both
 * backends: results are delivered from its loop). Cached by (c->store, base), so every call
 * with the same URL on the same base returns the same handle, across reloads too; the lookup
 * walks a short list under a process-wide mutex, cheap but better kept per worker than done
 * per request. The redis connection starts at the first get. A redis host that is a name, not
 * an IP literal, is resolved on DNS, which is required then; NULL is fine otherwise. Call it
 * on BASE's thread (or before its loop runs). Returns NULL only for a name without a DNS
 * base, with *err set to a static message. */
struct idem_store *idem_store_get(const struct cfg_idempotency *c, struct event_base *base,
                                  struct evdns_base *dns, const char **err);

/* Claim KEY: atomically create CLAIMED(fp) expiring after LOCK_TIMEOUT_US unless a live record
 * exists, and judge against that record. FN is called exactly once, always later from BASE's
 * loop (never before idem_claim returns, whichever backend), unless idem_cancel(op) comes
 * first. The op is owned by the store and gone once FN has been called. */
struct idem_op *idem_claim(struct idem_store *s, const struct idem_key *key,
                           int64_t lock_timeout_us, idem_claim_fn fn, void *arg);

/* Stop waiting for OP: FN will not be called. The claim itself may still happen (the
 * command may already be on its way): an unreported claim lapses at lock_timeout like any
 * unknown outcome. Only before FN was called. */
void idem_cancel(struct idem_op *op);

/* Record the final response of the request that claimed KEY, for TTL_US (see the top for
 * when it applies). Fire and forget: a failure is logged, and the claim then lapses at
 * lock_timeout. The policy (status < 500, body <= max_response) is idem_disposition's. */
void idem_complete(struct idem_store *s, const struct idem_key *key,
                   const struct idem_response *resp, int64_t ttl_us);

/* The response was relayed but cannot be stored: keep KEY claimed for TTL_US, so a repeat
 * gets IDEM_IN_PROGRESS (409), never a second execution. Fire and forget. */
void idem_keep_claimed(struct idem_store *s, const struct idem_key *key, int64_t ttl_us);

/* Give KEY back (only if it is still this fp's claim): no attempt executed (none reached the
 * upstream, or it refused each), so a repeat may proceed at once instead of waiting out
 * lock_timeout. Fire and forget. */
void idem_release(struct idem_store *s, const struct idem_key *key);

/* Drop every expired record of the memory store now (a no-op for redis, which expires keys
 * itself). Optional: claims already sweep a few buckets each; a periodic call (say every
 * 10 s, from any one thread) also frees memory while no claims come. */
void idem_store_sweep(void);

/* How long a redis claim waits for its reply, and a connection for TCP connect, before the
 * store gives up on the connection (UNAVAILABLE, reconnect): every process-wide handle, for
 * claims and connects started afterwards. 0: IDEM_REDIS_TIMEOUT_US (1 s). Thread-safe. */
void idem_redis_set_timeout(int64_t us);

/* The memory store's cap in bytes (0: IDEM_MEMORY_DEFAULT_LIMIT), and its current size. */
void idem_memory_set_limit(size_t bytes);
void idem_memory_stats(size_t *records, size_t *bytes);

/* Free every store handle of BASE, with its redis connection and pending ops (their FN is not
 * called). Call it on BASE's thread while BASE and the evdns base it was given still exist
 * (before evdns_base_free / event_base_free), and not from inside an idem callback. */
void idem_store_release_base(struct event_base *base);

/* At exit: free every handle left (their bases must still exist) and the memory store's
 * records. Nothing may use a store afterwards. */
void idem_store_release_all(void);

#endif
