/*
 * store: what idempotency.c shares with its two backends (store_memory.c, store_redis.c) and
 * nobody else: the backend table, the common head of handles and ops, the record states, the
 * one rule that judges a claim against a record, and the record's byte encoding (what redis
 * holds; the memory store keeps records as structs).
 */
#ifndef RG_STORE_H
#define RG_STORE_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "idempotency/idem_types.h"

struct event_base;
struct evdns_base;
struct idem_store;
struct idem_op;

enum rec_state {
	REC_CLAIMED = 'C',      /* a request owns the key and is running */
	REC_DONE = 'D',         /* finished, its response stored */
	REC_KEPT = 'K',         /* finished, response not storable: stays claimed until ttl */
};

struct idem_store_ops {
	struct idem_op *(*claim)(struct idem_store *s, const struct idem_key *k, int64_t lock_us,
	                         idem_claim_fn fn, void *arg);
	void (*cancel)(struct idem_op *op);
	/* CLAIMED(k->fp) or nothing -> ST (REC_DONE with RESP, or REC_KEPT) for TTL_US */
	void (*put)(struct idem_store *s, const struct idem_key *k, enum rec_state st,
	            const struct idem_response *resp, int64_t ttl_us);
	/* CLAIMED(k->fp) -> nothing */
	void (*release)(struct idem_store *s, const struct idem_key *k);
	/* frees the handle and its pending ops without calling them */
	void (*free)(struct idem_store *s);
};

/* The head of every handle; the registry in idempotency.c fills spec/base/next. */
struct idem_store {
	const struct idem_store_ops *ops;
	struct event_base *base;
	char *spec;                 /* cfg_idempotency.store: the cache key, may hold a password */
	struct idem_store *next;    /* in the registry */
};

/* The head of every pending claim. */
struct idem_op {
	struct idem_store *s;
	idem_claim_fn fn;
	void *arg;
};

struct idem_store *store_memory_new(struct event_base *base);
void store_memory_sweep(void);
void store_memory_set_limit(size_t bytes);
void store_memory_stats(size_t *records, size_t *bytes);
void store_memory_shutdown(void);   /* frees every record; handles must be gone already */

struct idem_store *store_redis_new(const struct cfg_idempotency *c, struct event_base *base,
                                   struct evdns_base *dns, const char **err);
void store_redis_set_timeout(int64_t us);

/* MISMATCH when the fingerprints differ, else REPLAY for DONE and IN_PROGRESS otherwise. */
enum idem_result rec_judge(enum rec_state st, const unsigned char stored_fp[32],
                           const unsigned char fp[32]);

/*
 * A record as bytes, big-endian:
 *   "RGI1" state(1) fp(32)                                  CLAIMED, KEPT: REC_HEAD_LEN bytes
 *   "RGI1" 'D' fp status(2) headers_len(4) body_len(4) headers body
 *                                                           DONE without trailers
 *   "RGI2" 'D' fp status(2) headers_len(4) body_len(4) trailers_len(4) headers body trailers
 *                                                           DONE with trailers (len > 0)
 * Nothing else: a value that is not exactly one of these is corrupt. A redis store is shared
 * by every replica, so during a rolling deploy versions read each other's records: the
 * version-2 form is written only for a response that has trailers (gRPC), so every other
 * record stays readable by a version that knows only "RGI1", and this one reads all records
 * that version wrote (as responses with no trailers). An "RGI2" record an older version meets
 * is corrupt to it: it answers 503 (fail closed), never a second execution.
 */
#define REC_HEAD_LEN    37
#define REC_RESP_HEAD   10      /* status, headers_len, body_len */
#define REC_RESP_HEAD2  14      /* ... and trailers_len */

struct rec {
	enum rec_state state;
	unsigned char fp[32];
	struct idem_response resp;  /* DONE only; points into the decoded bytes (trailers NULL
	                             * and 0 for a record without them) */
};

/* Bytes rec_encode will write, or 0 when RESP cannot be encoded (a length over 32 bits). The
 * form follows RESP: "RGI2" when it has trailers, else "RGI1". */
size_t rec_size(enum rec_state st, const struct idem_response *resp);
void rec_encode(unsigned char *out, enum rec_state st, const unsigned char fp[32],
                const struct idem_response *resp);
/* false when P/N is not exactly one well-formed record */
bool rec_decode(const unsigned char *p, size_t n, struct rec *out);

#endif
