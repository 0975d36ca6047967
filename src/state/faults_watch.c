/*
 * faults_watch: the stop conditions' timer (see faults_watch.h). It judges what the current
 * runtime configures; only it and POST /faults (the same thread) write the switch.
 */
#include <stdatomic.h>

#include <event2/event.h>

#include "base/clock.h"
#include "policy/faults.h"
#include "state/faults_watch.h"
#include "base/log.h"
#include "obs/stats.h"
#include "state/runtime.h"
#include "state/upstream.h"

#define WATCH_TICK_US (100 * 1000)

static struct event *watch_ev;

static void watch_upstream(const struct cfg_faults *f, struct upstream_state *st, int64_t now)
{
	if (f->nrules == 0 || !atomic_load(&st->faults_on))
		return;
	int64_t since = atomic_load(&st->faults_since_us);
	struct stats_window sw;
	stats_window_sum(st->stats, now, since, &sw);
	struct faults_window w = {
		.on_for_us = now - since,
		.responses = sw.resp,
		.failures = sw.fail,
		.first_attempts = sw.req,
		.attempts = sw.att,
	};
	enum faults_stop why = faults_stop_reason(f, &w);
	if (why == FS_NONE)
		return;
	upstream_faults_switch(st, false, why);
	log_warn("faults: upstream %s: stop condition %s met after %.1fs (%llu responses, %llu of "
	         "them 5xx; %llu attempts for %llu requests): faults switched off", st->name,
	         faults_stop_name(why), (double)w.on_for_us / 1e6, (unsigned long long)w.responses,
	         (unsigned long long)w.failures, (unsigned long long)w.attempts,
	         (unsigned long long)w.first_attempts);
}

static void watch_cb(evutil_socket_t fd, short what, void *arg)
{
	struct runtime *rt = runtime_current();
	int64_t now = clock_now_us();
	for (int i = 0; i < rt->cfg->nupstreams; i++)
		watch_upstream(&rt->cfg->upstreams[i].faults, rt->ups[i].st, now);
	runtime_unref(rt);
}

void faults_watch_start(struct event_base *base)
{
	watch_ev = event_new(base, -1, EV_PERSIST, watch_cb, NULL);
	struct timeval tv = clock_tv(WATCH_TICK_US);
	event_add(watch_ev, &tv);
}

void faults_watch_stop(void)
{
	if (watch_ev)
		event_free(watch_ev);
	watch_ev = NULL;
}
