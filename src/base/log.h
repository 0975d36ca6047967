/*
 * log: one line per event on stderr: "2026-11-29T11:30:00.123Z LEVEL [sid] message", or with
 * log_json one JSON object per line: {"time":"...","level":"info","session":N,"msg":"..."}
 * ("session" only on lines about one connection).
 * The access log (one JSON line per request) is separate: accesslog.c.
 */
#ifndef RG_LOG_H
#define RG_LOG_H

#include <stdbool.h>
#include <stdint.h>

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

extern enum log_level log_min_level;
extern _Atomic bool log_json;          /* log_format: json; set by main before workers start/reload */

void log_msg(enum log_level lvl, uint64_t sid, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Lines that could repeat per request are rate-limited. LAST holds when the line was last
 * written (µs, monotonic clock; 0: never): true, and LAST moved to NOW, for one caller per
 * PERIOD whatever the thread, by a compare-exchange (a plain load when it is not yet time). */
bool log_every(_Atomic int64_t *last, int64_t now_us, int64_t period_us);
/* The same keyed by KEY (a peer address), in one small process-wide table under a lock: true
 * at most once per PERIOD per key. When all LOG_KEYS keys were written within the period, a
 * new key gets false too: the lines stay bounded whatever the number of peers. */
#define LOG_KEYS 64
bool log_keyed_every(const char *key, int64_t now_us, int64_t period_us);

#define log_info(...)  log_msg(LOG_INFO, 0, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, 0, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, 0, __VA_ARGS__)
#define log_debug(...) do { if (log_min_level <= LOG_DEBUG) log_msg(LOG_DEBUG, 0, __VA_ARGS__); } while (0)
#define slog(lvl, sid, ...) do { if (log_min_level <= (lvl)) log_msg((lvl), (sid), __VA_ARGS__); } while (0)

#endif
