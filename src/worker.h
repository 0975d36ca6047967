/*
 * worker: one thread, one event loop. Owns its listener sockets (SO_REUSEPORT), client
 * sessions, upstream connection pools and DNS base. Nothing here is touched by another thread
 * except through worker_notify(), which wakes the loop (an eventfd) to look at the shared
 * flags; the loop itself takes no locks.
 *
 * Objects are freed late: worker_defer_free() queues a free that runs once the current
 * callback stack has unwound, so a callback may close an object its caller still holds.
 */
#ifndef RG_WORKER_H
#define RG_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include "upstream.h"

struct session;
struct listener;
struct pool_ep;
struct event;

struct deferred {
	void (*fn)(void *);
	void *p;
};

struct worker {
	int id;
	pthread_t thread;
	struct event_base *base;
	struct evdns_base *dns;
	struct runtime *rt;             /* the config new requests use; refreshed per request */
	uint64_t rng;
	struct listener **listeners;
	int nlisteners;
	TAILQ_HEAD(, session) sessions;
	int nsessions;
	struct pool_ep ***pools;        /* [state id][endpoint index] */
	int npools;
	struct deferred *dq;            /* deferred frees */
	int ndq, capdq;
	struct event *dq_ev;
	struct event *notify_ev;
	int wake_fd;                    /* eventfd: the main thread's wake-up call */
	_Atomic bool stop_requested;
	struct event *drain_ev;         /* while draining: closes idle connections once no
	                                 * request is in flight anywhere */
	bool draining;
	uint64_t next_sid;
	int *listen_fds;                /* bound by main, one per configured listener */
	char **listen_names;
	void (*on_exit)(struct worker *w);  /* called from the worker thread as it ends */
};

extern _Atomic bool g_draining;
/* Exchanges (requests being served, tunnels included) in all workers. */
extern _Atomic int g_exchanges;

int worker_start(struct worker *w);
void worker_notify(struct worker *w);

/* The runtime for a new request (no reference taken: valid while w->rt is). */
struct runtime *worker_runtime(struct worker *w);

void worker_defer_free(struct worker *w, void (*fn)(void *), void *p);
/* A session closed: a draining worker stops when it has none left. */
void worker_session_closed(struct worker *w);
/* Ask the loop to stop now (drain timeout); thread-safe. */
void worker_stop(struct worker *w);
void worker_join(struct worker *w);

#endif
