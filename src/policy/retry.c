/*
 * retry: the retry policy of SPEC §4, rules 1-7, as pure functions.
 *
 * One static function per rule, each returning RR_NONE (passes) or its refusal; the three
 * entry points (retry_decide, retry_may_replay, retry_recheck_hold) are chains of them, so a
 * rule is written once. The rules are checked in SPEC order and the first failing one names
 * the refusal, so the order of the chain in retry_decide() is part of the contract. All time
 * arithmetic saturates: a Retry-After of "99999999999999" or a hold far in the future must
 * refuse, never wrap into "retry now".
 */
#include "policy/retry.h"

#include <string.h>

#include "http/grpc.h"

static const char *const refusal_names[RR_NREASONS] = {
	[RR_NONE]              = "",
	[RR_NOT_LISTED]        = "",
	[RR_DISABLED]          = "disabled",
	[RR_NESTED]            = "nested",
	[RR_MAX_ATTEMPTS]      = "max-attempts",
	[RR_NON_IDEMPOTENT]    = "non-idempotent",
	[RR_BODY_TOO_LARGE]    = "body-too-large",
	[RR_RETRY_AFTER]       = "retry-after",
	[RR_DEADLINE]          = "deadline",
	[RR_BUDGET]            = "budget",
	[RR_RETRIES_IN_FLIGHT] = "retries-in-flight",
};

const char *refusal_name(enum refusal r)
{
	if ((unsigned)r >= RR_NREASONS)
		return "";
	return refusal_names[r];
}

const char *outcome_name(enum outcome o)
{
	switch (o) {
	case OUT_CONNECT_FAILURE: return "connect-failure";
	case OUT_RESET:           return "reset";
	case OUT_TIMEOUT:         return "timeout";
	case OUT_STATUS:          return "status";
	case OUT_NONE:            break;
	}
	return "";
}

enum method_class retry_method_class(const char *method)
{
	/* RFC 9110 §9.2.2; method names are case-sensitive, so "get" is not GET */
	const char *name;
	if (!method)
		return MC_OTHER;
	/* by the first byte: one compare, not one per idempotent method (a POST tried all six) */
	switch (method[0]) {
	case 'G': name = "GET"; break;
	case 'H': name = "HEAD"; break;
	case 'O': name = "OPTIONS"; break;
	case 'T': name = "TRACE"; break;
	case 'P': name = "PUT"; break;
	case 'D': name = "DELETE"; break;
	default: return MC_OTHER;
	}
	return strcmp(method, name) == 0 ? MC_IDEMPOTENT : MC_OTHER;
}

static int64_t sat_add(int64_t a, int64_t b)
{
	int64_t r;
	if (__builtin_add_overflow(a, b, &r))
		return b > 0 ? INT64_MAX : INT64_MIN;
	return r;
}

static int64_t sat_sub(int64_t a, int64_t b)
{
	int64_t r;
	if (__builtin_sub_overflow(a, b, &r))
		return b < 0 ? INT64_MAX : INT64_MIN;
	return r;
}

int64_t retry_backoff(const struct cfg_retry *r, int n, uint64_t rand)
{
	int64_t cap = cfg_backoff_cap(r, n);
	/* full jitter: uniform in [0, cap] inclusive. The multiply-high maps the 64 random bits
	 * onto cap + 1 values using the high bits (the best ones of xorshift64*); its bias is
	 * at most (cap + 1) / 2^64. */
	return (int64_t)(((unsigned __int128)rand * ((uint64_t)cap + 1)) >> 64);
}

/* Rule 1: the outcome is in retry.on (else no retry and no refusal), and retries are on. A
 * gRPC outcome is its grpc-status (SPEC §10): the :status 200 it came with is not judged. */
static enum refusal rule_listed(const struct cfg_retry *r, const struct retry_facts *f)
{
	bool listed = false;
	switch (f->outcome) {
	case OUT_CONNECT_FAILURE: listed = r->on_flags & RETRY_ON_CONNECT_FAILURE; break;
	case OUT_RESET:           listed = r->on_flags & RETRY_ON_RESET; break;
	case OUT_TIMEOUT:         listed = r->on_flags & RETRY_ON_TIMEOUT; break;
	case OUT_STATUS:
		listed = f->grpc ? cfg_retry_on_grpc(r, f->grpc_status) : cfg_retry_on_status(r, f->status);
		break;
	case OUT_NONE:            break;
	}
	if (!listed)
		return RR_NOT_LISTED;
	if (!r->enabled || !f->runtime_enabled)
		return RR_DISABLED;
	return RR_NONE;
}

/* A DEADLINE_EXCEEDED answered by a gRPC server: the call's time is gone (the server was told
 * the call's remaining time, SPEC §10), so it is never retried, listed or not. */
static enum refusal rule_grpc_deadline(const struct retry_facts *f)
{
	bool gone = f->grpc && f->outcome == OUT_STATUS && f->grpc_status == GRPC_DEADLINE_EXCEEDED;
	return gone ? RR_DEADLINE : RR_NONE;
}

/* Rule 2: one layer retries; a deeper retrygate already did (or refused). */
static enum refusal rule_nested(const struct retry_facts *f)
{
	return f->nested ? RR_NESTED : RR_NONE;
}

/* Rule 3 */
static enum refusal rule_attempts(const struct cfg_retry *r, const struct retry_facts *f)
{
	return f->attempts >= r->max_attempts ? RR_MAX_ATTEMPTS : RR_NONE;
}

/* Rule 4. A connect-failure provably never reached the upstream, so any method may go again,
 * as may any method on an idempotent path; otherwise a non-idempotent method needs the
 * policy's permission. A key is that permission only where it is not enforced here: at the
 * hop that deduplicates, the service behind does not, so the key licenses a retry only of an
 * outcome that cannot have executed (a release_on answer), never of one that may have run. */
static enum refusal rule_method(const struct cfg_retry *r, const struct retry_facts *f)
{
	if (f->method == MC_IDEMPOTENT || f->idempotent_path || f->outcome == OUT_CONNECT_FAILURE)
		return RR_NONE;
	switch (r->non_idempotent) {
	case NI_REQUIRE_KEY:
		if (!f->has_key || (f->enforced && !f->not_executed))
			return RR_NON_IDEMPOTENT;
		return RR_NONE;
	case NI_ALWAYS:      return RR_NONE;
	case NI_NEVER:       break;
	}
	return RR_NON_IDEMPOTENT;
}

/* Rule 5, for every outcome */
static enum refusal rule_body(const struct retry_facts *f)
{
	return f->body_replayable ? RR_NONE : RR_BODY_TOO_LARGE;
}

/* Rule 6 for a wait of WAIT_US from now: the start is never before the endpoint's hold. The
 * hint and the hold are judged against retry_after.max by how far ahead they lie, the start
 * against the deadline less deadline.min. A grpc-retry-pushback-ms that is negative or
 * malformed is the server saying "do not retry" (SPEC §10): retry-after, whatever the
 * deadline. On RR_NONE sets *start_us. */
static enum refusal rule_wait(const struct cfg_retry *r, const struct cfg_deadline *d,
                              const struct retry_facts *f, int64_t wait_us, int64_t *start_us)
{
	if (f->pushback_refuse)
		return RR_RETRY_AFTER;
	int64_t start = sat_add(f->now_us, wait_us);
	if (f->hold_until_us > start)
		start = f->hold_until_us;
	if (f->retry_after_us >= 0 && f->retry_after_us > r->retry_after_max_us)
		return RR_RETRY_AFTER;
	if (f->hold_until_us > 0 && sat_sub(f->hold_until_us, f->now_us) > r->retry_after_max_us)
		return RR_RETRY_AFTER;
	if (sat_add(start, d->min_us) > f->deadline_us)
		return RR_DEADLINE;
	*start_us = start;
	return RR_NONE;
}

/* Rule 7 over the snapshot: the budget first, then the slot, as SPEC §4 lists them. */
static enum refusal rule_gates(const struct retry_facts *f)
{
	if (!f->have_gates)
		return RR_NONE;
	if (f->gates.tokens < 1.0)
		return RR_BUDGET;
	if (f->gates.retries_in_flight >= f->gates.max_retries_in_flight)
		return RR_RETRIES_IN_FLIGHT;
	return RR_NONE;
}

enum refusal retry_decide(const struct cfg_retry *r, const struct cfg_deadline *d,
                          const struct retry_facts *f, int64_t *start_us)
{
	enum refusal why = rule_listed(r, f);
	if (why == RR_NONE)
		why = rule_grpc_deadline(f);
	if (why == RR_NONE)
		why = rule_nested(f);
	if (why == RR_NONE)
		why = rule_attempts(r, f);
	if (why == RR_NONE)
		why = rule_method(r, f);
	if (why == RR_NONE)
		why = rule_body(f);
	if (why != RR_NONE)
		return why;
	/* The wait before retry n = attempts is the Retry-After hint when there is a positive
	 * one (it replaces the backoff), else the jittered backoff: "Retry-After: 0 or a past
	 * date means no wait beyond the backoff", so a hint of 0 does not skip the jitter. A
	 * gRPC pushback "replaces the backoff" whatever its value (SPEC §10, gRFC A6): 0 is now. */
	bool replaces = f->retry_after_us > 0 || (f->grpc && f->retry_after_us == 0);
	int64_t wait = replaces ? f->retry_after_us : retry_backoff(r, f->attempts, f->rand);
	int64_t start;
	why = rule_wait(r, d, f, wait, &start);
	if (why == RR_NONE)
		why = rule_gates(f);
	if (why == RR_NONE)
		*start_us = start;
	return why;
}

enum refusal retry_gate_taken(bool slot_taken, bool token_taken)
{
	if (!slot_taken)
		return RR_RETRIES_IN_FLIGHT;
	return token_taken ? RR_NONE : RR_BUDGET;
}

bool retry_may_replay(const struct cfg_retry *r, const struct retry_facts *f)
{
	struct retry_facts reset = *f;
	reset.outcome = OUT_RESET;
	reset.not_executed = false;     /* a reset may have executed */
	return rule_nested(&reset) == RR_NONE && rule_method(r, &reset) == RR_NONE &&
	       rule_body(&reset) == RR_NONE;
}

enum refusal retry_recheck_hold(const struct cfg_retry *r, const struct cfg_deadline *d,
                                int64_t now_us, int64_t deadline_us, int64_t hold_until_us,
                                int64_t *start_us)
{
	/* the hint, if there was one, has been waited out and judged by retry_decide() */
	struct retry_facts f = {
		.now_us = now_us,
		.deadline_us = deadline_us,
		.retry_after_us = -1,
		.hold_until_us = hold_until_us,
	};
	return rule_wait(r, d, &f, 0, start_us);
}
