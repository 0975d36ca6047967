/*
 * clock: the one monotonic clock (microseconds) every timer and deadline is measured on, and
 * wall-clock seconds for HTTP dates and logs only.
 */
#ifndef RG_CLOCK_H
#define RG_CLOCK_H

#include <stdint.h>
#include <sys/time.h>
#include <time.h>

static inline int64_t clock_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline time_t clock_wall(void)
{
	return time(NULL);
}

static inline struct timeval clock_tv(int64_t us)
{
	struct timeval tv;
	if (us < 0)
		us = 0;
	tv.tv_sec = us / 1000000;
	tv.tv_usec = us % 1000000;
	return tv;
}

#endif
