/*
 * log: stderr lines, written with one write(2) each so lines from several workers never
 * interleave.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

enum log_level log_min_level = LOG_INFO;

static const char *const level_name[] = { "DEBUG", "INFO", "WARN", "ERROR" };

void log_msg(enum log_level lvl, uint64_t sid, const char *fmt, ...)
{
	char line[2048];
	struct timeval tv;
	struct tm tm;
	size_t n;
	va_list ap;

	if (lvl < log_min_level)
		return;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
	n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03dZ %s ", (int)(tv.tv_usec / 1000),
	                      level_name[lvl]);
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
