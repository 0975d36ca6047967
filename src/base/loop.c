/*
 * loop: one worker's event base, DNS base, rng and deferred-free queue (see loop.h).
 */
#include <malloc.h>
#include <stdbool.h>
#include <stdlib.h>

#include <string.h>

#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/event.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/loop.h"
#include "base/util.h"

static void dq_cb(evutil_socket_t fd, short what, void *arg)
{
	loop_run_deferred(arg);
}

void loop_run_deferred(struct loop *l)
{
	/* frees may queue more frees: the count is re-read every round */
	for (int i = 0; i < l->ndq; i++)
		l->dq[i].fn(l->dq[i].p);
	l->ndq = 0;
}

void loop_defer_free(struct loop *l, void (*fn)(void *), void *p)
{
	if (l->ndq == l->capdq) {
		l->capdq = l->capdq ? l->capdq * 2 : 64;
		l->dq = xrealloc(l->dq, sizeof(*l->dq) * (size_t)l->capdq);
	}
	l->dq[l->ndq].fn = fn;
	l->dq[l->ndq].p = p;
	if (l->ndq++ == 0)
		event_active(l->dq_ev, EV_TIMEOUT, 0);
}

/* Free the DROP entries at the cold end of a LIFO list of N (the last ones pushed are taken
 * first, so the tail is what went longest unused). The new length. */
static int list_drop(struct loop_free **head, int n, int drop)
{
	if (drop <= 0)
		return n;
	struct loop_free **cut = head;
	for (int i = 0; i < n - drop; i++)
		cut = &(*cut)->next;
	struct loop_free *f = *cut;
	*cut = NULL;
	while (f) {
		struct loop_free *next = f->next;
		free(f);
		f = next;
	}
	return n - drop;
}

void loop_scavenge(struct loop *l)
{
	for (int c = 0; c < LOOP_CHUNK_CLASSES; c++)
		l->nchunk[c] = l->lowchunk[c] = list_drop(&l->chunk[c], l->nchunk[c], l->lowchunk[c]);
	for (int k = 0; k < LOOP_NKINDS; k++)
		l->ncache[k] = l->lowcache[k] = list_drop(&l->cache[k], l->ncache[k], l->lowcache[k]);
	for (int c = 0; c < LOOP_BLK_CLASSES; c++)
		l->nblk[c] = l->lowblk[c] = list_drop(&l->blk[c], l->nblk[c], l->lowblk[c]);
	/* the buffers are a stack: the bottom ones went longest unused */
	int drop = l->lowbufs;
	if (drop > 0) {
		for (int i = 0; i < drop; i++)
			evbuffer_free(l->bufs[i]);
		l->nbufs -= drop;
		memmove(l->bufs, l->bufs + drop, sizeof(*l->bufs) * (size_t)l->nbufs);
	}
	l->lowbufs = l->nbufs;
}

static void scavenge_cb(evutil_socket_t fd, short what, void *arg)
{
	loop_scavenge(arg);
}

/* ------------------------------------------------------------------ timers (loop.h) */

/* A timeout length's list key: its bit length and the three bits after its leading one, so a
 * list holds lengths within 1/8 of each other (a deadline's remaining time varies by the
 * microseconds of a request's handling; a per-try timeout not at all). */
static int tq_key_of(int64_t us)
{
	if (us < 8)
		return (int)us;
	int bits = 64 - __builtin_clzll((unsigned long long)us);
	return bits << 3 | (int)((us >> (bits - 4)) & 7);
}

static void tq_arm(struct loop *l, int64_t due, int64_t now)
{
	struct timeval tv = clock_tv(due - now);
	evtimer_add(l->tq_ev, &tv);
	l->tq_armed_us = due;
}

void loop_timer_add(struct loop *l, struct loop_timer *t, int64_t us, void (*cb)(void *), void *arg)
{
	loop_timer_del(l, t);
	if (us < 0)
		us = 0;
	int64_t now = clock_now_us();
	t->due_us = now + us;
	t->seq = ++l->tq_seq;
	t->cb = cb;
	t->arg = arg;
	/* its length's list (a list keeps its length while empty); else an empty one, given
	 * that length; else the first (any list works: the insertion below keeps each in due
	 * order, it is only slower) */
	int key = tq_key_of(us), q = 0;
	while (q < LOOP_TQ && l->tq_key[q] != key)
		q++;
	if (q == LOOP_TQ) {
		q = 0;
		for (int i = 0; i < LOOP_TQ; i++)
			if (TAILQ_EMPTY(&l->tq[i])) {
				q = i;
				l->tq_key[q] = key;
				break;
			}
	}
	struct loop_timer *p = TAILQ_LAST(&l->tq[q], loop_tq_list);
	while (p && p->due_us > t->due_us)
		p = TAILQ_PREV(p, loop_tq_list, link);
	if (p)
		TAILQ_INSERT_AFTER(&l->tq[q], p, t, link);
	else
		TAILQ_INSERT_HEAD(&l->tq[q], t, link);
	t->q = q + 1;
	if (!l->tq_armed_us || t->due_us < l->tq_armed_us)
		tq_arm(l, t->due_us, now);
}

void loop_timer_del(struct loop *l, struct loop_timer *t)
{
	if (!t->q)
		return;
	TAILQ_REMOVE(&l->tq[t->q - 1], t, link);
	t->q = 0;
	/* the libevent timer stays: it finds nothing due and is armed for what is left */
}

/* Fire what is due by the clock read once here, oldest first; a timer armed meanwhile (even
 * for 0) waits for the next turn. Then arm for the earliest left. */
static void tq_cb(evutil_socket_t fd, short what, void *arg)
{
	struct loop *l = arg;
	l->tq_armed_us = 0;
	int64_t now = clock_now_us();
	uint64_t seen = l->tq_seq;
	for (;;) {
		struct loop_timer *first = NULL;
		for (int i = 0; i < LOOP_TQ; i++) {
			struct loop_timer *h = TAILQ_FIRST(&l->tq[i]);
			if (h && (!first || h->due_us < first->due_us))
				first = h;
		}
		if (!first)
			return;
		if (first->due_us > now || first->seq > seen) {
			if (!l->tq_armed_us || first->due_us < l->tq_armed_us)
				tq_arm(l, first->due_us, now);
			return;
		}
		loop_timer_del(l, first);
		first->cb(first->arg);
	}
}

/* ------------------------------------------------------------------ soon (loop.h) */

void loop_soon_add(struct loop *l, struct loop_soon *w, void (*fn)(void *), void *arg)
{
	if (w->queued)
		return;
	w->fn = fn;
	w->arg = arg;
	w->queued = true;
	if (!l->soon_armed) {
		l->soon_armed = true;
		event_active(l->soon_ev, EV_TIMEOUT, 0);
	}
	TAILQ_INSERT_TAIL(&l->soon, w, link);
}

void loop_soon_del(struct loop *l, struct loop_soon *w)
{
	if (!w->queued)
		return;
	TAILQ_REMOVE(&l->soon, w, link);
	w->queued = false;
}

static void soon_cb(evutil_socket_t fd, short what, void *arg)
{
	struct loop *l = arg;
	struct loop_soon *w;
	while ((w = TAILQ_FIRST(&l->soon))) {      /* what is queued meanwhile runs here too */
		TAILQ_REMOVE(&l->soon, w, link);
		w->queued = false;
		w->fn(w->arg);
	}
	l->soon_armed = false;
}

int loop_init(struct loop *l, int id)
{
	/* one thread per loop: no locks (cross-thread news comes through the worker's eventfd) */
	struct event_config *ec = event_config_new();
	event_config_set_flag(ec, EVENT_BASE_FLAG_NOLOCK);
	l->base = event_base_new_with_config(ec);
	event_config_free(ec);
	if (!l->base)
		return -1;
	l->id = id;
	l->dns = evdns_base_new(l->base, EVDNS_BASE_INITIALIZE_NAMESERVERS | EVDNS_BASE_DISABLE_WHEN_INACTIVE);
	if (!l->dns)
		l->dns = evdns_base_new(l->base, EVDNS_BASE_DISABLE_WHEN_INACTIVE);
	/* without a resolv.conf libevent skips /etc/hosts: names must still resolve from it */
	evdns_base_load_hosts(l->dns, NULL);
	l->rng = (uint64_t)clock_now_us() * 0x9e3779b97f4a7c15ull + (uint64_t)id + 1;
	l->dq_ev = event_new(l->base, -1, 0, dq_cb, l);
	l->scavenge_ev = event_new(l->base, -1, EV_PERSIST, scavenge_cb, l);
	struct timeval tv = clock_tv(LOOP_SCAVENGE_US);
	evtimer_add(l->scavenge_ev, &tv);
	for (int i = 0; i < LOOP_TQ; i++)
		TAILQ_INIT(&l->tq[i]);
	l->tq_ev = event_new(l->base, -1, 0, tq_cb, l);
	TAILQ_INIT(&l->soon);
	l->soon_ev = event_new(l->base, -1, 0, soon_cb, l);
	loop_fd_seen(l, 0);             /* the first block now, before any connection */
	return 0;
}

static _Thread_local bool quiet;     /* loop_fd_seen provokes libevent warnings on purpose */

static void libevent_log_cb(int severity, const char *msg)
{
	if (quiet)
		return;
	enum log_level lvl = severity == EVENT_LOG_ERR ? LOG_ERROR
	                   : severity == EVENT_LOG_WARN ? LOG_WARN
	                   : severity == EVENT_LOG_MSG ? LOG_INFO : LOG_DEBUG;
	slog(lvl, 0, "libevent: %s", msg);
}

int64_t clock_timer_slack_us;

/* The sanitizer build (RG_CHECK_MAGIC) keeps nothing: reused memory would hide a
 * use-after-free from AddressSanitizer. */
#ifdef RG_CHECK_MAGIC
#define KEEP_FREED 0
#else
#define KEEP_FREED 1
#endif

static _Thread_local struct loop *tl_loop;     /* loop_enter's: whose chunk lists serve here */

void loop_enter(struct loop *l)
{
	tl_loop = l;
}

/* The chunk class of an allocation of exactly N bytes, or -1 (see LOOP_CHUNK_MIN). */
static int chunk_class_of_size(size_t n)
{
	if (n < LOOP_CHUNK_MIN || (n & (n - 1)) || n > (size_t)LOOP_CHUNK_MIN << (LOOP_CHUNK_CLASSES - 1))
		return -1;
	return __builtin_ctzl(n) - __builtin_ctzl(LOOP_CHUNK_MIN);
}

static void *ev_malloc(size_t n)
{
	struct loop *l = tl_loop;
	int c;
	if (KEEP_FREED && l && (c = chunk_class_of_size(n)) >= 0 && l->chunk[c]) {
		struct loop_free *f = l->chunk[c];
		l->chunk[c] = f->next;
		if (--l->nchunk[c] < l->lowchunk[c])
			l->lowchunk[c] = l->nchunk[c];
		return f;
	}
	return xmalloc(n);
}

/* A block that holds at least a class's size (and less than twice it) serves that class. */
static void ev_free(void *p)
{
	struct loop *l = tl_loop;
	if (KEEP_FREED && l && p) {
		size_t u = malloc_usable_size(p);
		if (u >= LOOP_CHUNK_MIN && u < (size_t)LOOP_CHUNK_MIN << LOOP_CHUNK_CLASSES) {
			int c = (int)(sizeof(long) * 8 - 1 - (size_t)__builtin_clzl(u)) -
			        __builtin_ctzl(LOOP_CHUNK_MIN);
			if (l->nchunk[c] < (LOOP_CHUNK_BYTES / LOOP_CHUNK_MIN) >> c) {
				struct loop_free *f = p;
				f->next = l->chunk[c];
				l->chunk[c] = f;
				l->nchunk[c]++;
				return;
			}
		}
	}
	free(p);
}

void loop_global_init(void)
{
#ifdef CLOCK_MONOTONIC_COARSE
	struct timespec res;
	if (clock_getres(CLOCK_MONOTONIC_COARSE, &res) == 0 && res.tv_sec == 0)
		clock_timer_slack_us = (res.tv_nsec + 999) / 1000;
#endif
	/* one policy for running out of memory: libevent's allocations abort as ours do, so no
	 * caller has to check an event_new or evbuffer_new for NULL */
	event_set_mem_functions(ev_malloc, xrealloc, ev_free);
	event_set_log_callback(libevent_log_cb);
}

static void fd_noop_cb(evutil_socket_t fd, short what, void *arg)
{
}

/* Adding a read event for a number makes its entry, whether or not the number is open: a free
 * number fails in epoll_ctl (EBADF, one system call, the warning dropped); one open elsewhere
 * in the process is added to this base's epoll and removed before the loop runs again; one
 * this base already watches costs no system call. */
void loop_fd_seen(struct loop *l, int fd)
{
	if (fd < l->fd_room)
		return;
	int end = (fd / LOOP_FD_STEP + 1) * LOOP_FD_STEP;
	struct event *ev = event_new(l->base, -1, 0, fd_noop_cb, NULL);
	if (!ev)
		return;
	quiet = true;
	for (int n = l->fd_room; n < end; n++) {
		event_assign(ev, l->base, n, EV_READ, fd_noop_cb, NULL);
		if (event_add(ev, NULL) == 0)
			event_del(ev);
	}
	quiet = false;
	event_free(ev);
	l->fd_room = end;
}

void loop_free_dns(struct loop *l)
{
	loop_run_deferred(l);
	if (l->dns)
		evdns_base_free(l->dns, 1);     /* pending lookups are answered "cancelled" */
	l->dns = NULL;
	loop_run_deferred(l);
}

void loop_fini(struct loop *l)
{
	loop_run_deferred(l);
	/* streams free their memory from the loop: let those run */
	event_base_loop(l->base, EVLOOP_NONBLOCK);
	loop_run_deferred(l);
	event_free(l->dq_ev);
	l->dq_ev = NULL;
	event_free(l->scavenge_ev);
	l->scavenge_ev = NULL;
	event_free(l->tq_ev);
	l->tq_ev = NULL;
	event_free(l->soon_ev);
	l->soon_ev = NULL;
	/* every entry unused: one more tick frees them all */
	for (int k = 0; k < LOOP_NKINDS; k++)
		l->lowcache[k] = l->ncache[k];
	for (int c = 0; c < LOOP_BLK_CLASSES; c++)
		l->lowblk[c] = l->nblk[c];
	l->lowbufs = l->nbufs;
	for (int c = 0; c < LOOP_CHUNK_CLASSES; c++)
		l->lowchunk[c] = l->nchunk[c];
	loop_scavenge(l);
	if (tl_loop == l)
		tl_loop = NULL;
	free(l->bufs);
	l->bufs = NULL;
	free(l->dq);
	l->dq = NULL;
	l->ndq = l->capdq = 0;
}

void loop_free_base(struct loop *l)
{
	if (l->base)
		event_base_free(l->base);
	l->base = NULL;
}

void *loop_obj_get(struct loop *l, enum loop_kind kind, size_t size)
{
	struct loop_free *f = l->cache[kind];
	if (!f)
		return xcalloc(1, size);
	l->cache[kind] = f->next;
	if (--l->ncache[kind] < l->lowcache[kind])
		l->lowcache[kind] = l->ncache[kind];
	memset(f, 0, size);
	return f;
}

void loop_obj_put(struct loop *l, enum loop_kind kind, void *p)
{
	if (!KEEP_FREED || l->ncache[kind] >= LOOP_CACHE_MAX) {
		free(p);
		return;
	}
	struct loop_free *f = p;
	f->next = l->cache[kind];
	l->cache[kind] = f;
	l->ncache[kind]++;
}

struct evbuffer *loop_buf_get(struct loop *l)
{
	if (l->nbufs == 0)
		return evbuffer_new();
	if (--l->nbufs < l->lowbufs)
		l->lowbufs = l->nbufs;
	return l->bufs[l->nbufs];
}

void loop_buf_put(struct loop *l, struct evbuffer *b)
{
	if (!b)
		return;
	if (!KEEP_FREED || l->nbufs >= LOOP_BUF_MAX) {
		evbuffer_free(b);
		return;
	}
	if (!l->bufs)
		l->bufs = xcalloc(LOOP_BUF_MAX, sizeof(*l->bufs));
	size_t left = evbuffer_get_length(b);
	if (left > 0)       /* most come back empty: no drain call for them */
		evbuffer_drain(b, left);
	l->bufs[l->nbufs++] = b;
}

/* Every block starts with this header (16 bytes, so the payload keeps malloc's alignment): its
 * class, or BLK_LARGE for a block from malloc of its own size. */
struct blk_head {
	uint32_t cls;
	uint32_t pad[3];
};
#define BLK_LARGE 0xffffffffu
#define BLK_MIN 32

static size_t blk_class_size(uint32_t cls)
{
	return (size_t)BLK_MIN << cls;
}

void *loop_blk_alloc(struct loop *l, size_t n)
{
	uint32_t cls = 0;
	while (cls < LOOP_BLK_CLASSES && blk_class_size(cls) < n)
		cls++;
	struct blk_head *h;
	if (cls == LOOP_BLK_CLASSES) {
		h = malloc(sizeof(*h) + n);
		if (!h)
			return NULL;
		h->cls = BLK_LARGE;
		return h + 1;
	}
	struct loop_free *f = l->blk[cls];
	if (f) {
		l->blk[cls] = f->next;
		if (--l->nblk[cls] < l->lowblk[cls])
			l->lowblk[cls] = l->nblk[cls];
		h = (struct blk_head *)f;
	} else {
		h = malloc(sizeof(*h) + blk_class_size(cls));
		if (!h)
			return NULL;
	}
	h->cls = cls;
	return h + 1;
}

void loop_blk_free(struct loop *l, void *p)
{
	if (!p)
		return;
	struct blk_head *h = (struct blk_head *)p - 1;
	uint32_t cls = h->cls;
	if (cls == BLK_LARGE || !KEEP_FREED || l->nblk[cls] >= LOOP_BLK_MAX) {
		free(h);
		return;
	}
	struct loop_free *f = (struct loop_free *)h;
	f->next = l->blk[cls];
	l->blk[cls] = f;
	l->nblk[cls]++;
}

void *loop_blk_realloc(struct loop *l, void *p, size_t n)
{
	if (!p)
		return loop_blk_alloc(l, n);
	struct blk_head *h = (struct blk_head *)p - 1;
	if (h->cls == BLK_LARGE && n > blk_class_size(LOOP_BLK_CLASSES - 1)) {
		struct blk_head *g = realloc(h, sizeof(*h) + n);
		return g ? g + 1 : NULL;
	}
	if (h->cls != BLK_LARGE && n <= blk_class_size(h->cls))
		return p;
	/* the old size is the class's, or at least what a large block was asked for */
	size_t old = h->cls == BLK_LARGE ? n : blk_class_size(h->cls);
	void *q = loop_blk_alloc(l, n);
	if (!q)
		return NULL;
	memcpy(q, p, old < n ? old : n);
	loop_blk_free(l, p);
	return q;
}

void loop_buf_hold(struct evbuffer *dst, struct evbuffer *data)
{
	size_t n = evbuffer_get_length(data);
	if (n >= 1024) {
		evbuffer_add_buffer(dst, data);
		return;
	}
	evbuffer_add(dst, evbuffer_pullup(data, (ev_ssize_t)n), n);
	evbuffer_drain(data, n);
}
