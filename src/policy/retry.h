/*
 * retry: the retry policy of SPEC §4, in one place and pure: policy + facts in, a start time
 * or a refusal reason out. retry_decide() applies rules 1-7 in SPEC order, so the first
 * failing rule names the refusal; retry_may_replay() (rules 2, 4, 5 for a reset) and
 * retry_recheck_hold() (rule 6 at the end of a wait) answer with the same rule functions, so
 * no caller re-checks a rule itself. No globals, no atomics, no clock reads: the caller
 * snapshots the shared counters (budget_peek(), the retries-in-flight count) and takes the
 * token and the slot only after a yes (retry_gate_taken() names a race lost while taking).
 */
#ifndef RG_RETRY_H
#define RG_RETRY_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"

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

/* Rule 7's inputs, read from the shared state just before the decision. */
struct retry_gate_snapshot {
	double tokens;              /* budget_peek(): tokens in the bucket now, refill included */
	int retries_in_flight;      /* retries holding a max_retries_in_flight slot now */
	int max_retries_in_flight;  /* the effective cap; 0 refuses every retry */
};

/* Zero-initialised fields mean "nothing special": no hint is -1, though, and rule 7 is judged
 * only with have_gates (a zero snapshot would read as an empty bucket and a full cap). */
struct retry_facts {
	enum outcome outcome;
	int status;                 /* with OUT_STATUS */
	bool runtime_enabled;       /* the §7 kill switch */
	bool nested;                /* response marked by a deeper retrygate, or request marked as a retry */
	int attempts;               /* attempts made so far (>= 1) */
	enum method_class method;
	bool idempotent_path;       /* the path starts with one of retry.idempotent_paths (rule 4) */
	bool grpc;                  /* OUT_STATUS is a gRPC outcome: grpc_status names it (§10) */
	int grpc_status;            /* with grpc: the grpc-status (rule 1 reads retry.on's codes) */
	bool pushback_refuse;       /* a negative or malformed grpc-retry-pushback-ms: rule 6
	                             * refuses (retry-after), no hold. A valid pushback comes as
	                             * retry_after_us, exactly like a Retry-After (with honor) */
	bool has_key;               /* non-empty idempotency header */
	bool enforced;              /* this hop deduplicates the request (SPEC §6 enforcement on,
	                             * its method in idempotency.methods, a key), and the service
	                             * behind it does not: there the key licenses (rule 4) only a
	                             * retry of an outcome that cannot have executed */
	bool not_executed;          /* the outcome cannot have executed: a connect-failure, or an
	                             * answer listed in idempotency.release_on (the caller judges
	                             * it, idem_not_executed()); read only with enforced */
	bool body_replayable;       /* no body, or fully buffered and <= retry.max_body */
	int64_t now_us;
	int64_t deadline_us;        /* absolute */
	int64_t retry_after_us;     /* -1: none; else the hint (already only for 429/503 with honor) */
	int64_t hold_until_us;      /* hold of the endpoint the retry would go to; 0: none */
	uint64_t rand;              /* random bits for the full jitter */
	bool have_gates;            /* false: rule 7 is not judged (the caller gates on its own) */
	struct retry_gate_snapshot gates;   /* with have_gates */
};

/* Rules 1-6, then rule 7 when f->have_gates. On RR_NONE sets *start_us: the earliest start of
 * the retry (now + backoff or the Retry-After hint, never before the hold). A yes from rule 7
 * reserves nothing: the caller then takes the retries-in-flight slot and the token, in that
 * order, and passes what it got to retry_gate_taken(). */
enum refusal retry_decide(const struct cfg_retry *r, const struct cfg_deadline *d,
                          const struct retry_facts *f, int64_t *start_us);

/* Rule 7 after the taking, for a race lost since the snapshot: the slot first (it can be
 * given back), then the token (it cannot; take it only with the slot in hand, and give the
 * slot back when the token is refused). A slot not got is RR_RETRIES_IN_FLIGHT, a token not
 * got RR_BUDGET, both got RR_NONE. */
enum refusal retry_gate_taken(bool slot_taken, bool token_taken);

/* May this request be re-sent if its attempt ends in a reset? Rules 2, 4 and 5 as
 * retry_decide() judges them for OUT_RESET: not nested, method repeatable (idempotent, an
 * idempotent path, or non_idempotent permits; a key not where it is enforced, since a reset
 * may have executed), body replayable. Reads only nested, method, idempotent_path, has_key,
 * enforced and body_replayable. A no means the attempt should not risk a
 * pooled connection that may have gone stale. After a connect-failure any method may go
 * again (rule 4), but that is retry_decide()'s to say, not this question's: nothing was sent.
 * Rules 1 and 3 (enabled, attempts left) are not consulted. */
bool retry_may_replay(const struct cfg_retry *r, const struct retry_facts *f);

/* Rule 6 again at the end of a backoff wait, for the hold HOLD_UNTIL_US that the chosen
 * endpoint carries now (0 or past: none): RR_NONE with *start_us = max(now, hold) when the
 * hold is at most retry_after.max ahead and start + deadline.min fits the deadline, else
 * RR_RETRY_AFTER or RR_DEADLINE. The wait itself has been served, so only the hold counts. */
enum refusal retry_recheck_hold(const struct cfg_retry *r, const struct cfg_deadline *d,
                                int64_t now_us, int64_t deadline_us, int64_t hold_until_us,
                                int64_t *start_us);

/* Backoff before retry n (n >= 1): uniform in [0, cfg_backoff_cap(r, n)] (full jitter). */
int64_t retry_backoff(const struct cfg_retry *r, int n, uint64_t rand);

enum method_class retry_method_class(const char *method);

#endif
