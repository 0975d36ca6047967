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

/*
 * libevent measures its timers on CLOCK_MONOTONIC_COARSE, which lags the real clock by up to
 * one tick (4 ms at HZ=250): a timer armed for 150 ms could go off after 146. Every timeout is
 * therefore lengthened by that tick (loop_global_init measures it), so none fires before its
 * time; the precise alternative (EVENT_BASE_FLAG_PRECISE_TIMER) costs a timerfd_settime system
 * call on every loop turn.
 */
extern int64_t clock_timer_slack_us;

/*
 * A timeout of US microseconds (none when negative) for a timer that may fire up to a tick
 * early, never a tick late: the hedge timer. A hedge sent a little early costs at most a
 * hedge; the slack would turn a 1.2 ms p95 delay into 5 ms and put that whole tick on every
 * hedged request's latency.
 */
static inline struct timeval clock_tv_early_ok(int64_t us)
{
	struct timeval tv;
	if (us < 0)
		us = 0;
	tv.tv_sec = us / 1000000;
	tv.tv_usec = us % 1000000;
	return tv;
}

/* A timeout of US microseconds for evtimer_add, never early. */
static inline struct timeval clock_tv(int64_t us)
{
	return clock_tv_early_ok(us > 0 ? us + clock_timer_slack_us : us);
}

#endif
