/*
 * reconcile: the in-memory queue of unknown outcomes (see reconcile.h). One list under one
 * mutex, oldest first, never longer than keep; each record has a unique seq (for the
 * publisher, whose replies name records by seq, never by pointer) and two flags: published
 * (it reached the Redis stream) and in_flight (an XADD for it is waiting for its reply).
 * The pending gauge lives in worker slot 0 of the process figures and is written under the lock.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/time.h>
#include <time.h>

#include <event2/buffer.h>

#include "obs/reconcile.h"
#include "obs/stats.h"
#include "base/util.h"

#define ID_MAX 129
#define NAME_MAX_ 129
#define METHOD_MAX 32
#define PATH_MAX_ 1024
#define KEY_MAX 257
#define EP_MAX 256

struct entry {
	TAILQ_ENTRY(entry) link;
	uint64_t seq;
	char time[32];                  /* RFC 3339, UTC, milliseconds */
	char id[ID_MAX], upstream[NAME_MAX_], method[METHOD_MAX], path[PATH_MAX_], key[KEY_MAX];
	char endpoint[EP_MAX], last_outcome[16], attempts[16];
	bool has_key, published, in_flight;
};

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static TAILQ_HEAD(entry_head_, entry) q_list = TAILQ_HEAD_INITIALIZER(q_list);
static int64_t q_len, q_keep = 1000;
static uint64_t q_seq;

static void copy(char *dst, size_t cap, const char *s, size_t n)
{
	if (!s)
		n = 0;
	if (n >= cap)
		n = cap - 1;
	memcpy(dst, s ? s : "", n);
	dst[n] = '\0';
}

static void set_pending_locked(void)
{
	atomic_store_explicit(&g_gstats[0].reconcile_pending, q_len, memory_order_relaxed);
}

static void drop_locked(struct entry *e)
{
	TAILQ_REMOVE(&q_list, e, link);
	free(e);
	q_len--;
}

static void trim_locked(void)
{
	while (q_len > q_keep)
		drop_locked(TAILQ_FIRST(&q_list));
	set_pending_locked();
}

void reconcile_record(const struct reconcile_rec *r)
{
	struct entry *e = xcalloc(1, sizeof(*e));
	struct timeval tv;
	struct tm tm;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	size_t n = strftime(e->time, sizeof(e->time), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(e->time + n, sizeof(e->time) - n, ".%03dZ", (int)(tv.tv_usec / 1000));
	copy(e->id, sizeof(e->id), r->id, r->id ? strlen(r->id) : 0);
	copy(e->upstream, sizeof(e->upstream), r->upstream, r->upstream ? strlen(r->upstream) : 0);
	copy(e->method, sizeof(e->method), r->method, r->method ? strlen(r->method) : 0);
	copy(e->path, sizeof(e->path), r->path, r->path_len);
	e->has_key = r->key != NULL;
	copy(e->key, sizeof(e->key), r->key, r->key_len);
	copy(e->endpoint, sizeof(e->endpoint), r->endpoint, r->endpoint ? strlen(r->endpoint) : 0);
	copy(e->last_outcome, sizeof(e->last_outcome), r->last_outcome,
	     r->last_outcome ? strlen(r->last_outcome) : 0);
	snprintf(e->attempts, sizeof(e->attempts), "%d", r->attempts);

	pthread_mutex_lock(&q_lock);
	e->seq = ++q_seq;
	TAILQ_INSERT_TAIL(&q_list, e, link);
	q_len++;
	trim_locked();
	pthread_mutex_unlock(&q_lock);
}

void reconcile_set_keep(int64_t keep)
{
	pthread_mutex_lock(&q_lock);
	q_keep = keep > 0 ? keep : 1;
	trim_locked();
	pthread_mutex_unlock(&q_lock);
}

static void json_str(struct evbuffer *o, const char *name, const char *s)
{
	char esc[2 * PATH_MAX_ * 3];
	json_escape(esc, sizeof(esc), s, strlen(s));
	evbuffer_add_printf(o, "\"%s\":\"%s\"", name, esc);
}

void reconcile_render(struct evbuffer *o, const char *upstream)
{
	bool first = true;
	evbuffer_add(o, "[", 1);
	pthread_mutex_lock(&q_lock);
	struct entry *e;
	TAILQ_FOREACH_REVERSE(e, &q_list, entry_head_, link) {
		if (upstream && strcmp(upstream, e->upstream) != 0)
			continue;
		evbuffer_add_printf(o, "%s{", first ? "" : ",");
		first = false;
		json_str(o, "id", e->id);
		evbuffer_add(o, ",", 1);
		json_str(o, "time", e->time);
		evbuffer_add(o, ",", 1);
		json_str(o, "upstream", e->upstream);
		evbuffer_add(o, ",", 1);
		json_str(o, "method", e->method);
		evbuffer_add(o, ",", 1);
		json_str(o, "path", e->path);
		evbuffer_add(o, ",", 1);
		if (e->has_key)
			json_str(o, "idempotency_key", e->key);
		else
			evbuffer_add_printf(o, "\"idempotency_key\":null");
		evbuffer_add_printf(o, ",\"attempts\":%s,", e->attempts);
		json_str(o, "last_outcome", e->last_outcome);
		evbuffer_add(o, ",", 1);
		json_str(o, "endpoint", e->endpoint);
		evbuffer_add_printf(o, ",\"published\":%s}", e->published ? "true" : "false");
	}
	pthread_mutex_unlock(&q_lock);
	evbuffer_add(o, "]\n", 2);
}

bool reconcile_ack(const char *id)
{
	bool found = false;
	pthread_mutex_lock(&q_lock);
	struct entry *e = TAILQ_FIRST(&q_list), *next;
	for (; e; e = next) {
		next = TAILQ_NEXT(e, link);
		if (strcmp(e->id, id) == 0) {
			drop_locked(e);
			found = true;
		}
	}
	set_pending_locked();
	pthread_mutex_unlock(&q_lock);
	return found;
}

void reconcile_clear(void)
{
	pthread_mutex_lock(&q_lock);
	while (!TAILQ_EMPTY(&q_list))
		drop_locked(TAILQ_FIRST(&q_list));
	set_pending_locked();
	pthread_mutex_unlock(&q_lock);
}

/* ------------------------------------------------------------------ for the publisher */

static void put(struct reconcile_fields *f, const char *name, const char *value)
{
	f->argv[f->n] = name;
	f->lens[f->n++] = strlen(name);
	f->argv[f->n] = value;
	f->lens[f->n++] = strlen(value);
}

int reconcile_take_unpublished(int max, void (*fn)(void *arg, const struct reconcile_fields *f),
                               void *arg)
{
	int taken = 0;
	pthread_mutex_lock(&q_lock);
	struct entry *e;
	TAILQ_FOREACH(e, &q_list, link) {
		if (taken >= max)
			break;
		if (e->published || e->in_flight)
			continue;
		struct reconcile_fields f = { .seq = e->seq };
		put(&f, "id", e->id);
		put(&f, "time", e->time);
		put(&f, "upstream", e->upstream);
		put(&f, "method", e->method);
		put(&f, "path", e->path);
		if (e->has_key)
			put(&f, "idempotency_key", e->key);
		put(&f, "attempts", e->attempts);
		put(&f, "last_outcome", e->last_outcome);
		put(&f, "endpoint", e->endpoint);
		e->in_flight = true;
		fn(arg, &f);
		taken++;
	}
	pthread_mutex_unlock(&q_lock);
	return taken;
}

void reconcile_publish_done(uint64_t seq, bool ok)
{
	pthread_mutex_lock(&q_lock);
	struct entry *e;
	TAILQ_FOREACH(e, &q_list, link)
		if (e->seq == seq) {
			e->in_flight = false;
			e->published = ok;
			break;
		}
	pthread_mutex_unlock(&q_lock);
}

bool reconcile_have_unpublished(void)
{
	bool any = false;
	pthread_mutex_lock(&q_lock);
	struct entry *e;
	TAILQ_FOREACH(e, &q_list, link)
		if (!e->published && !e->in_flight) {
			any = true;
			break;
		}
	pthread_mutex_unlock(&q_lock);
	return any;
}

void reconcile_unflight_all(void)
{
	pthread_mutex_lock(&q_lock);
	struct entry *e;
	TAILQ_FOREACH(e, &q_list, link)
		e->in_flight = false;
	pthread_mutex_unlock(&q_lock);
}

void reconcile_count_error(void)
{
	pthread_mutex_lock(&q_lock);
	STAT_INC(g_gstats[0].reconcile_publish_errors);
	pthread_mutex_unlock(&q_lock);
}
