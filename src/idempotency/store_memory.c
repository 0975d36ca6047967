/*
 * store_memory: the "memory" idempotency store — one table per process, shared by every
 * worker through per-event_base handles (a handle only delivers claim results on its loop).
 *
 * Invariants, all under `mu`:
 *  - a record is live while now < expires_us; a dead one is treated as absent by every
 *    operation and unlinked when an operation or a sweep meets it;
 *  - `bytes` is the sum of the records' sizes (entry + stored response: head, body and
 *    trailers) and stays <= `limit`: a claim that would pass it is refused (UNAVAILABLE), a
 *    response that would pass it is kept as KEPT instead (so never a second execution), both
 *    logged once per episode;
 *  - buckets are indexed by the scope's first bytes: a scope is a SHA-256 output
 *    (idem_scope), so they are uniform and nobody can aim keys at one bucket.
 * A stored response is immutable and reference-counted: a replay takes a reference under the
 * lock and reads it after unlocking, while another thread may drop the record.
 * Claim results go through a per-op event activated on the handle's base, so the callback
 * always runs from the loop, never inside idem_claim, and never with `mu` held.
 */
#include "idempotency/store.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/util.h"

#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#define MIN_BUCKETS     1024
#define SWEEP_STEP      8       /* buckets examined by each claim */
#define FULL_SWEEP_GAP  100000  /* at the limit, a whole-table sweep at most this often (µs) */

struct mem_resp {
	atomic_int refs;
	struct idem_response r;     /* headers, body and trailers point just past this struct */
};

struct mem_entry {
	struct mem_entry *next;     /* in its bucket */
	unsigned char scope[32];
	unsigned char fp[32];
	enum rec_state state;
	int64_t expires_us;
	struct mem_resp *resp;      /* REC_DONE only; one reference */
	size_t bytes;               /* what it counts against the limit */
};

static struct {
	pthread_mutex_t mu;
	struct mem_entry **buckets; /* NULL until the first record */
	size_t nbuckets;            /* a power of two */
	size_t count;
	size_t bytes;
	size_t limit;
	size_t sweep_at;            /* next bucket of the incremental sweep */
	int64_t full_sweep_us;      /* when room_for last swept the whole table */
	bool full;                  /* refusing because of the limit (logged on the way in) */
} tab = { .mu = PTHREAD_MUTEX_INITIALIZER, .limit = IDEM_MEMORY_DEFAULT_LIMIT };

struct mem_store {
	struct idem_store s;
	TAILQ_HEAD(, mem_op) ops;   /* claims whose result is not delivered yet */
};

struct mem_op {
	struct idem_op op;
	TAILQ_ENTRY(mem_op) link;
	struct event *ev;
	enum idem_result r;
	struct mem_resp *resp;      /* a reference, for IDEM_REPLAY */
};

/* ------------------------------------------------------------------ responses */

static struct mem_resp *resp_new(const struct idem_response *r)
{
	struct mem_resp *m = xmalloc(sizeof *m + r->headers_len + r->body_len + r->trailers_len);
	char *p = (char *)(m + 1);
	atomic_init(&m->refs, 1);
	m->r.status = r->status;
	if (r->headers_len)
		memcpy(p, r->headers, r->headers_len);
	m->r.headers = p;
	m->r.headers_len = r->headers_len;
	p += r->headers_len;
	if (r->body_len)
		memcpy(p, r->body, r->body_len);
	m->r.body = p;
	m->r.body_len = r->body_len;
	p += r->body_len;
	if (r->trailers_len)
		memcpy(p, r->trailers, r->trailers_len);
	m->r.trailers = p;
	m->r.trailers_len = r->trailers_len;
	return m;
}

static struct mem_resp *resp_ref(struct mem_resp *m)
{
	atomic_fetch_add(&m->refs, 1);
	return m;
}

static void resp_unref(struct mem_resp *m)
{
	if (m && atomic_fetch_sub(&m->refs, 1) == 1)
		free(m);
}

static size_t resp_bytes(const struct idem_response *r)
{
	return sizeof(struct mem_resp) + r->headers_len + r->body_len + r->trailers_len;
}

/* ------------------------------------------------------------------ the table (mu held) */

static size_t bucket_of(const unsigned char scope[32], size_t nbuckets)
{
	uint64_t h;
	memcpy(&h, scope, sizeof h);
	return (size_t)h & (nbuckets - 1);
}

static void entry_free(struct mem_entry *e)
{
	tab.count--;
	tab.bytes -= e->bytes;
	resp_unref(e->resp);
	free(e);
}

/* Frees the dead records of bucket I. */
static void sweep_bucket(size_t i, int64_t now)
{
	for (struct mem_entry **pp = &tab.buckets[i]; *pp;) {
		struct mem_entry *e = *pp;
		if (e->expires_us <= now) {
			*pp = e->next;
			entry_free(e);
		} else {
			pp = &e->next;
		}
	}
}

static void sweep_some(int64_t now, size_t n)
{
	if (!tab.buckets)
		return;
	for (size_t k = 0; k < n && k < tab.nbuckets; k++) {
		sweep_bucket(tab.sweep_at, now);
		tab.sweep_at = (tab.sweep_at + 1) & (tab.nbuckets - 1);
	}
}

/* The live record for SCOPE, or NULL; a dead one met on the way is freed. */
static struct mem_entry *find(const unsigned char scope[32], int64_t now)
{
	if (!tab.buckets)
		return NULL;
	for (struct mem_entry **pp = &tab.buckets[bucket_of(scope, tab.nbuckets)]; *pp;
	     pp = &(*pp)->next) {
		struct mem_entry *e = *pp;
		if (memcmp(e->scope, scope, 32) != 0)
			continue;
		if (e->expires_us > now)
			return e;
		*pp = e->next;
		entry_free(e);
		return NULL;
	}
	return NULL;
}

static void grow(void)
{
	size_t n = tab.nbuckets ? tab.nbuckets * 2 : MIN_BUCKETS;
	struct mem_entry **b = xcalloc(n, sizeof *b);
	for (size_t i = 0; i < tab.nbuckets; i++) {
		while (tab.buckets[i]) {
			struct mem_entry *e = tab.buckets[i];
			tab.buckets[i] = e->next;
			size_t j = bucket_of(e->scope, n);
			e->next = b[j];
			b[j] = e;
		}
	}
	free(tab.buckets);
	tab.buckets = b;
	tab.nbuckets = n;
	tab.sweep_at = 0;
}

/* Whether BYTES more fit under the limit, after dropping every dead record if needed. The
 * whole-table sweep runs only at the limit, and at most every FULL_SWEEP_GAP: while the table
 * stays full of live records, claims must not each pay a walk of millions of entries under
 * the lock (the incremental sweep still frees what dies meanwhile). */
static bool room_for(size_t bytes, int64_t now)
{
	if (tab.bytes + bytes <= tab.limit)
		return true;
	if (now - tab.full_sweep_us >= FULL_SWEEP_GAP) {
		tab.full_sweep_us = now;
		for (size_t i = 0; i < tab.nbuckets; i++)
			sweep_bucket(i, now);
	}
	return tab.bytes + bytes <= tab.limit;
}

static void note_full(bool full, const char *what)
{
	if (full && !tab.full)
		log_warn("idempotency: memory store at its limit (%zu bytes, %zu records): %s",
		         tab.limit, tab.count, what);
	else if (!full && tab.full)
		log_info("idempotency: memory store below its limit again");
	tab.full = full;
}

static struct mem_entry *insert(const struct idem_key *k, enum rec_state st, int64_t expires,
                                struct mem_resp *resp, size_t bytes)
{
	if (tab.count >= tab.nbuckets)
		grow();
	struct mem_entry *e = xmalloc(sizeof *e);
	memcpy(e->scope, k->scope, 32);
	memcpy(e->fp, k->fp, 32);
	e->state = st;
	e->expires_us = expires;
	e->resp = resp;
	e->bytes = bytes;
	size_t i = bucket_of(k->scope, tab.nbuckets);
	e->next = tab.buckets[i];
	tab.buckets[i] = e;
	tab.count++;
	tab.bytes += bytes;
	return e;
}

/* ------------------------------------------------------------------ operations */

static void deliver_cb(evutil_socket_t fd, short what, void *arg)
{
	struct mem_op *o = arg;
	struct mem_store *ms = (struct mem_store *)o->op.s;
	idem_claim_fn fn = o->op.fn;
	void *fnarg = o->op.arg;
	enum idem_result r = o->r;
	struct mem_resp *resp = o->resp;

	/* the op is gone before the callback runs: it may claim again, or free its caller */
	TAILQ_REMOVE(&ms->ops, o, link);
	event_free(o->ev);
	free(o);
	fn(fnarg, r, resp ? &resp->r : NULL);
	resp_unref(resp);
}

static struct idem_op *mem_claim(struct idem_store *s, const struct idem_key *k,
                                 int64_t lock_us, idem_claim_fn fn, void *arg)
{
	struct mem_store *ms = (struct mem_store *)s;
	struct mem_op *o = xcalloc(1, sizeof *o);
	int64_t now = clock_now_us();

	o->op.s = s;
	o->op.fn = fn;
	o->op.arg = arg;

	pthread_mutex_lock(&tab.mu);
	sweep_some(now, SWEEP_STEP);
	struct mem_entry *e = find(k->scope, now);
	if (e) {
		o->r = rec_judge(e->state, e->fp, k->fp);
		if (o->r == IDEM_REPLAY)
			o->resp = resp_ref(e->resp);
	} else if (room_for(sizeof *e, now)) {
		insert(k, REC_CLAIMED, now + lock_us, NULL, sizeof *e);
		o->r = IDEM_CLAIMED;
		note_full(false, NULL);
	} else {
		o->r = IDEM_UNAVAILABLE;
		note_full(true, "refusing new claims (503)");
	}
	pthread_mutex_unlock(&tab.mu);

	o->ev = event_new(s->base, -1, 0, deliver_cb, o);
	if (!o->ev)
		abort();    /* only on out-of-memory */
	TAILQ_INSERT_TAIL(&ms->ops, o, link);
	event_active(o->ev, EV_TIMEOUT, 0);
	return &o->op;
}

static void mem_cancel(struct idem_op *op)
{
	struct mem_op *o = (struct mem_op *)op;
	struct mem_store *ms = (struct mem_store *)op->s;

	TAILQ_REMOVE(&ms->ops, o, link);
	event_free(o->ev);
	resp_unref(o->resp);
	free(o);
}

static void mem_put(struct idem_store *s, const struct idem_key *k, enum rec_state st,
                    const struct idem_response *resp, int64_t ttl_us)
{
	/* the copy is made before taking the lock: a 1 MiB memcpy must not stall other workers */
	struct mem_resp *m = st == REC_DONE ? resp_new(resp) : NULL;
	struct mem_resp *drop = m;
	int64_t now = clock_now_us();

	pthread_mutex_lock(&tab.mu);
	struct mem_entry *e = find(k->scope, now);
	if (e && (e->state != REC_CLAIMED || memcmp(e->fp, k->fp, 32) != 0))
		goto out;   /* another request's claim, or an outcome already recorded */
	size_t old = e ? e->bytes : 0;
	size_t want = sizeof *e + (m ? resp_bytes(resp) : 0);
	/* the old record's bytes are given back first: compare without them */
	tab.bytes -= old;
	bool fits = room_for(want, now);
	if (!fits && m) {
		note_full(true, "a response kept claimed instead of stored");
		st = REC_KEPT;
		want = sizeof *e;
		fits = room_for(want, now);
	}
	tab.bytes += old;
	if (!fits) {
		/* not even a bare record fits: leave the claim to lapse at lock_timeout */
		note_full(true, "an outcome not recorded");
		goto out;
	}
	if (st == REC_DONE)
		drop = NULL;    /* the record takes it */
	if (e) {
		tab.bytes += want - e->bytes;
		e->bytes = want;
		e->state = st;
		e->expires_us = now + ttl_us;
		e->resp = st == REC_DONE ? m : NULL;
	} else {
		insert(k, st, now + ttl_us, st == REC_DONE ? m : NULL, want);
	}
out:
	pthread_mutex_unlock(&tab.mu);
	resp_unref(drop);
}

static void mem_release(struct idem_store *s, const struct idem_key *k)
{
	int64_t now = clock_now_us();

	pthread_mutex_lock(&tab.mu);
	struct mem_entry *e = find(k->scope, now);
	if (e && e->state == REC_CLAIMED && !memcmp(e->fp, k->fp, 32))
		e->expires_us = now;    /* dead from now on: unlinked by the next look */
	pthread_mutex_unlock(&tab.mu);
}

static void mem_free(struct idem_store *s)
{
	struct mem_store *ms = (struct mem_store *)s;
	while (!TAILQ_EMPTY(&ms->ops))
		mem_cancel(&TAILQ_FIRST(&ms->ops)->op);
	free(ms);
}

static const struct idem_store_ops mem_ops = {
	.claim = mem_claim,
	.cancel = mem_cancel,
	.put = mem_put,
	.release = mem_release,
	.free = mem_free,
};

struct idem_store *store_memory_new(struct event_base *base)
{
	struct mem_store *ms = xcalloc(1, sizeof *ms);
	ms->s.ops = &mem_ops;
	TAILQ_INIT(&ms->ops);
	return &ms->s;
}

void store_memory_sweep(void)
{
	int64_t now = clock_now_us();
	pthread_mutex_lock(&tab.mu);
	for (size_t i = 0; i < tab.nbuckets; i++)
		sweep_bucket(i, now);
	pthread_mutex_unlock(&tab.mu);
}

void store_memory_set_limit(size_t bytes)
{
	pthread_mutex_lock(&tab.mu);
	tab.limit = bytes ? bytes : IDEM_MEMORY_DEFAULT_LIMIT;
	pthread_mutex_unlock(&tab.mu);
}

void store_memory_stats(size_t *records, size_t *bytes)
{
	pthread_mutex_lock(&tab.mu);
	*records = tab.count;
	*bytes = tab.bytes;
	pthread_mutex_unlock(&tab.mu);
}

void store_memory_shutdown(void)
{
	pthread_mutex_lock(&tab.mu);
	for (size_t i = 0; i < tab.nbuckets; i++) {
		while (tab.buckets[i]) {
			struct mem_entry *e = tab.buckets[i];
			tab.buckets[i] = e->next;
			entry_free(e);
		}
	}
	free(tab.buckets);
	tab.buckets = NULL;
	tab.nbuckets = 0;
	tab.sweep_at = 0;
	tab.full_sweep_us = 0;
	tab.full = false;
	pthread_mutex_unlock(&tab.mu);
}
