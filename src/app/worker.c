/*
 * worker: thread, loop, sessions, drain (see worker.h).
 *
 * Sessions are created here, from the listener's accept callback, and each reports its end
 * through on_conn_closed(): the worker drops it from its list and gives the listener its place
 * back. Drain: listeners stop, sessions are told to close after their current response, pools
 * stop parking; once no request is in flight in any worker, idle connections close and the
 * loop ends when no session is left.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "base/clock.h"
#include "idempotency/idempotency.h"
#include "net/listener.h"
#include "base/log.h"
#include "upstream/h2_conn.h"
#include "upstream/pool.h"
#include "client/h1_session.h"
#include "client/h2_session.h"
#include "obs/stats.h"
#include "state/budget_shared.h"
#include "state/runtime.h"
#include "base/util.h"
#include "app/worker.h"

_Atomic bool g_draining;

#define DRAIN_POLL_US (20 * 1000)
/* After a drain begins, idle keep-alive connections stay open this long (at most a quarter of
 * drain_timeout): a request already on its way on one is served with Connection: close instead
 * of meeting a closed socket. */
#define DRAIN_GRACE_US (1000 * 1000)

struct worker_conn {
	struct worker *w;
	struct h1_session *s;              /* HTTP/1, until it hands the connection to ... */
	struct h2_session *h2;          /* ... an HTTP/2 session */
	struct listener *lst;
	TAILQ_ENTRY(worker_conn) link;
};

static struct runtime *worker_runtime(void *arg)
{
	struct worker *w = arg;
	if (runtime_generation() != w->rt->gen) {
		struct runtime *rt = runtime_current();
		runtime_unref(w->rt);
		w->rt = rt;
	}
	return w->rt;
}

static bool requests_in_flight(void)
{
	int64_t n = 0;
	for (int i = 0; i < g_nworkers; i++)
		n += atomic_load_explicit(&g_gstats[i].exchanges_active, memory_order_relaxed);
	return n > 0;
}

static void maybe_exit(struct worker *w)
{
	if (w->draining && w->nconns == 0)
		event_base_loopexit(w->loop.base, NULL);
}

static void conn_drain(struct worker_conn *c, bool close_idle)
{
	if (c->h2)
		h2_session_drain(c->h2, close_idle);
	else
		h1_session_drain(c->s, close_idle);
}

static void conn_expire(struct worker_conn *c)
{
	if (c->h2)
		h2_session_expire(c->h2);
	else
		h1_session_expire(c->s);
}

static void conn_close(struct worker_conn *c, const char *why)
{
	if (c->h2)
		h2_session_close(c->h2, why);
	else
		h1_session_close(c->s, why);
}

static void drain_sessions(struct worker *w, bool close_idle)
{
	struct worker_conn *c, *next;
	for (c = TAILQ_FIRST(&w->conns); c; c = next) {
		next = TAILQ_NEXT(c, link);
		conn_drain(c, close_idle);    /* may close it: on_conn_closed frees C */
	}
}

/* Free the listeners a reload closed once their last connection has gone. */
static void prune_listeners(struct worker *w)
{
	int n = 0;
	for (int i = 0; i < w->nlisteners; i++) {
		if (listener_done(w->listeners[i]))
			listener_free(w->listeners[i]);
		else
			w->listeners[n++] = w->listeners[i];
	}
	w->nlisteners = n;
}

static const struct config *listener_cfg(void *arg, uint64_t *gen);
static void on_accept(void *arg, struct listener *lst, const char *lname, int fd,
                      const struct sockaddr *sa, int salen);

/* Take the sockets the main thread bound for this worker since the last look. */
static void adopt_listeners(struct worker *w)
{
	struct listener_owner own = { .on_accept = on_accept, .config = listener_cfg, .arg = w };
	pthread_mutex_lock(&w->pending_lock);
	w->listeners = xrealloc(w->listeners,
	                        (size_t)(w->nlisteners + w->npending + 1) * sizeof(*w->listeners));
	for (int i = 0; i < w->npending; i++) {
		struct pending_listener *p = &w->pending[i];
		struct listener *l = listener_new(&w->loop, &own, p->name, p->addr, p->fd);
		if (w->draining)
			listener_stop(l);       /* a reload during the drain opens nothing */
		w->listeners[w->nlisteners++] = l;
		free(p->name);
		free(p->addr);
	}
	w->npending = 0;
	pthread_mutex_unlock(&w->pending_lock);
}

void worker_init(struct worker *w, int id, void (*on_exit)(struct worker *w))
{
	w->id = id;
	w->on_exit = on_exit;
	pthread_mutex_init(&w->pending_lock, NULL);
}

void worker_add_listener(struct worker *w, const char *name, const char *addr, int fd)
{
	pthread_mutex_lock(&w->pending_lock);
	w->pending = xrealloc(w->pending, (size_t)(w->npending + 1) * sizeof(*w->pending));
	w->pending[w->npending++] = (struct pending_listener){ xstrdup(name), xstrdup(addr), fd };
	pthread_mutex_unlock(&w->pending_lock);
}

/* A session ended (called once, from h1_session_close). */
static void on_conn_closed(void *arg)
{
	struct worker_conn *c = arg;
	struct worker *w = c->w;
	TAILQ_REMOVE(&w->conns, c, link);
	w->nconns--;
	atomic_fetch_sub(&g_gstats[w->id].conns_active, 1);
	listener_release(c->lst);
	free(c);
	if (!w->in_check)
		prune_listeners(w);
	maybe_exit(w);
}

static void on_conn_closed(void *arg);

/* The HTTP/1 session found an HTTP/2 client (preface or ALPN h2): the same connection goes
 * on as an HTTP/2 session. */
static void on_h2(void *arg, const struct h2_handoff *h)
{
	struct worker_conn *c = arg;
	struct worker *w = c->w;
	struct session_owner own = {
		.runtime = worker_runtime,
		.runtime_arg = w,
		.on_closed = on_conn_closed,
		.closed_arg = c,
	};
	c->s = NULL;
	struct h2_session *h2 = h2_session_new(&w->loop, &own, h);
	if (!h2)
		return;         /* it closed at once: on_conn_closed freed C */
	c->h2 = h2;
	if (w->draining)
		h2_session_drain(h2, false);
}

static void on_accept(void *arg, struct listener *lst, const char *lname, int fd,
                      const struct sockaddr *sa, int salen)
{
	struct worker *w = arg;
	struct worker_conn *c = xcalloc(1, sizeof(*c));
	c->w = w;
	c->lst = lst;
	TAILQ_INSERT_TAIL(&w->conns, c, link);
	w->nconns++;
	atomic_fetch_add(&g_gstats[w->id].conns_active, 1);
	struct session_owner own = {
		.runtime = worker_runtime,
		.runtime_arg = w,
		.on_closed = on_conn_closed,
		.closed_arg = c,
		.on_h2 = on_h2,
	};
	struct h1_session *s = h1_session_new(&w->loop, &own, lname,
	                                      ++w->next_sid * 64 + (uint64_t)w->id, fd, sa, salen);
	if (!s)
		return;         /* it closed at once: on_conn_closed freed C */
	c->s = s;
	if (w->draining)
		h1_session_drain(s, false);
}

static const struct config *listener_cfg(void *arg, uint64_t *gen)
{
	struct runtime *rt = worker_runtime(arg);
	*gen = rt->gen;
	return rt->cfg;
}

/* After a reload: a listener the config no longer has (or has at another address) is closed
 * (listener_check), and its connections end as in a drain: idle ones now, busy ones after
 * their current response. */
static void check_listeners(struct worker *w)
{
	w->in_check = true;
	for (int i = 0; i < w->nlisteners; i++) {
		struct listener *l = w->listeners[i];
		if (listener_check(l))
			continue;
		struct worker_conn *c, *next;
		for (c = TAILQ_FIRST(&w->conns); c; c = next) {
			next = TAILQ_NEXT(c, link);
			if (c->lst == l)
				conn_drain(c, true);    /* may close it: on_conn_closed frees C */
		}
	}
	w->in_check = false;
	prune_listeners(w);
}

/* After a reload: HTTP/2 connections tell their clients what changed in their SETTINGS. */
static void reconfigure_sessions(struct worker *w)
{
	struct worker_conn *c;
	TAILQ_FOREACH(c, &w->conns, link) {
		if (c->h2)
			h2_session_reconfigure(c->h2);
	}
}

/* SPEC §1: while in-flight requests finish, an open keep-alive connection stays open (a
 * request arriving on it is served with "Connection: close"); once no request is in flight
 * in any worker, idle connections close and the worker stops when it has none left. */
static bool may_close_idle(struct worker *w)
{
	int64_t grace = w->rt->cfg->drain_timeout_us / 4;
	if (grace > DRAIN_GRACE_US)
		grace = DRAIN_GRACE_US;
	return !requests_in_flight() && clock_now_us() - w->drain_start_us >= grace;
}

static void drain_poll_cb(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	drain_sessions(w, may_close_idle(w));
	maybe_exit(w);
}

static void begin_drain(struct worker *w)
{
	if (w->draining)
		return;
	w->draining = true;
	w->drain_start_us = clock_now_us();
	for (int i = 0; i < w->nlisteners; i++)
		listener_stop(w->listeners[i]);
	pool_drain(&w->loop);
	h2_drain(&w->loop);
	drain_sessions(w, may_close_idle(w));
	maybe_exit(w);
	if (w->nconns > 0) {
		w->drain_ev = event_new(w->loop.base, -1, EV_PERSIST, drain_poll_cb, w);
		struct timeval tv = clock_tv(DRAIN_POLL_US);
		evtimer_add(w->drain_ev, &tv);
	}
}

static void expire_cb(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	event_base_loopbreak(w->loop.base);
}

/* drain_timeout ran out: each connection cuts what it still serves in a way its client can
 * tell (HTTP/2: RST_STREAM and a last GOAWAY), each exchange that may have executed ends as
 * an unknown outcome; the loop runs on until they closed, at most EXPIRE_FLUSH_US, and what
 * is left then is closed by worker_main. */
#define EXPIRE_FLUSH_US (250 * 1000)
static void expire_sessions(struct worker *w)
{
	w->expiring = true;
	struct worker_conn *c, *next;
	for (c = TAILQ_FIRST(&w->conns); c; c = next) {
		next = TAILQ_NEXT(c, link);
		conn_expire(c);     /* may close it: on_conn_closed frees C */
	}
	if (w->nconns == 0) {
		event_base_loopbreak(w->loop.base);
		return;
	}
	w->expire_ev = evtimer_new(w->loop.base, expire_cb, w);
	struct timeval tv = clock_tv(EXPIRE_FLUSH_US);
	evtimer_add(w->expire_ev, &tv);
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
		if (w->draining && !w->expiring)
			expire_sessions(w);
		else if (!w->expiring)
			event_base_loopbreak(w->loop.base);
		return;
	}
	adopt_listeners(w);
	if (atomic_load(&g_draining))
		begin_drain(w);
	else {
		check_listeners(w);
		reconfigure_sessions(w);
	}
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
	loop_enter(&w->loop);
	event_base_dispatch(w->loop.base);

	/* stopped: close what is left, then free everything this thread owns */
	struct worker_conn *c;
	while ((c = TAILQ_FIRST(&w->conns)))
		conn_close(c, "shutdown");
	for (int i = 0; i < w->nlisteners; i++)
		listener_free(w->listeners[i]);
	free(w->listeners);
	w->listeners = NULL;
	pthread_mutex_lock(&w->pending_lock);
	for (int i = 0; i < w->npending; i++) {
		close(w->pending[i].fd);
		free(w->pending[i].name);
		free(w->pending[i].addr);
	}
	free(w->pending);
	w->pending = NULL;
	w->npending = 0;
	pthread_mutex_unlock(&w->pending_lock);
	loop_run_deferred(&w->loop);
	idem_store_release_base(w->loop.base);  /* before the DNS base it may use */
	budget_shared_release_base(w->loop.base);   /* likewise */
	loop_free_dns(&w->loop);
	pool_free_all(&w->loop);
	h2_free_all(&w->loop);
	loop_fini(&w->loop);
	event_free(w->notify_ev);
	close(w->wake_fd);
	if (w->drain_ev)
		event_free(w->drain_ev);
	w->drain_ev = NULL;
	if (w->expire_ev)
		event_free(w->expire_ev);
	w->expire_ev = NULL;
	runtime_unref(w->rt);
	w->rt = NULL;
	if (w->on_exit)
		w->on_exit(w);
	return NULL;
}

int worker_start(struct worker *w)
{
	if (loop_init(&w->loop, w->id) != 0)
		return -1;
	TAILQ_INIT(&w->conns);
	w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (w->wake_fd < 0)
		return -1;
	w->notify_ev = event_new(w->loop.base, w->wake_fd, EV_READ | EV_PERSIST, notify_cb, w);
	event_add(w->notify_ev, NULL);
	w->rt = runtime_current();
	adopt_listeners(w);
	return pthread_create(&w->thread, NULL, worker_main, w);
}

void worker_join(struct worker *w)
{
	pthread_join(w->thread, NULL);
	loop_free_base(&w->loop);
	pthread_mutex_destroy(&w->pending_lock);
}
