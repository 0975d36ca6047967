/*
 * outlier: passive health of endpoint addresses (see outlier.h). Workers race on the counters
 * of one endpoint; the worst a race does is one ejection more or less, never a wrong state:
 * an ejection is a compare-and-swap on eject_until_us from a time already past.
 */
#include <stdatomic.h>
#include <sys/time.h>

#include "base/clock.h"
#include "policy/outlier.h"
#include "state/upstream.h"

bool outlier_is_failure(enum outcome out, int status, bool hinted)
{
	if (out == OUT_CONNECT_FAILURE || out == OUT_RESET || out == OUT_TIMEOUT)
		return true;
	if (out != OUT_STATUS)
		return false;
	if ((status == 429 || status == 503) && hinted)
		return false;   /* a Retry-After is a hold (SPEC §4), not a sign of ill health */
	return status >= 500 && status <= 599;
}

int64_t outlier_ejection_us(const struct cfg_health *h, int n)
{
	if (n < 1)
		n = 1;
	if (h->base_ejection_us > 0 && n > h->max_ejection_us / h->base_ejection_us)
		return h->max_ejection_us;
	int64_t d = h->base_ejection_us * n;
	return d < h->max_ejection_us ? d : h->max_ejection_us;
}

bool outlier_may_eject(const struct cfg_health *h, int n, int ejected)
{
	if (ejected + 1 >= n)
		return false;   /* at least one stays */
	return (int64_t)(ejected + 1) * 100 <= (int64_t)h->max_ejected_percent * n;
}

static bool is_ejected(const struct ep_state *ep, int64_t now_us)
{
	return atomic_load(&ep->eject_until_us) > now_us || atomic_load(&ep->probe_down);
}

bool outlier_report(const struct cfg_health *h, struct ep_state *const *eps, int n,
                    struct ep_state *ep, enum outcome out, int status, bool hinted,
                    int64_t now_us)
{
	if (!outlier_is_failure(out, status, hinted)) {
		if (out == OUT_STATUS)
			atomic_store_explicit(&ep->consecutive_failures, 0, memory_order_relaxed);
		return false;
	}
	atomic_store(&ep->last_failure, out == OUT_STATUS ? status : (int)out);
	struct timeval tv;
	gettimeofday(&tv, NULL);
	atomic_store(&ep->last_failure_wall_us, (int64_t)tv.tv_sec * 1000000 + tv.tv_usec);
	int fails = atomic_fetch_add(&ep->consecutive_failures, 1) + 1;
	if (h->consecutive_failures <= 0 || fails < h->consecutive_failures)
		return false;
	int64_t until = atomic_load(&ep->eject_until_us);
	if (until > now_us)
		return false;   /* already ejected: an attempt that was in flight */
	int ejected = 0;
	for (int i = 0; i < n; i++)
		if (eps[i] != ep && is_ejected(eps[i], now_us))
			ejected++;
	if (!outlier_may_eject(h, n, ejected))
		return false;   /* the count stays: it ejects once another one comes back */
	int nth = atomic_load(&ep->nejections) + 1;
	if (!atomic_compare_exchange_strong(&ep->eject_until_us, &until,
	                                    now_us + outlier_ejection_us(h, nth)))
		return false;   /* another worker ejected it just now */
	atomic_store(&ep->nejections, nth);
	atomic_store(&ep->consecutive_failures, 0);
	atomic_fetch_add(&ep->ejections, 1);
	return true;
}
