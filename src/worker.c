/*
 * worker: thread, event loop, deferred frees, drain.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/dns.h>
#include <event2/event.h>
#include <event2/thread.h>

#include "clock.h"
#include "idempotency.h"
#include "listener.h"
#include "log.h"
#include "pool.h"
#include "session.h"
#include "util.h"
#include "worker.h"

_Atomic bool g_draining;
_Atomic int g_exchanges;

#define DRAIN_POLL_US (20 * 1000)

struct runtime *worker_runtime(struct worker *w)
{
	if (runtime_generation() != w->rt->gen) {
		struct runtime *rt = runtime_current();
		runtime_unref(w->rt);
		w->rt = rt;
	}
	return w->rt;
}

static void dq_cb(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	/* frees may queue more frees: run until empty */
	for (int i = 0; i < w->ndq; i++)
		w->dq[i].fn(w->dq[i].p);
	w->ndq = 0;
}

void worker_defer_free(struct worker *w, void (*fn)(void *), void *p)
{
	if (w->ndq == w->capdq) {
		w->capdq = w->capdq ? w->capdq * 2 : 64;
		w->dq = xrealloc(w->dq, sizeof(*w->dq) * (size_t)w->capdq);
	}
	w->dq[w->ndq].fn = fn;
	w->dq[w->ndq].p = p;
	if (w->ndq++ == 0)
		event_active(w->dq_ev, EV_TIMEOUT, 0);
}

void worker_session_closed(struct worker *w)
{
	if (w->draining && w->nsessions == 0)
		event_base_loopexit(w->base, NULL);
}

/* SPEC §1: while in-flight requests finish, an open keep-alive connection stays open (a
 * request arriving on it is served with "Connection: close"); once no request is in flight
 * in any worker, idle connections close and the worker stops when it has none left. */
static void drain_poll_cb(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	session_drain_all(w, atomic_load(&g_exchanges) == 0);
	worker_session_closed(w);
}

static void begin_drain(struct worker *w)
{
	if (w->draining)
		return;
	w->draining = true;
	for (int i = 0; i < w->nlisteners; i++)
		listener_stop(w->listeners[i]);
	session_drain_all(w, atomic_load(&g_exchanges) == 0);
	worker_session_closed(w);
	if (w->nsessions > 0) {
		w->drain_ev = event_new(w->base, -1, EV_PERSIST, drain_poll_cb, w);
		struct timeval tv = clock_tv(DRAIN_POLL_US);
		evtimer_add(w->drain_ev, &tv);
	}
}

/* The main thread's word, through the eventfd: worker loops take no locks, so no other
 * thread ever calls into them. */
static void notify_cb(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	uint64_t n;
	while (read(w->wake_fd, &n, sizeof(n)) > 0)
		;
	if (atomic_load(&w->stop_requested)) {
		event_base_loopbreak(w->base);
		return;
	}
	if (atomic_load(&g_draining))
		begin_drain(w);
}

void worker_notify(struct worker *w)
{
	uint64_t one = 1;
	ssize_t r = write(w->wake_fd, &one, sizeof(one));
	(void)r;
}

void worker_stop(struct worker *w)
{
	atomic_store(&w->stop_requested, true);
	worker_notify(w);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	event_base_dispatch(w->base);

	/* stopped: close what is left, then free everything this thread owns */
	session_close_all(w);
	for (int i = 0; i < w->nlisteners; i++)
		listener_free(w->listeners[i]);
	free(w->listeners);
	w->listeners = NULL;
	dq_cb(-1, 0, w);
	idem_store_release_base(w->base);   /* before the DNS base it may use */
	evdns_base_free(w->dns, 1);
	dq_cb(-1, 0, w);
	pool_free_all(w);
	dq_cb(-1, 0, w);
	/* streams free their memory from the loop (event_base_once): let those run */
	event_base_loop(w->base, EVLOOP_NONBLOCK);
	dq_cb(-1, 0, w);
	event_free(w->dq_ev);
	event_free(w->notify_ev);
	close(w->wake_fd);
	if (w->drain_ev)
		event_free(w->drain_ev);
	w->drain_ev = NULL;
	free(w->dq);
	runtime_unref(w->rt);
	w->rt = NULL;
	if (w->on_exit)
		w->on_exit(w);
	return NULL;
}

int worker_start(struct worker *w)
{
	/* one thread per loop: no locks (cross-thread news comes through wake_fd) */
	struct event_config *ec = event_config_new();
	event_config_set_flag(ec, EVENT_BASE_FLAG_NOLOCK);
	w->base = event_base_new_with_config(ec);
	event_config_free(ec);
	if (!w->base)
		return -1;
	w->dns = evdns_base_new(w->base, EVDNS_BASE_INITIALIZE_NAMESERVERS | EVDNS_BASE_DISABLE_WHEN_INACTIVE);
	if (!w->dns)
		w->dns = evdns_base_new(w->base, EVDNS_BASE_DISABLE_WHEN_INACTIVE);
	/* without a resolv.conf libevent skips /etc/hosts: names must still resolve from it */
	evdns_base_load_hosts(w->dns, NULL);
	w->rng = (uint64_t)clock_now_us() * 0x9e3779b97f4a7c15ull + (uint64_t)w->id + 1;
	TAILQ_INIT(&w->sessions);
	w->dq_ev = event_new(w->base, -1, 0, dq_cb, w);
	w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (w->wake_fd < 0)
		return -1;
	w->notify_ev = event_new(w->base, w->wake_fd, EV_READ | EV_PERSIST, notify_cb, w);
	event_add(w->notify_ev, NULL);
	w->rt = runtime_current();
	w->listeners = xcalloc((size_t)w->nlisteners, sizeof(*w->listeners));
	for (int i = 0; i < w->nlisteners; i++)
		w->listeners[i] = listener_new(w, w->listen_names[i], w->listen_fds[i]);
	return pthread_create(&w->thread, NULL, worker_main, w);
}

void worker_join(struct worker *w)
{
	pthread_join(w->thread, NULL);
	event_base_free(w->base);
	w->base = NULL;
}
