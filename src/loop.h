/*
 * loop: what every object of one worker thread shares, and the only thing lower files see of
 * the worker (DESIGN rule 7): the event base, the DNS base, a random generator, the worker's
 * index (its slot in per-worker counters), the per-worker connection pools, and the
 * deferred-free queue.
 *
 * Deferred free: loop_defer_free() queues a free that runs once the current callback stack has
 * unwound, so a callback may close an object its caller still holds. Nothing here is touched
 * by another thread.
 */
#ifndef RG_LOOP_H
#define RG_LOOP_H

#include <stdint.h>

struct event_base;
struct evdns_base;
struct event;
struct pool_table;

struct loop_deferred {
	void (*fn)(void *);
	void *p;
};

struct loop {
	struct event_base *base;
	struct evdns_base *dns;
	uint64_t rng;
	int id;                         /* worker index: the per-worker counter slot */
	struct pool_table *pools;       /* pool.c's, created on first use */
	struct loop_deferred *dq;
	int ndq, capdq;
	struct event *dq_ev;
};

/* Create the event base (no locks: one thread per loop) and DNS base. 0 or -1. */
int loop_init(struct loop *l, int id);
/* Run every deferred free now (frees may queue more: runs until empty). */
void loop_run_deferred(struct loop *l);
/* After the loop stopped: free the DNS base (pending lookups are cancelled: their owners must
 * still exist), then, once everything was closed, run the last frees (the event base stays for
 * loop_free_base, after the thread is joined). */
void loop_free_dns(struct loop *l);
void loop_fini(struct loop *l);
void loop_free_base(struct loop *l);

void loop_defer_free(struct loop *l, void (*fn)(void *), void *p);

#endif
