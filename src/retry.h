/*
 * retry: the retry decision of SPEC §4. retry_decide() is pure: policy + facts in, a start
 * time or a refusal reason out; it applies rules 1-6 in order. Rule 7 (budget token and
 * retries-in-flight slot) needs the shared gates and is the caller's, after retry_decide()
 * said yes, so that tokens are taken only once every other rule has passed.
 */
#ifndef RG_RETRY_H
#define RG_RETRY_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"

enum outcome {
	OUT_NONE = 0,
	OUT_CONNECT_FAILURE,        /* never written: refused, unreachable, connect timeout, TLS */
	OUT_RESET,                  /* closed/reset after writing, before a complete head; invalid */
	OUT_TIMEOUT,                /* no head within the per-try timeout */
	OUT_STATUS,                 /* a final response head arrived */
};

/* SPEC §4 refusal reasons, in rule order; RR_NONE: retry; RR_NOT_LISTED: the outcome is not
 * in retry.on, so no retry and no refusal header. */
enum refusal {
	RR_NONE = 0,
	RR_NOT_LISTED,
	RR_DISABLED,
	RR_NESTED,
	RR_MAX_ATTEMPTS,
	RR_NON_IDEMPOTENT,
	RR_BODY_TOO_LARGE,
	RR_RETRY_AFTER,
	RR_DEADLINE,
	RR_BUDGET,
	RR_RETRIES_IN_FLIGHT,
	RR_NREASONS
};

/* "max-attempts", "non-idempotent", ... ; "" for RR_NONE / RR_NOT_LISTED */
const char *refusal_name(enum refusal r);
const char *outcome_name(enum outcome o);   /* "connect-failure" "reset" "timeout" "status" */

enum method_class {
	MC_IDEMPOTENT,              /* GET HEAD OPTIONS TRACE PUT DELETE */
	MC_OTHER,                   /* anything else (POST, PATCH, ...) */
};

struct retry_facts {
	enum outcome outcome;
	int status;                 /* with OUT_STATUS */
	bool runtime_enabled;       /* the §7 kill switch */
	bool nested;                /* response marked by a deeper retrygate, or request marked as a retry */
	int attempts;               /* attempts made so far (>= 1) */
	enum method_class method;
	bool idempotent_path;       /* the path starts with one of retry.idempotent_paths (rule 4) */
	bool has_key;               /* non-empty idempotency header */
	bool body_replayable;       /* no body, or fully buffered and <= retry.max_body */
	int64_t now_us;
	int64_t deadline_us;        /* absolute */
	int64_t retry_after_us;     /* -1: none; else the hint (already only for 429/503 with honor) */
	int64_t hold_until_us;      /* hold of the endpoint the retry would go to; 0: none */
	uint64_t rand;              /* random bits for the full jitter */
};

/* Rules 1-6. On RR_NONE sets *start_us: the earliest start of the retry (now + backoff or
 * the Retry-After hint, never before the hold). */
enum refusal retry_decide(const struct cfg_retry *r, const struct cfg_deadline *d,
                          const struct retry_facts *f, int64_t *start_us);

/* The backoff cap before retry n: min(max, base * 2^(n-1)), saturating; n below 1 counts as
 * 1; 0 when base or max is not positive. */
int64_t retry_backoff_cap(const struct cfg_retry *r, int n);

/* Backoff before retry n (n >= 1): uniform in [0, retry_backoff_cap(r, n)] (full jitter). */
int64_t retry_backoff(const struct cfg_retry *r, int n, uint64_t rand);

enum method_class retry_method_class(const char *method);

#endif
