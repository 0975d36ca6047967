/*
 * outlier: passive health (SPEC §13). Each attempt's outcome is reported per endpoint address;
 * consecutive_failures in a row (connect-failure, reset, timeout, 5xx other than a 429/503
 * carrying Retry-After, which holds instead) eject it for base_ejection x n, at most
 * max_ejection, while no more than max_ejected_percent of the upstream's endpoints are ejected
 * (at least one always stays). One success resets the count. Pure: the report that applies
 * it to an endpoint's state is upstream_ep_report (state/endpoint.h).
 */
#ifndef RG_OUTLIER_H
#define RG_OUTLIER_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "policy/retry.h"

/* Whether an attempt that ended in OUT (OUT_STATUS: with STATUS; HINTED: it carried a valid
 * Retry-After) counts as a failure. */
bool outlier_is_failure(enum outcome out, int status, bool hinted);
/* How long the N-th ejection (N >= 1) lasts. */
int64_t outlier_ejection_us(const struct cfg_health *h, int n);
/* Whether one more of N endpoints may be ejected while EJECTED of them already are. */
bool outlier_may_eject(const struct cfg_health *h, int n, int ejected);

#endif
