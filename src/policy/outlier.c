/*
 * outlier: passive health of endpoint addresses, the arithmetic (see outlier.h).
 */
#include "policy/outlier.h"

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
