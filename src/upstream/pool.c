/*
 * pool: idle upstream connections, per worker. See pool.h. Everything
 * here belongs to one worker thread; the only shared things it reads are the registry's
 * forget epoch and, through upstream_ep_live(), whether a slot still holds a serial.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>

#include "base/clock.h"
#include "base/log.h"
#include "upstream/pool.h"
#include "state/upstream.h"
#include "net/stream.h"
#include "base/util.h"
#include "base/loop.h"

/* the loop's pools: [upstream state id][endpoint index] */
struct pool_table {
	struct pool_ep ***pools;
	int npools;
	uint64_t forget_epoch;          /* the registry's, at the last sweep */
	bool draining;                  /* no connection is parked any more */
	struct event *tick;             /* closes what idled past POOL_IDLE_US (POOL_SWEEP_US) */
};

static void pool_tick_cb(evutil_socket_t fd, short what, void *arg);

static struct pool_table *pool_table(struct loop *l)
{
	if (!l->pools) {
		struct pool_table *t = xcalloc(1, sizeof(*t));
		t->tick = event_new(l->base, -1, EV_PERSIST, pool_tick_cb, t);
		struct timeval tv = clock_tv(POOL_SWEEP_US);
		evtimer_add(t->tick, &tv);
		l->pools = t;
	}
	return l->pools;
}

static void pool_unlink(struct pool_conn *c);

/* Unlink C if it is idle and let its owner close it. */
static void pool_close(struct pool_conn *c)
{
	pool_unlink(c);
	c->close(c);
}

static void pe_free(struct pool_ep *pe)
{
	free(pe->name);
	free(pe);
}

/* Close the idle connections of PE and free it (its endpoint is forgotten: nothing but this
 * table knows it). */
static void pe_retire(struct pool_table *t, struct pool_ep *pe)
{
	struct pool_conn *c;
	while ((c = TAILQ_FIRST(&pe->idle)))
		pool_close(c);
	pe_free(pe);
}

/* Retire the pools whose endpoint the registry forgot since the last sweep. */
static void pool_sweep(struct pool_table *t)
{
	uint64_t epoch = upstream_forget_epoch();
	if (epoch == t->forget_epoch)
		return;
	t->forget_epoch = epoch;
	for (int i = 0; i < t->npools; i++)
		for (int e = 0; t->pools[i] && e < MAX_ENDPOINTS; e++) {
			struct pool_ep *pe = t->pools[i][e];
			if (pe && !upstream_ep_live(i, e, pe->serial)) {
				t->pools[i][e] = NULL;
				pe_retire(t, pe);
			}
		}
}

struct pool_ep *pool_ep_get(struct loop *l, struct ep_state *ep)
{
	struct pool_table *t = pool_table(l);
	pool_sweep(t);
	int id = ep->up->id;
	if (id >= t->npools) {
		int n = id + 8;
		t->pools = xrealloc(t->pools, sizeof(*t->pools) * (size_t)n);
		for (int i = t->npools; i < n; i++)
			t->pools[i] = NULL;
		t->npools = n;
	}
	if (!t->pools[id])
		t->pools[id] = xcalloc(MAX_ENDPOINTS, sizeof(struct pool_ep *));
	struct pool_ep *pe = t->pools[id][ep->index];
	if (pe && pe->serial != ep->serial) {
		/* the slot's endpoint was forgotten and the index given to a new one */
		pe_retire(t, pe);
		pe = NULL;
	}
	if (!pe) {
		pe = xcalloc(1, sizeof(*pe));
		TAILQ_INIT(&pe->idle);
		pe->name = xstrdup(ep->name);
		pe->serial = ep->serial;
		memcpy(&pe->addr, &ep->addr, sizeof(pe->addr));
		pe->addrlen = ep->addrlen;
		pe->up_id = id;
		pe->index = ep->index;
		pe->loop = l;
		t->pools[id][ep->index] = pe;
	}
	return pe;
}

static void pool_unlink(struct pool_conn *c)
{
	if (!c->idle)
		return;
	struct pool_ep *pe = c->pe;
	TAILQ_REMOVE(&pe->idle, c, link);
	pe->nidle--;
	c->idle = false;
}

/* Any byte or EOF on an idle connection: the peer is closing it or misbehaving. */
static void idle_read_cb(struct stream *strm, void *arg)
{
	MAGIC_CHECK((struct pool_conn *)arg, POOL_CONN_MAGIC);
	pool_close(arg);
}

static void idle_event_cb(struct stream *strm, short what, void *arg)
{
	MAGIC_CHECK((struct pool_conn *)arg, POOL_CONN_MAGIC);
	pool_close(arg);
}

/* Every POOL_SWEEP_US: close the connections idle for POOL_IDLE_US or more (the oldest are at
 * the tail of each list), and retire the pools of forgotten endpoints. One timer per loop, not
 * one armed and deleted per request; pool_get() never hands out one idle past
 * POOL_REUSE_MAX_US, so the sweep's lag only keeps a dead connection's descriptor a little
 * longer. */
static void pool_tick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct pool_table *t = arg;
	pool_sweep(t);
	int64_t old = clock_now_us() - POOL_IDLE_US;
	for (int i = 0; i < t->npools; i++)
		for (int e = 0; t->pools[i] && e < MAX_ENDPOINTS; e++) {
			struct pool_ep *pe = t->pools[i][e];
			struct pool_conn *c;
			while (pe && (c = TAILQ_LAST(&pe->idle, pool_idle)) && c->idle_since_us <= old)
				pool_close(c);
		}
}

void pool_put(struct pool_conn *c)
{
	struct pool_ep *pe = pool_ep_get(c->loop, c->ep);
	if (pe->nidle >= POOL_MAX_IDLE || pool_table(c->loop)->draining ||
	    evbuffer_get_length(stream_input(c->strm)) > 0) {
		c->close(c);
		return;
	}
	c->pe = pe;
	c->idle = true;
	c->idle_since_us = clock_now_us();
	stream_setcb(c->strm, idle_read_cb, NULL, idle_event_cb, c);
	stream_enable(c->strm, EV_READ);
	TAILQ_INSERT_HEAD(&pe->idle, c, link);    /* LIFO: the most recently used is warmest */
	pe->nidle++;
}

/* The peer may have closed while we were not looking (the read event not yet run): peek. */
static bool conn_alive(struct pool_conn *c)
{
	char b;
	evutil_socket_t fd = stream_fd(c->strm);
	ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	if (n == 0 || n > 0)
		return false;
	return errno == EAGAIN || errno == EWOULDBLOCK;
}

struct pool_conn *pool_get(struct pool_ep *pe)
{
	int64_t now = clock_now_us();
	struct pool_conn *c;
	while ((c = TAILQ_FIRST(&pe->idle))) {
		pool_unlink(c);
		/* A close that came in while we were not looking shows on a peek. A connection
		 * parked within the last POOL_PEEK_AFTER_US was just used: servers close idle
		 * connections after seconds, so the peek (a system call) is skipped for it. */
		int64_t idle = now - c->idle_since_us;
		if (idle > POOL_REUSE_MAX_US || (idle > POOL_PEEK_AFTER_US && !conn_alive(c))) {
			c->close(c);
			continue;
		}
		stream_disable(c->strm, EV_READ);
		stream_setcb(c->strm, NULL, NULL, NULL, NULL);
		c->uses++;
		return c;
	}
	return NULL;
}

void pool_drain(struct loop *l)
{
	struct pool_table *t = pool_table(l);
	t->draining = true;
	for (int i = 0; i < t->npools; i++)
		for (int e = 0; t->pools[i] && e < MAX_ENDPOINTS; e++) {
			struct pool_ep *pe = t->pools[i][e];
			struct pool_conn *c;
			while (pe && (c = TAILQ_FIRST(&pe->idle)))
				pool_close(c);
		}
}

void pool_free_all(struct loop *l)
{
	struct pool_table *t = l->pools;
	if (!t)
		return;
	for (int i = 0; i < t->npools; i++) {
		if (!t->pools[i])
			continue;
		for (int e = 0; e < MAX_ENDPOINTS; e++) {
			struct pool_ep *pe = t->pools[i][e];
			if (!pe)
				continue;
			struct pool_conn *c;
			while ((c = TAILQ_FIRST(&pe->idle)))
				pool_close(c);  /* freed by the loop's last deferred run */
			pe_free(pe);
		}
		free(t->pools[i]);
	}
	free(t->pools);
	event_free(t->tick);
	free(t);
	l->pools = NULL;
}

void pool_tls_failed(struct loop *l, struct ep_state *ep, int f, const char *detail)
{
	char key[EP_LABEL_MAX + 16];
	STAT_INC(ep->up->stats[l->id].tls_errors[f]);
	snprintf(key, sizeof(key), "upstream %s", ep->name);
	if (log_keyed_every(key, clock_now_us(), 60 * 1000000LL))
		log_warn("upstream %s: TLS handshake with %s failed: %s (%s); more within a minute are "
		         "only counted", ep->up->name, ep->name, tls_failure_name((enum tls_failure)f),
		         detail);
}
