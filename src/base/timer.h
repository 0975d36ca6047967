/*
 * timer: a one-shot libevent timer embedded in its owner (no allocation per use), assigned
 * the first time it is armed and deleted only while armed: an event_del() takes the base's
 * lock even for an idle event, and an owner may pass several places that stop its timer.
 *
 * Invariant: on is true exactly while the event is added; the owner's callback calls
 * otimer_fired() first, so a later otimer_stop() costs nothing.
 */
#ifndef RG_TIMER_H
#define RG_TIMER_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "base/clock.h"

struct otimer {
	struct event ev;
	bool set, on;                   /* assigned; added and not yet fired or deleted */
};

/* Fire CB(ARG) on BASE in US (0: from the loop, once the current callbacks unwound); a
 * pending one is moved, not doubled. */
static inline void otimer_arm(struct otimer *t, struct event_base *base, event_callback_fn cb,
                              void *arg, int64_t us)
{
	if (!t->set) {
		evtimer_assign(&t->ev, base, cb, arg);
		t->set = true;
	}
	struct timeval tv = clock_tv(us);
	evtimer_add(&t->ev, &tv);
	t->on = true;
}

static inline void otimer_stop(struct otimer *t)
{
	if (!t->on)
		return;
	evtimer_del(&t->ev);
	t->on = false;
}

static inline void otimer_fired(struct otimer *t)
{
	t->on = false;
}

#endif
