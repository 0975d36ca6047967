/*
 * watch: `--watch`, a reload when the config file changes (SPEC §1). It watches directories,
 * never the file itself, so that every way a file is replaced is seen: an editor writing in
 * place or to a temporary file renamed over it, and the symlink swap by which Kubernetes
 * updates a mounted ConfigMap (FILE -> ..data/FILE, ..data -> a timestamped directory, and an
 * atomic rename of a new ..data_tmp symlink onto ..data). Events are debounced; then the
 * path is read again through its symlinks and a reload is asked for only when the content
 * differs from what was last seen.
 */
#ifndef RG_WATCH_H
#define RG_WATCH_H

struct event_base;
struct watch;

/* Watch PATH on BASE: ON_CHANGE(ARG) when its content changed. NULL with errno set when the
 * kernel refuses (inotify). */
struct watch *watch_start(struct event_base *base, const char *path,
                          void (*on_change)(void *arg), void *arg);
void watch_stop(struct watch *w);

#endif
