/*
 * watch: the config file's directories under inotify, a debounce, and a content check (see
 * watch.h). Main thread only.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <event2/event.h>

#include "app/watch.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/util.h"

/* an editor's write then rename, or the kubelet's four steps, make one reload */
#define DEBOUNCE_US (200 * 1000)
#define DIR_EVENTS  (IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_CLOSE_WRITE | IN_MODIFY | \
                     IN_DELETE | IN_ATTRIB)

struct watch {
	char *path;
	char *base;                 /* the file's name in its directory */
	int fd;                     /* inotify */
	int dir_wd;                 /* the directory the path names */
	int target_wd;              /* the directory of the file the path resolves to, when another
	                             * one (a symlink elsewhere; Kubernetes' timestamped directory) */
	struct event *ev, *debounce;
	bool seen;                  /* the content was read once: len and hash hold */
	size_t len;
	uint64_t hash;
	void (*on_change)(void *arg);
	void *arg;
};

/* FNV-1a over the file's bytes, through every symlink; false when it cannot be read now (in
 * the middle of a replacement: a later event comes). */
static bool fingerprint(const char *path, size_t *len, uint64_t *hash)
{
	FILE *f = fopen(path, "rb");
	unsigned char buf[8192];
	size_t n;

	if (!f)
		return false;
	*len = 0;
	*hash = 1469598103934665603ULL;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
		for (size_t i = 0; i < n; i++)
			*hash = (*hash ^ buf[i]) * 1099511628211ULL;
		*len += n;
	}
	bool ok = !ferror(f);
	fclose(f);
	return ok;
}

/* Follow the path to its file's directory, which a symlink swap moves. */
static void watch_target(struct watch *w)
{
	char real[PATH_MAX];
	int wd = -1;

	if (realpath(w->path, real)) {
		char *slash = strrchr(real, '/');
		if (slash == real)
			slash[1] = 0;
		else if (slash)
			*slash = 0;
		wd = inotify_add_watch(w->fd, real, DIR_EVENTS);
	}
	if (wd == w->dir_wd)
		wd = -1;            /* the same directory: watched already */
	if (w->target_wd >= 0 && w->target_wd != wd)
		inotify_rm_watch(w->fd, w->target_wd);  /* gone with its directory: EINVAL, fine */
	w->target_wd = wd;
}

static void debounce_cb(evutil_socket_t fd, short what, void *arg)
{
	struct watch *w = arg;
	size_t len;
	uint64_t hash;

	watch_target(w);
	if (!fingerprint(w->path, &len, &hash))
		return;
	if (w->seen && len == w->len && hash == w->hash)
		return;
	w->seen = true;
	w->len = len;
	w->hash = hash;
	log_info("watch: %s changed: reloading", w->path);
	w->on_change(w->arg);
}

static bool relevant(const struct watch *w, const struct inotify_event *e)
{
	if (e->wd == w->target_wd)
		return true;
	if (e->wd != w->dir_wd || !e->len)
		return false;
	/* the file itself, or Kubernetes' ..data, ..data_tmp and timestamped directories */
	return strcmp(e->name, w->base) == 0 || strncmp(e->name, "..", 2) == 0;
}

static void inotify_cb(evutil_socket_t fd, short what, void *arg)
{
	struct watch *w = arg;
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	bool hit = false;
	ssize_t n;

	while ((n = read(w->fd, buf, sizeof buf)) > 0) {
		for (char *p = buf; p < buf + n;) {
			const struct inotify_event *e = (const struct inotify_event *)(void *)p;
			hit = hit || (e->mask & IN_Q_OVERFLOW) || relevant(w, e);
			p += sizeof(*e) + e->len;
		}
	}
	if (hit) {
		struct timeval tv = clock_tv(DEBOUNCE_US);
		evtimer_add(w->debounce, &tv);  /* again: the timer starts over */
	}
}

struct watch *watch_start(struct event_base *base, const char *path,
                          void (*on_change)(void *arg), void *arg)
{
	struct watch *w = xcalloc(1, sizeof(*w));
	const char *slash = strrchr(path, '/');
	char *dir = slash ? xstrndup(path, (size_t)(slash - path) + (slash == path)) : xstrdup(".");

	w->path = xstrdup(path);
	w->base = xstrdup(slash ? slash + 1 : path);
	w->on_change = on_change;
	w->arg = arg;
	w->target_wd = -1;
	w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	w->dir_wd = w->fd < 0 ? -1 : inotify_add_watch(w->fd, dir, DIR_EVENTS);
	free(dir);
	if (w->dir_wd < 0) {
		int e = errno;
		if (w->fd >= 0)
			close(w->fd);
		free(w->path);
		free(w->base);
		free(w);
		errno = e;
		return NULL;
	}
	watch_target(w);
	w->seen = fingerprint(path, &w->len, &w->hash);
	w->ev = event_new(base, w->fd, EV_READ | EV_PERSIST, inotify_cb, w);
	event_add(w->ev, NULL);
	w->debounce = evtimer_new(base, debounce_cb, w);
	return w;
}

void watch_stop(struct watch *w)
{
	if (!w)
		return;
	event_free(w->ev);
	event_free(w->debounce);
	close(w->fd);
	free(w->path);
	free(w->base);
	free(w);
}
