/*
 * latency_hist: an upstream's first-attempt head latency over the last 60 s (SPEC §14's
 * p95/p99 hedge delay), shared lock-free by workers. Six buckets of 10 s, each a set of
 * log-scaled counters (four per power of two above 1 ms); a bucket is taken over for a new
 * period by whoever records first in it (a race there may lose a few samples: it is a
 * figure, not an account). Bounded: a few KiB per upstream, whatever the load.
 */
#ifndef RG_LATENCY_HIST_H
#define RG_LATENCY_HIST_H

#include <stdatomic.h>
#include <stdint.h>

#define LH_PERIODS      6
#define LH_PERIOD_US    (10 * INT64_C(1000000))
#define LH_NBINS        80          /* bin 0: <= 1 ms; the last: everything above ~1 h */
#define LH_MIN_SAMPLES  100         /* fewer in the window: no percentile */

struct lh_period {
	_Atomic int64_t epoch;          /* the 10 s period it counts (now / LH_PERIOD_US), -1 none */
	_Atomic uint32_t bins[LH_NBINS];
};

struct latency_hist {
	struct lh_period p[LH_PERIODS];
};

void latency_hist_init(struct latency_hist *h);
void latency_hist_add(struct latency_hist *h, int64_t now_us, int64_t latency_us);
/* The PCT (1..99) percentile over the last 60 s at NOW, never below 1 ms, or -1 with fewer
 * than LH_MIN_SAMPLES samples in the window. */
int64_t latency_hist_pct(const struct latency_hist *h, int64_t now_us, int pct);

/* The pure parts: the bin of a latency, the upper bound of a bin (µs), and the PCT percentile
 * of COUNTS[LH_NBINS] (-1: fewer than LH_MIN_SAMPLES). */
int lh_bin(int64_t latency_us);
int64_t lh_bin_upper(int bin);
int64_t lh_percentile(const uint32_t *counts, int pct);

#endif
