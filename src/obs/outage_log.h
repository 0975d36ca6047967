/*
 * outage_log: an outage says so in the log, per upstream and per kind at most once per
 * OUTAGE_LOG_PERIOD_US: the attempts that failed since the last such line (connect-failure,
 * reset, timeout, 5xx, gRPC errors), or the retries refused by reason and the requests
 * rejected, each with the retry budget's tokens left. The figures are the counters /metrics
 * shows, summed over the workers only when a line is due: on the request path a note costs
 * one atomic load (and one compare-exchange every period).
 */
#ifndef RG_OUTAGE_LOG_H
#define RG_OUTAGE_LOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "obs/stats.h"

#define OUTAGE_LOG_PERIOD_US (10 * 1000000LL)

enum outage_kind { OUTAGE_FAILURES, OUTAGE_REFUSALS, OUTAGE_NKINDS };

/* the failure figures of a line: OUTCOME_VALUES' indexes, then these */
enum { OUTAGE_5XX = OUT_STATUS, OUTAGE_GRPC, OUTAGE_NFAIL };

/* A gRPC status a line counts as a failure: the server-side errors (unknown, deadline-exceeded,
 * internal, unavailable, data-loss). */
static inline bool outage_grpc_failure(int code)
{
	return code == GRPC_UNKNOWN || code == GRPC_DEADLINE_EXCEEDED || code == GRPC_INTERNAL ||
	       code == GRPC_UNAVAILABLE || code == GRPC_DATA_LOSS;
}

/* One per upstream, shared by the workers, zeroed at creation. */
struct outage_log {
	_Atomic int64_t last_us[OUTAGE_NKINDS];     /* monotonic; 0: no line yet */
	/* the sums at the last line of each kind: written only by the one caller that won the
	 * line (its compare-exchange orders them after the previous winner's) */
	int64_t since_us[OUTAGE_NKINDS];
	uint64_t fail[OUTAGE_NFAIL];
	uint64_t refused[RR_NREASONS], rejected[NREJ];
};

/* The upstream whose counters (PER_WORKER[g_nworkers]) and budget a line describes. */
struct outage_subject {
	const char *name;
	const struct ustats *per_worker;
	double tokens, max_tokens;
};

/* Is a line of kind K due at NOW? True for one caller per period, which must then write it. */
bool outage_due(struct outage_log *o, enum outage_kind k, int64_t now_us);
/* Write the line of kind K that outage_due() granted: the figures since the last one. */
void outage_write(struct outage_log *o, enum outage_kind k, const struct outage_subject *u,
                  int64_t now_us);

#endif
