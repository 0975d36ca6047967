/*
 * worker: one thread, one loop (struct loop: event base, DNS, rng, deferred frees, pools).
 * Owns its listener sockets (SO_REUSEPORT), the client sessions they accept (each reports its
 * end through the callback it was handed), and the drain. Nothing here is touched by another
 * thread except through worker_notify(), which wakes the loop (an eventfd) to look at the
 * shared flags; the loop itself takes no locks.
 *
 * Private to main.c and worker.c: lower files see only the struct loop.
 */
#ifndef RG_WORKER_H
#define RG_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include "base/loop.h"

struct listener;
struct event;
struct runtime;
struct worker_conn;

struct worker {
	struct loop loop;
	int id;
	pthread_t thread;
	struct runtime *rt;             /* the config new requests use; refreshed per request */
	struct listener **listeners;
	int nlisteners;
	TAILQ_HEAD(, worker_conn) conns;    /* client sessions */
	int nconns;
	struct event *notify_ev;
	int wake_fd;                    /* eventfd: the main thread's wake-up call */
	_Atomic bool stop_requested;
	struct event *drain_ev;         /* while draining: closes idle connections once no
	                                 * request is in flight anywhere */
	bool draining;
	bool expiring;                  /* drain_timeout ran out: the last frames are leaving */
	struct event *expire_ev;        /* ... for at most this long */
	int64_t drain_start_us;
	uint64_t next_sid;
	bool in_check;                  /* walking the listeners: none is freed meanwhile */
	/* sockets bound by the main thread (startup, reload) that the loop has yet to take */
	pthread_mutex_t pending_lock;
	struct pending_listener {
		char *name, *addr;
		int fd;
	} *pending;
	int npending;
	void (*on_exit)(struct worker *w);  /* called from the worker thread as it ends */
};

extern _Atomic bool g_draining;

/* Before anything else: W is worker number ID, with no listener yet. */
void worker_init(struct worker *w, int id, void (*on_exit)(struct worker *w));
/* Hand W a listening socket FD for listener NAME bound to ADDR (FD is W's from now on; it
 * takes it at start, or when notified). Thread-safe. */
void worker_add_listener(struct worker *w, const char *name, const char *addr, int fd);
int worker_start(struct worker *w);
void worker_notify(struct worker *w);
/* Ask the loop to stop now (drain timeout); thread-safe. */
void worker_stop(struct worker *w);
void worker_join(struct worker *w);

#endif
