/*
 * loop: what every object of one worker thread shares, and the only thing lower files see of
 * the worker (DESIGN rule 7): the event base, the DNS base, a random generator, the worker's
 * index (its slot in per-worker counters), the per-worker connection pools (HTTP/1.1 and
 * HTTP/2), and the
 * deferred-free queue.
 *
 * Deferred free: loop_defer_free() queues a free that runs once the current callback stack has
 * unwound, so a callback may close an object its caller still holds. Nothing here is touched
 * by another thread.
 */
#ifndef RG_LOOP_H
#define RG_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

struct event_base;
struct evdns_base;
struct event;
struct pool_table;
struct h2_table;
struct evbuffer;

/* Per-loop free lists for what every request allocates: its exchange and attempts, an HTTP/2
 * client stream (h2_session), and the evbuffers they use. Bounded (LOOP_CACHE_MAX objects a
 * kind, LOOP_BUF_MAX buffers), and what a list did not need for a whole LOOP_SCAVENGE_US is
 * freed (below), so a burst leaves nothing behind for long; loop_fini frees the rest. A
 * request in flight holds up to five buffers (an HTTP/2 client stream two, the exchange one,
 * its attempt two), so the buffer list holds five times the objects' 64 and more: at 256, 64
 * streams in flight returned more than it kept and each batch after them made a fifth of its
 * buffers anew (an evbuffer_new and an evbuffer_free per request). An empty evbuffer is about
 * 150 bytes. */
enum loop_kind { LOOP_EXCHANGE, LOOP_ATTEMPT, LOOP_H2_STREAM, LOOP_NKINDS };
#define LOOP_CACHE_MAX 64
#define LOOP_BUF_MAX 1024

struct loop_free {
	struct loop_free *next;
};

/* Small blocks for a library that allocates per frame (nghttp2: frames, stream objects, header
 * lists): LOOP_BLK_CLASSES sizes from 32 to 1024 bytes, each with a bounded free list
 * (LOOP_BLK_MAX), larger blocks straight from malloc. */
#define LOOP_BLK_CLASSES 6
#define LOOP_BLK_MAX 512

/* libevent's own allocations of 1, 2, 4, 8 and 16 KiB (the chains of bytes in an evbuffer:
 * libevent frees a chain as soon as it is drained, so every request made four of them, each
 * a malloc and a free that glibc's per-thread cache, 7 deep, does not absorb with 64 requests
 * in flight): LOOP_CHUNK_CLASSES lists on the loop whose thread is running (loop_enter), each
 * bounded by LOOP_CHUNK_BYTES and scavenged like the others. A block's class on free is read
 * from malloc_usable_size, so nothing is added to it. */
#define LOOP_CHUNK_MIN 1024
#define LOOP_CHUNK_CLASSES 5
#define LOOP_CHUNK_BYTES (512 * 1024)

/* Each list keeps its low-water mark: the fewest entries it held since the last tick. Those
 * were never taken, so at each tick (every LOOP_SCAVENGE_US) that many are freed, the longest
 * unused first. A steady load keeps what it uses and loses only what it never reaches; after a
 * burst every list is empty within two ticks. Kept entries lie among the burst's other
 * memory, pinning its pages until they go (measured, 5,000 HTTP/1.1 connections on two
 * workers: RSS +4.9..+7.4 MiB with up to 1,024 buffers a loop kept for good; back to its level
 * before the burst once they are freed and the process trims). */
#define LOOP_SCAVENGE_US 1000000

/*
 * Timers for what is armed and stopped on every request and almost never fires (an attempt's
 * head timeout, an exchange's deadline, a client connection's idle time): arming one links it
 * into a list and stopping it unlinks it, where a libevent timer costs an event_add and an
 * event_del (its heap, about 450 instructions a pair). The loop keeps LOOP_TQ lists, each for
 * timeouts of about one length (the same order of magnitude and leading bits), so a new
 * timer almost always goes at its list's tail; one libevent timer is armed for the earliest
 * due time and moved only when a timer due before it is armed. It goes off only once the
 * precise clock reached a timer's due time, so none fires early; like any timer it may fire a
 * tick late (clock_tv). A zeroed struct loop_timer is not armed.
 */
struct loop_timer {
	TAILQ_ENTRY(loop_timer) link;
	int64_t due_us;
	uint64_t seq;                   /* when it was armed (loop's tq_seq) */
	void (*cb)(void *arg);
	void *arg;
	int q;                          /* its list + 1; 0: not armed */
};
TAILQ_HEAD(loop_tq_list, loop_timer);
#define LOOP_TQ 8

/*
 * Work to run soon: after the callbacks libevent already queued in this loop turn (a stream's
 * flush, read and report). One libevent event per loop, made active when the list stops being
 * empty, runs the list until it is empty (work queued meanwhile included, as an event made
 * active from a callback would run in the same turn): where every stream had its own event,
 * each request paid two event_active calls and two dispatches. A zeroed struct loop_soon is not
 * queued; unqueue it before its memory goes.
 */
struct loop_soon {
	TAILQ_ENTRY(loop_soon) link;
	void (*fn)(void *arg);
	void *arg;
	bool queued;
};
TAILQ_HEAD(loop_soon_list, loop_soon);

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
	struct h2_table *h2;            /* h2_conn.c's HTTP/2 upstream connections, likewise */
	struct loop_deferred *dq;
	int ndq, capdq;
	struct event *dq_ev;
	struct loop_free *cache[LOOP_NKINDS];
	int ncache[LOOP_NKINDS], lowcache[LOOP_NKINDS];
	struct evbuffer **bufs;         /* empty evbuffers, for reuse */
	int nbufs, lowbufs;
	struct loop_free *blk[LOOP_BLK_CLASSES];
	int nblk[LOOP_BLK_CLASSES], lowblk[LOOP_BLK_CLASSES];
	struct loop_free *chunk[LOOP_CHUNK_CLASSES];
	int nchunk[LOOP_CHUNK_CLASSES], lowchunk[LOOP_CHUNK_CLASSES];
	struct event *scavenge_ev;      /* frees what the lists did not need (LOOP_SCAVENGE_US) */
	struct loop_tq_list tq[LOOP_TQ];
	int tq_key[LOOP_TQ];            /* the timeout length each list holds (tq_key_of) */
	struct event *tq_ev;            /* armed for the earliest due time, or not at all */
	int64_t tq_armed_us;            /* that due time; 0: not armed */
	struct loop_soon_list soon;     /* loop_soon_add's */
	struct event *soon_ev;          /* active (or running) while the list is not empty */
	bool soon_armed;
	uint64_t tq_seq;                /* timers armed so far */
	int fd_room;                    /* fd numbers below this have their libevent entry */
};

/* Create the event base (no locks: one thread per loop) and DNS base, after
 * loop_global_init. 0 or -1. */
int loop_init(struct loop *l, int id);
/* The loop's thread, once, before it runs L: libevent's allocations on this thread come from
 * L's chunk lists from now until loop_fini. */
void loop_enter(struct loop *l);
/* Run every deferred free now (frees may queue more: runs until empty). */
void loop_run_deferred(struct loop *l);
/* After the loop stopped: free the DNS base (pending lookups are cancelled: their owners must
 * still exist), then, once everything was closed, run the last frees (the event base stays for
 * loop_free_base, after the thread is joined). */
void loop_free_dns(struct loop *l);
void loop_fini(struct loop *l);
void loop_free_base(struct loop *l);

void loop_defer_free(struct loop *l, void (*fn)(void *), void *p);

/* A socket numbered FD was registered with the base. libevent keeps a small entry per fd
 * number (made at the first event_add of that number, freed with the base); made one at a
 * time as a burst of connections climbs the numbers, they land among the connections' own
 * memory, and once the burst has gone they pin its pages (no trim can return a page holding a
 * live byte): about two pages per fd number. So the entries are made ahead, LOOP_FD_STEP
 * numbers at once, where they sit together. Cheap unless FD is past the numbers seen. */
#define LOOP_FD_STEP 1024
void loop_fd_seen(struct loop *l, int fd);

/* Once per process, before any other libevent call: libevent allocates with xmalloc (out of
 * memory aborts), and its own messages go to the log (those loop_fd_seen provokes on purpose
 * are dropped). */
void loop_global_init(void);

/* Arm T (re-arm it if armed) to call CB(ARG) in US microseconds (0: on the next loop turn),
 * on L's thread; stop it (stopped or never armed: nothing). Stop it before its memory goes. */
void loop_timer_add(struct loop *l, struct loop_timer *t, int64_t us, void (*cb)(void *), void *arg);
void loop_timer_del(struct loop *l, struct loop_timer *t);
static inline bool loop_timer_pending(const struct loop_timer *t)
{
	return t->q != 0;
}

/* Queue W (already queued: nothing) to call FN(ARG) soon; unqueue it. On L's thread. */
void loop_soon_add(struct loop *l, struct loop_soon *w, void (*fn)(void *), void *arg);
void loop_soon_del(struct loop *l, struct loop_soon *w);

/* Free what each list did not need since the last call (LOOP_SCAVENGE_US above); loop_init
 * arms a timer that calls it. */
void loop_scavenge(struct loop *l);
/* SIZE zeroed bytes for an object of KIND (every object of a kind has the same size). */
void *loop_obj_get(struct loop *l, enum loop_kind kind, size_t size);
/* Give it back (only from the loop's thread; immediately reusable, so free it late). */
void loop_obj_put(struct loop *l, enum loop_kind kind, void *p);
/* N bytes (16-byte aligned), its size class from the loop's free lists; free, resize (as
 * free/realloc; NULL is valid) only from the loop's thread. */
void *loop_blk_alloc(struct loop *l, size_t n);
void loop_blk_free(struct loop *l, void *p);
void *loop_blk_realloc(struct loop *l, void *p, size_t n);
/* Append DATA (drained) to DST, a buffer that holds bytes for a while (a body kept for
 * replay): small pieces are copied, since a moved chain keeps its whole allocation (1 KiB or
 * more for a 100-byte piece), so memory held follows the bytes counted. */
void loop_buf_hold(struct evbuffer *dst, struct evbuffer *data);
/* An empty evbuffer; and give one back (drained here). */
struct evbuffer *loop_buf_get(struct loop *l);
void loop_buf_put(struct loop *l, struct evbuffer *b);

#endif
