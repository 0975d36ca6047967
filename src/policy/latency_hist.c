/*
 * latency_hist: the 60 s first-attempt head latency histogram behind a p95/p99 hedge delay
 * (SPEC §14). See latency_hist.h.
 */
#include "policy/latency_hist.h"

/* bin b >= 1 covers (1ms * 2^((b-1)/4 ... b/4)]: four bins per doubling above 1 ms */
int lh_bin(int64_t latency_us)
{
	if (latency_us <= 1000)
		return 0;
	int64_t v = latency_us;
	int bin = 1;
	/* whole doublings above 1 ms */
	int64_t lo = 1000;
	while (v > lo * 2 && bin + 4 < LH_NBINS) {
		lo *= 2;
		bin += 4;
	}
	/* quarter steps inside (lo, 2lo]: upper bounds lo*2^(1/4), 2^(1/2), 2^(3/4), 2 */
	static const int64_t q[3] = { 1189, 1414, 1682 };     /* x1000 */
	for (int i = 0; i < 3; i++) {
		if (v <= lo * q[i] / 1000)
			return bin < LH_NBINS ? bin : LH_NBINS - 1;
		bin++;
	}
	return bin < LH_NBINS ? bin : LH_NBINS - 1;
}

int64_t lh_bin_upper(int bin)
{
	static const int64_t q[4] = { 1189, 1414, 1682, 2000 };
	if (bin <= 0)
		return 1000;
	int64_t lo = 1000;
	for (int d = (bin - 1) / 4; d > 0; d--)
		lo *= 2;
	return lo * q[(bin - 1) % 4] / 1000;
}

int64_t lh_percentile(const uint32_t *counts, int pct)
{
	uint64_t total = 0;
	for (int b = 0; b < LH_NBINS; b++)
		total += counts[b];
	if (total < LH_MIN_SAMPLES)
		return -1;
	/* the smallest bin at which at least PCT% of the samples lie */
	uint64_t need = (total * (uint64_t)pct + 99) / 100, seen = 0;
	for (int b = 0; b < LH_NBINS; b++) {
		seen += counts[b];
		if (seen >= need)
			return lh_bin_upper(b);
	}
	return lh_bin_upper(LH_NBINS - 1);
}

void latency_hist_init(struct latency_hist *h)
{
	for (int i = 0; i < LH_PERIODS; i++) {
		atomic_init(&h->p[i].epoch, -1);
		for (int b = 0; b < LH_NBINS; b++)
			atomic_init(&h->p[i].bins[b], 0);
	}
}

void latency_hist_add(struct latency_hist *h, int64_t now_us, int64_t latency_us)
{
	int64_t e = now_us / LH_PERIOD_US;
	struct lh_period *p = &h->p[e % LH_PERIODS];
	int64_t old = atomic_load_explicit(&p->epoch, memory_order_acquire);
	if (old != e) {
		if (old > e)
			return;     /* a clock read before another worker's: too late for its period */
		if (atomic_compare_exchange_strong(&p->epoch, &old, e))
			for (int b = 0; b < LH_NBINS; b++)
				atomic_store_explicit(&p->bins[b], 0, memory_order_relaxed);
	}
	atomic_fetch_add_explicit(&p->bins[lh_bin(latency_us)], 1, memory_order_relaxed);
}

int64_t latency_hist_pct(const struct latency_hist *h, int64_t now_us, int pct)
{
	uint32_t counts[LH_NBINS] = { 0 };
	int64_t e = now_us / LH_PERIOD_US;
	for (int i = 0; i < LH_PERIODS; i++) {
		const struct lh_period *p = &h->p[i];
		int64_t pe = atomic_load_explicit(&p->epoch, memory_order_acquire);
		if (pe < 0 || pe > e || e - pe >= LH_PERIODS)
			continue;
		for (int b = 0; b < LH_NBINS; b++)
			counts[b] += atomic_load_explicit(&p->bins[b], memory_order_relaxed);
	}
	return lh_percentile(counts, pct);
}
