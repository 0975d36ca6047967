/*
 * accesslog: JSON lines. Workers format a line on their own stack and append it to one shared
 * backlog under a mutex (a copy, nothing else: a worker never writes to the log's descriptor);
 * one writer thread takes the whole backlog at a time and writes it out, when it passes
 * ACCESS_FLUSH_BYTES and on the main thread's flush timer, so a line reaches the file within a
 * fraction of a second. A reader that does not keep up (a full stdout pipe) stalls only the
 * writer: past ACCESS_BACKLOG_BYTES waiting, new lines are dropped and counted
 * (retrygate_access_log_dropped_lines_total), and requests go on at their normal speed.
 *
 * The two buffers (the backlog and the one being written out) are mapped once at their full
 * size; only the pages a burst touched are resident, and the writer gives back what lies past
 * ACCESS_KEEP_BYTES once it is written: after a burst the process returns to its size.
 *
 * A change of target (reload, SIGUSR1 reopen) is queued at a place in the backlog: the lines
 * before it go to the old descriptor, the later ones to the new; only the writer closes
 * descriptors. The main thread alone opens, switches and closes (al_path is its own).
 */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "obs/accesslog.h"
#include "obs/stats.h"
#include "base/log.h"
#include "config/config.h"
#include "http/grpc.h"
#include "http/h1_parser.h"
#include "base/util.h"

#define ACCESS_FLUSH_BYTES   (64 * 1024)         /* the writer is woken at this much */
#define ACCESS_BACKLOG_BYTES (4 * 1024 * 1024)   /* lines past this are dropped */
#define ACCESS_KEEP_BYTES    (128 * 1024)        /* resident between bursts (page multiple) */
#define ACCESS_CLOSE_WAIT_S  2                   /* at exit, for the backlog to go out */

static pthread_mutex_t al_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t al_wake = PTHREAD_COND_INITIALIZER;   /* the writer has work */
static pthread_cond_t al_gone = PTHREAD_COND_INITIALIZER;   /* the writer ended */
static atomic_bool al_on;           /* lines are taken (read unlocked: skip formatting) */
static char *al_buf;                /* the backlog (ACCESS_BACKLOG_BYTES mapped) */
static char *al_spare;              /* the other buffer: the writer's while it runs */
static size_t al_len;
static bool al_kick;                /* write the backlog out now */
static bool al_switch;              /* a new descriptor from al_switch_at of the backlog on */
static size_t al_switch_at;
static int al_next_fd = -1;         /* -1: none (off) */
static bool al_started, al_stop, al_ended;
static pthread_t al_thread;
static char *al_path;               /* main thread: the file's path (NULL: stdout or off) */

void access_begin(struct access_rec *r, uint64_t sid, const char *peer, const struct http_head *req,
                  const char *reqid)
{
	memset(r, 0, sizeof(*r));
	r->req = req;
	r->reqid = reqid;
	r->sid = sid;
	r->peer = peer;
	r->last_out = OUT_NONE;
	r->grpc_status = -1;
}

void access_set_route(struct access_rec *r, const struct cfg_route *route, const char *upstream)
{
	r->route_host = route->host;
	r->route_prefix = route->path_prefix;
	r->upstream = upstream;
}

void access_set_key(struct access_rec *r, const char *key, size_t len)
{
	r->key = key;
	r->keylen = len;
}

void access_add_attempt(struct access_rec *r, const char *ep)
{
	if (r->natt < ACCESS_MAX_ATTEMPTS) {
		r->att[r->natt].ep = ep;
		r->att[r->natt].outcome = NULL;
		r->att[r->natt].status = 0;
		r->att[r->natt].fault = NULL;
		r->att[r->natt].grpc_status = -1;
		r->att[r->natt].hedge = r->att[r->natt].won = false;
	}
	r->cur = r->natt++;
}

void access_add_hedge(struct access_rec *r, const char *ep)
{
	access_add_attempt(r, ep);
	if (r->cur < ACCESS_MAX_ATTEMPTS)
		r->att[r->cur].hedge = true;
}

void access_select(struct access_rec *r, int idx)
{
	if (idx >= 0 && idx < r->natt)
		r->cur = idx;
}

void access_set_won(struct access_rec *r, int idx)
{
	if (idx >= 0 && idx < r->natt && idx < ACCESS_MAX_ATTEMPTS)
		r->att[idx].won = true;
}

void access_set_outcome(struct access_rec *r, const char *outcome)
{
	if (r->natt > 0 && r->cur < ACCESS_MAX_ATTEMPTS)
		r->att[r->cur].outcome = outcome;
}

void access_set_status(struct access_rec *r, int status)
{
	if (r->natt > 0 && r->cur < ACCESS_MAX_ATTEMPTS)
		r->att[r->cur].status = status;
}

void access_set_fault(struct access_rec *r, const char *kind)
{
	if (r->natt > 0 && r->cur < ACCESS_MAX_ATTEMPTS)
		r->att[r->cur].fault = kind;
}

void access_set_grpc_status(struct access_rec *r, int code)
{
	if (r->natt > 0 && r->cur < ACCESS_MAX_ATTEMPTS && code >= 0 && code < GRPC_NCODES)
		r->att[r->cur].grpc_status = code;
}

void access_set_held(struct access_rec *r, const char *ep, int64_t ms)
{
	r->held_ep = ep;
	r->held_ms = ms;
}

const char *access_unknown_cause(const struct access_rec *r)
{
	if (!r->non_idempotent || r->attempts == 0)
		return NULL;
	/* the last attempt may have executed, whatever an earlier attempt answered (SPEC §6) */
	if (r->last_out == OUT_RESET || r->last_out == OUT_TIMEOUT)
		return outcome_name(r->last_out);
	/* a gRPC error the upstream answered (retrygate's own answers name a reason) that is not
	 * definite: the call may have run, as after a 5xx (SPEC §10) */
	if (r->grpc_answered && !r->not_executed && !grpc_definite(r->grpc_status))
		return grpc_status_name(r->grpc_status);
	return NULL;
}

const char *access_outcome(const struct access_rec *r)
{
	if (access_unknown_cause(r))
		return "unknown";
	if (r->grpc_status >= 0)
		return r->grpc_status == GRPC_OK ? "ok" : "failed";
	if (r->ok_response && r->status < 500)
		return "ok";
	return "failed";
}

static void append(char *line, size_t *n, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void append(char *line, size_t *n, size_t cap, const char *fmt, ...)
{
	if (*n >= cap)
		return;
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(line + *n, cap - *n, fmt, ap);
	va_end(ap);
	if (k > 0)
		*n += (size_t)k < cap - *n ? (size_t)k : cap - *n - 1;
}

static void write_all(int fd, const char *p, size_t n)
{
	while (fd >= 0 && n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return;         /* the lines are lost; the log's reader is gone or the disk full */
		}
		p += w;
		n -= (size_t)w;
	}
}

static void close_target(int fd)
{
	if (fd > STDOUT_FILENO)
		close(fd);
}

/* The writer thread: the only one that writes to or closes a log descriptor. */
static void *writer_main(void *arg)
{
	int fd = -1;
	pthread_mutex_lock(&al_lock);
	for (;;) {
		while (!al_kick && !al_switch && !al_stop)
			pthread_cond_wait(&al_wake, &al_lock);
		if (al_stop && al_len == 0 && !al_switch)
			break;
		/* take the whole backlog by swapping buffers: workers append to the other one
		 * meanwhile */
		char *b = al_buf;
		size_t n = al_len, at = al_switch ? al_switch_at : al_len;
		bool sw = al_switch;
		int nfd = al_next_fd;
		al_buf = al_spare;
		al_spare = b;
		al_len = 0;
		al_kick = al_switch = false;
		al_next_fd = -1;
		pthread_mutex_unlock(&al_lock);
		write_all(fd, b, at);
		if (sw) {
			close_target(fd);
			fd = nfd;
		}
		write_all(fd, b + at, n - at);
		if (n > ACCESS_KEEP_BYTES)      /* a burst: its pages go back to the kernel */
			madvise(b + ACCESS_KEEP_BYTES, n - ACCESS_KEEP_BYTES, MADV_DONTNEED);
		pthread_mutex_lock(&al_lock);
	}
	close_target(fd);
	al_ended = true;
	pthread_cond_broadcast(&al_gone);
	pthread_mutex_unlock(&al_lock);
	return NULL;
}

static void append_line(const char *line, size_t n)
{
	pthread_mutex_lock(&al_lock);
	if (!atomic_load(&al_on)) {
		pthread_mutex_unlock(&al_lock);
		return;
	}
	if (al_len + n > ACCESS_BACKLOG_BYTES) {
		/* the writer is stuck behind a reader that does not read: never wait for it */
		atomic_fetch_add_explicit(&g_pstats.access_log_dropped, 1, memory_order_relaxed);
		pthread_mutex_unlock(&al_lock);
		return;
	}
	memcpy(al_buf + al_len, line, n);
	al_len += n;
	if (al_len >= ACCESS_FLUSH_BYTES && !al_kick) {
		al_kick = true;
		pthread_cond_signal(&al_wake);
	}
	pthread_mutex_unlock(&al_lock);
}

void accesslog_write(const struct access_rec *r)
{
	if (!atomic_load_explicit(&al_on, memory_order_relaxed))
		return;
	char line[4096], esc[1024];
	size_t n = 0;
	struct timeval tv;
	struct tm tm;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	n = strftime(line, sizeof(line), "{\"time\":\"%Y-%m-%dT%H:%M:%S", &tm);
	json_escape(esc, sizeof(esc), r->reqid, r->reqid ? strlen(r->reqid) : 0);
	append(line, &n, sizeof(line), ".%03dZ\",\"request_id\":\"%s\",\"session\":%" PRIu64,
	       (int)(tv.tv_usec / 1000), esc, r->sid);
	json_escape(esc, sizeof(esc), r->peer, r->peer ? strlen(r->peer) : 0);
	append(line, &n, sizeof(line), ",\"client\":\"%s\"", esc);
	if (r->req) {
		append(line, &n, sizeof(line), ",\"method\":\"%s\"", r->req->method);
		json_escape(esc, sizeof(esc), r->req->path, r->req->path_len);
		append(line, &n, sizeof(line), ",\"path\":\"%s\"", esc);
	} else {
		/* refused before the head was understood (malformed, oversized, header timeout) */
		append(line, &n, sizeof(line), ",\"method\":null,\"path\":null");
	}
	if (r->upstream) {
		char esc2[512];
		json_escape(esc, sizeof(esc), r->route_host ? r->route_host : "*", r->route_host ? strlen(r->route_host) : 1);
		json_escape(esc2, sizeof(esc2), r->route_prefix, r->route_prefix ? strlen(r->route_prefix) : 0);
		append(line, &n, sizeof(line), ",\"route\":{\"host\":\"%s\",\"path_prefix\":\"%s\"},\"upstream\":\"%s\"",
		       esc, esc2, r->upstream);
	} else {
		append(line, &n, sizeof(line), ",\"route\":null,\"upstream\":null");
	}
	append(line, &n, sizeof(line), ",\"status\":%d,\"attempts\":%d,\"tries\":[", r->status, r->attempts);
	for (int i = 0; i < r->natt && i < ACCESS_MAX_ATTEMPTS; i++) {
		append(line, &n, sizeof(line), "%s{\"endpoint\":\"%s\",", i ? "," : "", r->att[i].ep);
		if (r->att[i].fault)
			append(line, &n, sizeof(line), "\"fault\":\"%s\",", r->att[i].fault);
		if (r->att[i].status)
			append(line, &n, sizeof(line), "\"status\":%d", r->att[i].status);
		else
			append(line, &n, sizeof(line), "\"outcome\":\"%s\"", r->att[i].outcome ? r->att[i].outcome : "cancelled");
		/* added keys only: a reader of HTTP tries sees what it always saw */
		if (r->att[i].grpc_status >= 0)
			append(line, &n, sizeof(line), ",\"grpc_status\":%d,\"grpc_status_name\":\"%s\"",
			       r->att[i].grpc_status, grpc_status_name(r->att[i].grpc_status));
		if (r->att[i].hedge)
			append(line, &n, sizeof(line), ",\"hedge\":true");
		if (r->att[i].won)
			append(line, &n, sizeof(line), ",\"won\":true");
		append(line, &n, sizeof(line), "}");
	}
	append(line, &n, sizeof(line), "],\"retry_refused\":");
	if (r->refused != RR_NONE && r->refused != RR_NOT_LISTED)
		append(line, &n, sizeof(line), "\"%s\"", refusal_name(r->refused));
	else
		append(line, &n, sizeof(line), "null");
	if (r->held_ep)
		append(line, &n, sizeof(line), ",\"held\":{\"endpoint\":\"%s\",\"ms_left\":%" PRId64 "}",
		       r->held_ep, r->held_ms);
	if (r->reason)
		append(line, &n, sizeof(line), ",\"reason\":\"%s\"", r->reason);
	append(line, &n, sizeof(line), ",\"deadline_ms\":%" PRId64 ",\"deadline_left_ms\":%" PRId64
	       ",\"duration_ms\":%.3f,\"request_body_bytes\":%" PRId64,
	       r->deadline_given_us / 1000, r->deadline_left_us / 1000, (double)r->duration_us / 1000.0,
	       r->body_bytes);
	if (r->key) {
		json_escape(esc, sizeof(esc), r->key, r->keylen > 256 ? 256 : r->keylen);
		append(line, &n, sizeof(line), ",\"idempotency_key\":\"%s\"", esc);
	} else {
		append(line, &n, sizeof(line), ",\"idempotency_key\":null");
	}
	append(line, &n, sizeof(line), ",\"client_aborted\":%s,\"outcome\":\"%s\"}\n",
	       r->client_abort ? "true" : "false", access_outcome(r));
	if (n >= sizeof(line) - 1) {
		n = sizeof(line) - 2;
		line[n++] = '\n';
	}
	append_line(line, n);
}

void accesslog_flush(void)
{
	pthread_mutex_lock(&al_lock);
	if (al_len > 0 && !al_kick) {
		al_kick = true;
		pthread_cond_signal(&al_wake);
	}
	pthread_mutex_unlock(&al_lock);
}

/* Open SPEC's target: *FD (-1 for "off") and *PATH (malloc'd; NULL for stdout and off). */
static int open_target(const char *spec, int *fd, char **path)
{
	*fd = -1;
	*path = NULL;
	if (!spec || strcmp(spec, "off") == 0)
		return 0;
	if (strcmp(spec, "stdout") == 0) {
		*fd = STDOUT_FILENO;
		return 0;
	}
	*fd = open(spec, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (*fd < 0)
		return -1;
	*path = xstrdup(spec);
	return 0;
}

/* The two buffers, mapped at their full size (pages become resident as lines fill them). */
static int backlog_map(void)
{
	for (int i = 0; i < 2; i++) {
		void *p = mmap(NULL, ACCESS_BACKLOG_BYTES, PROT_READ | PROT_WRITE,
		               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			return errno;
		*(i ? &al_spare : &al_buf) = p;
	}
	return 0;
}

static void backlog_unmap(void)
{
	if (al_buf)
		munmap(al_buf, ACCESS_BACKLOG_BYTES);
	if (al_spare)
		munmap(al_spare, ACCESS_BACKLOG_BYTES);
	al_buf = al_spare = NULL;
}

/* From the end of the backlog on, lines go to FD (-1: off). Under al_lock. */
static void queue_target_locked(int fd)
{
	if (al_switch) {
		close_target(al_next_fd);       /* queued and never written to: replaced */
	} else {
		al_switch = true;
		al_switch_at = al_len;
	}
	al_next_fd = fd;
	pthread_cond_signal(&al_wake);
}

int accesslog_switch(const char *spec)
{
	int fd;
	char *path;
	if (open_target(spec, &fd, &path) != 0)
		return -1;
	pthread_mutex_lock(&al_lock);
	if (fd >= 0 && !al_started) {
		int rc = backlog_map();
		if (rc == 0)
			rc = pthread_create(&al_thread, NULL, writer_main, NULL);
		if (rc != 0) {
			backlog_unmap();
			pthread_mutex_unlock(&al_lock);
			close_target(fd);
			free(path);
			errno = rc;
			return -1;
		}
		al_started = true;
	}
	atomic_store(&al_on, fd >= 0);
	queue_target_locked(fd);
	pthread_mutex_unlock(&al_lock);
	free(al_path);
	al_path = path;
	return 0;
}

int accesslog_open(const char *spec)
{
	return accesslog_switch(spec);
}

void accesslog_reopen(void)
{
	if (!al_path)
		return;
	int fd = open(al_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return;         /* the old descriptor goes on */
	pthread_mutex_lock(&al_lock);
	queue_target_locked(fd);
	pthread_mutex_unlock(&al_lock);
}

void accesslog_close(void)
{
	pthread_mutex_lock(&al_lock);
	atomic_store(&al_on, false);
	bool ended = !al_started;
	if (al_started) {
		al_stop = true;
		pthread_cond_signal(&al_wake);
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += ACCESS_CLOSE_WAIT_S;
		while (!al_ended && pthread_cond_timedwait(&al_gone, &al_lock, &until) == 0)
			;
		ended = al_ended;
	}
	size_t left = al_len;
	pthread_mutex_unlock(&al_lock);
	free(al_path);
	al_path = NULL;
	if (!ended) {
		/* blocked in a write nobody reads: the process exits without it */
		log_warn("access log: its reader takes nothing; %zu bytes not written", left);
		return;
	}
	if (al_started)
		pthread_join(al_thread, NULL);
	close_target(al_next_fd);
	backlog_unmap();
	al_len = 0;
	al_next_fd = -1;
	al_switch = al_kick = al_stop = al_ended = al_started = false;
}

void accesslog_write_refusal(uint64_t sid, const char *peer, uint64_t *rng, int status,
                             const char *reason)
{
	char reqid[33];
	struct access_rec r;
	request_id_new(reqid, rng);
	access_begin(&r, sid, peer, NULL, reqid);
	r.status = status;
	r.reason = reason;
	accesslog_write(&r);
}
