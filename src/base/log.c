/*
 * log: stderr lines, written with one write(2) each so lines from several workers never
 * interleave; text, or JSON objects (log_format: json) whose message util.h's json_escape
 * keeps valid whatever bytes it holds.
 */
#include <stdarg.h>
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
