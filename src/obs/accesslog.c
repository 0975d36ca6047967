/*
 * accesslog: JSON lines. Workers format a line on their own stack and append it to one shared
 * buffer under a mutex; the buffer is written out when it grows past ACCESS_FLUSH_BYTES and by
 * the main thread's timer (accesslog_flush), so a line reaches the file within a fraction of a
 * second and the request path never waits on the disk.
 */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "obs/accesslog.h"
#include "config/config.h"
#include "http/grpc.h"
#include "http/h1_parser.h"
#include "base/util.h"

#define ACCESS_FLUSH_BYTES (64 * 1024)

static pthread_mutex_t al_lock = PTHREAD_MUTEX_INITIALIZER;
static int al_fd = -1;
static char *al_path;               /* NULL for stdout */
static char *al_buf;
static size_t al_len, al_cap;
static bool al_on;

void access_begin(struct access_rec *r, uint64_t sid, const char *peer, const struct http_head *req,
                  const char *reqid)
{
	memset(r, 0, sizeof(*r));
	r->req = req;
	r->reqid = reqid;
	r->sid = sid;
	r->peer = peer;
	r->last_out = OUT_NONE;
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
	}
	r->natt++;
}

void access_set_outcome(struct access_rec *r, const char *outcome)
{
	if (r->natt > 0 && r->natt <= ACCESS_MAX_ATTEMPTS)
		r->att[r->natt - 1].outcome = outcome;
}

void access_set_status(struct access_rec *r, int status)
{
	if (r->natt > 0 && r->natt <= ACCESS_MAX_ATTEMPTS)
		r->att[r->natt - 1].status = status;
}

void access_set_fault(struct access_rec *r, const char *kind)
{
	if (r->natt > 0 && r->natt <= ACCESS_MAX_ATTEMPTS)
		r->att[r->natt - 1].fault = kind;
}

void access_set_grpc_status(struct access_rec *r, int code)
{
	if (r->natt > 0 && r->natt <= ACCESS_MAX_ATTEMPTS && code >= 0 && code < GRPC_NCODES)
		r->att[r->natt - 1].grpc_status = code;
}

const char *access_outcome(const struct access_rec *r)
{
	/* the last attempt may have executed, whatever an earlier attempt answered (SPEC §6) */
	if (r->non_idempotent && r->attempts > 0 &&
	    (r->last_out == OUT_RESET || r->last_out == OUT_TIMEOUT))
		return "unknown";
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
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		p += w;
		n -= (size_t)w;
	}
}

static void flush_locked(void)
{
	if (al_len > 0 && al_fd >= 0)
		write_all(al_fd, al_buf, al_len);
	al_len = 0;
}

static void append_line(const char *line, size_t n)
{
	pthread_mutex_lock(&al_lock);
	if (al_len + n > al_cap) {
		al_cap = (al_len + n) * 2;
		al_buf = xrealloc(al_buf, al_cap);
	}
	memcpy(al_buf + al_len, line, n);
	al_len += n;
	if (al_len >= ACCESS_FLUSH_BYTES)
		flush_locked();
	pthread_mutex_unlock(&al_lock);
}

void accesslog_write(const struct access_rec *r)
{
	if (!al_on)
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
		append(line, &n, sizeof(line), "}");
	}
	append(line, &n, sizeof(line), "],\"retry_refused\":");
	if (r->refused != RR_NONE && r->refused != RR_NOT_LISTED)
		append(line, &n, sizeof(line), "\"%s\"", refusal_name(r->refused));
	else
		append(line, &n, sizeof(line), "null");
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
	if (!al_on)
		return;
	pthread_mutex_lock(&al_lock);
	flush_locked();
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

int accesslog_switch(const char *spec)
{
	int fd;
	char *path;
	if (open_target(spec, &fd, &path) != 0)
		return -1;
	pthread_mutex_lock(&al_lock);
	flush_locked();
	if (al_path && al_fd >= 0)
		close(al_fd);
	free(al_path);
	al_fd = fd;
	al_path = path;
	al_on = fd >= 0;
	pthread_mutex_unlock(&al_lock);
	return 0;
}

int accesslog_open(const char *spec)
{
	return accesslog_switch(spec);
}

void accesslog_reopen(void)
{
	pthread_mutex_lock(&al_lock);
	flush_locked();
	if (al_path) {
		int fd = open(al_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (fd >= 0) {
			close(al_fd);
			al_fd = fd;
		}
	}
	pthread_mutex_unlock(&al_lock);
}

void accesslog_close(void)
{
	pthread_mutex_lock(&al_lock);
	flush_locked();
	if (al_path && al_fd >= 0)
		close(al_fd);
	free(al_path);
	al_path = NULL;
	al_fd = -1;
	al_on = false;
	free(al_buf);
	al_buf = NULL;
	al_len = al_cap = 0;
	pthread_mutex_unlock(&al_lock);
}
