/*
 * reconcile_publish: the Redis stream publisher of the reconciliation queue (SPEC §12), on
 * the main thread's event loop. It reads the queue through reconcile.h and never blocks; the
 * queue never waits for it.
 */
#ifndef RG_RECONCILE_PUBLISH_H
#define RG_RECONCILE_PUBLISH_H

#include "config/config.h"

struct event_base;

/* Main thread, at start and on every reload: publish to C's reconcile.redis (a change of URL
 * or stream starts over with a new connection; "" stops publishing). */
void reconcile_publish_configure(struct event_base *base, const struct cfg_reconcile *c);
/* At exit. */
void reconcile_publish_stop(void);

#endif
