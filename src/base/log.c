/*
 * log: stderr lines, written with one write(2) each so lines from several workers never
 * interleave; text, or JSON objects (log_format: json) whose message util.h's json_escape
 * keeps valid whatever bytes it holds.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/util.h"

enum log_level log_min_level = LOG_INFO;
_Atomic bool log_json;

static const char *const level_name[] = { "DEBUG", "INFO", "WARN", "ERROR" };
static const char *const level_json[] = { "debug", "info", "warn", "error" };

/* {"time":STAMP,"level":...,"session":SID,"msg":MSG}\n with one write */
static void write_json(enum log_level lvl, const char *stamp, uint64_t sid, const char *msg,
                       size_t len)
{
	char line[6 * 2048 + 256];
	int n = snprintf(line, sizeof line, "{\"time\":\"%s\",\"level\":\"%s\",", stamp,
	                 level_json[lvl]);
	if (sid)
		n += snprintf(line + n, sizeof line - (size_t)n, "\"session\":%llu,",
		              (unsigned long long)sid);
	n += snprintf(line + n, sizeof line - (size_t)n, "\"msg\":\"");
	n += (int)json_escape(line + n, sizeof line - (size_t)n - 3, msg, len);
	memcpy(line + n, "\"}\n", 3);
	ssize_t w = write(STDERR_FILENO, line, (size_t)n + 3);
	(void)w;
}

void log_msg(enum log_level lvl, uint64_t sid, const char *fmt, ...)
{
	char stamp[40], line[2048];
	struct timeval tv;
	struct tm tm;
	size_t n;
	va_list ap;

	if (lvl < log_min_level)
		return;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	n = strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(stamp + n, sizeof(stamp) - n, ".%03dZ", (int)(tv.tv_usec / 1000));
	if (log_json) {
		va_start(ap, fmt);
		int k = vsnprintf(line, sizeof(line), fmt, ap);
		va_end(ap);
		size_t len = k < 0 ? 0 : (size_t)k < sizeof(line) ? (size_t)k : sizeof(line) - 1;
		write_json(lvl, stamp, sid, line, len);
		return;
	}
	n = (size_t)snprintf(line, sizeof(line), "%s %s ", stamp, level_name[lvl]);
	if (sid)
		n += (size_t)snprintf(line + n, sizeof(line) - n, "[s%llu] ", (unsigned long long)sid);
	va_start(ap, fmt);
	int k = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
	va_end(ap);
	if (k < 0)
		k = 0;
	size_t msg = n;
	n += (size_t)k;
	if (n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	/* one line per event: a message never breaks the line */
	for (size_t i = msg; i < n; i++)
		if (line[i] == '\n' || line[i] == '\r')
			line[i] = ' ';
	line[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, n);
	(void)w;
}

bool log_every(_Atomic int64_t *last, int64_t now_us, int64_t period_us)
{
	int64_t was = atomic_load_explicit(last, memory_order_relaxed);
	if (was && now_us - was < period_us)
		return false;
	return atomic_compare_exchange_strong_explicit(last, &was, now_us ? now_us : 1,
	                                               memory_order_acq_rel, memory_order_relaxed);
}

static pthread_mutex_t keys_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { uint64_t hash; int64_t last; } keys[LOG_KEYS];

bool log_keyed_every(const char *key, int64_t now_us, int64_t period_us)
{
	uint64_t h = 1469598103934665603ull;       /* FNV-1a */
	for (const unsigned char *p = (const unsigned char *)key; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	h |= 1;             /* 0 marks a free slot */
	bool ok = false;
	pthread_mutex_lock(&keys_lock);
	int slot = -1, oldest = 0;
	for (int i = 0; i < LOG_KEYS && slot < 0; i++) {
		if (keys[i].hash == h)
			slot = i;
		else if (keys[i].last < keys[oldest].last)
			oldest = i;
	}
	if (slot < 0 && (!keys[oldest].hash || now_us - keys[oldest].last >= period_us))
		slot = oldest;
	if (slot >= 0 && (keys[slot].hash != h || now_us - keys[slot].last >= period_us)) {
		keys[slot].hash = h;
		keys[slot].last = now_us;
		ok = true;
	}
	pthread_mutex_unlock(&keys_lock);
	return ok;
}
