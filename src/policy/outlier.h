/*
 * outlier: passive health (SPEC §13). Each attempt's outcome is reported per endpoint address;
 * consecutive_failures in a row (connect-failure, reset, timeout, 5xx other than a 429/503
 * carrying Retry-After, which holds instead) eject it for base_ejection x n, at most
 * max_ejection, while no more than max_ejected_percent of the upstream's endpoints are ejected
 * (at least one always stays). One success resets the count. The arithmetic is pure; the
 * report updates the endpoint's atomics (any worker).
 */
#ifndef RG_OUTLIER_H
#define RG_OUTLIER_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "policy/retry.h"

struct ep_state;

/* Whether an attempt that ended in OUT (OUT_STATUS: with STATUS; HINTED: it carried a valid
 * Retry-After) counts as a failure. */
bool outlier_is_failure(enum outcome out, int status, bool hinted);
/* How long the N-th ejection (N >= 1) lasts. */
int64_t outlier_ejection_us(const struct cfg_health *h, int n);
/* Whether one more of N endpoints may be ejected while EJECTED of them already are. */
bool outlier_may_eject(const struct cfg_health *h, int n, int ejected);

/* Report an attempt to EP (one of EPS[0..N), the upstream's current addresses) that ended in
 * OUT / STATUS (see outlier_is_failure). Returns true when it ejected EP. EPS, N and NOW_US
 * are read only when the outcome is a failure: a success may pass NULL, 0, 0. */
bool outlier_report(const struct cfg_health *h, struct ep_state *const *eps, int n,
                    struct ep_state *ep, enum outcome out, int status, bool hinted,
                    int64_t now_us);

#endif
