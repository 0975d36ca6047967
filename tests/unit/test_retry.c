/*
 * test_retry: SPEC §4 rules 1-7 as one table, one row per rule, per refusal reason and per
 * interaction between rules; then the tables of the other entry points (replay after a
 * reset, the hold re-check after a wait, the backoff cap), the backoff distribution, the
 * method classes and the names.
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "http/grpc.h"
#include "policy/retry.h"

#define MS 1000LL
#define S  1000000LL

#define NOW (1000 * S)
#define RAND_TOP UINT64_MAX     /* random bits that make the backoff its cap */

/* The SPEC §2 defaults. */
static struct cfg_retry base_retry(void)
{
	struct cfg_retry r;
	memset(&r, 0, sizeof(r));
	r.enabled = true;
	r.max_attempts = 3;
	r.per_try_timeout_us = 1 * S;
	r.on_flags = RETRY_ON_CONNECT_FAILURE | RETRY_ON_RESET | RETRY_ON_TIMEOUT;
	for (int st = 502; st <= 504; st++)
		r.on_status[(st - 400) / 8] |= (uint8_t)(1u << ((st - 400) % 8));
	r.backoff_base_us = 25 * MS;
	r.backoff_max_us = 250 * MS;
	r.retry_after_honor = true;
	r.retry_after_max_us = 10 * S;
	r.budget_ratio = 0.2;
	r.budget_min_per_second = 10;
	r.budget_max_tokens = 100;
	r.non_idempotent = NI_REQUIRE_KEY;
	r.max_body = 64 * 1024;
	r.on_grpc = 1u << GRPC_UNAVAILABLE;     /* SPEC §10 */
	return r;
}

static const struct cfg_deadline dcfg = { .default_us = 5 * S, .max_us = 30 * S, .min_us = 5 * MS };

/* A row states only what differs from "a GET that got a 503 on its first attempt, with a
 * 5 s deadline, no hint, no hold, zero jitter". Times are relative to NOW. */
struct row {
	const char *why;
	enum outcome outcome;       /* OUT_NONE here means OUT_STATUS */
	int status;                 /* 0: 503 */
	const char *method;         /* NULL: GET */
	bool idempotent_path;       /* the path matched retry.idempotent_paths */
	bool has_key;
	bool body_big;
	bool nested;
	bool cfg_disabled;
	bool runtime_off;
	int attempts;               /* 0: 1 */
	int max_attempts;           /* 0: 3 */
	unsigned on_clear;          /* RETRY_ON_* bits removed from retry.on */
	enum non_idempotent ni;     /* NI_REQUIRE_KEY is 0, the default */
	bool has_ra;
	int64_t ra_us;
	int64_t hold_in_us;         /* 0: no hold */
	int64_t deadline_in_us;     /* 0: 5 s */
	uint64_t rand;
	bool explicit_outcome_none; /* really OUT_NONE */
	bool gates;                 /* rule 7 judged, over the three figures below */
	double tokens;
	int in_flight;              /* retries holding a slot */
	int cap;                    /* max_retries_in_flight */
	bool grpc;                  /* a gRPC outcome: grpc_status names it */
	int grpc_status;
	uint32_t grpc_on;           /* 0: retry.on's gRPC codes are the default (unavailable) */
	bool pushback_refuse;       /* a negative or malformed grpc-retry-pushback-ms */
	bool enforced;              /* this hop enforces the key (SPEC §6) */
	bool not_executed;          /* the outcome was a release_on answer */
	enum refusal want;
	int64_t want_start_in;      /* checked when want is RR_NONE */
};

static const struct row rows[] = {
	/* rule 1: listed in retry.on, and enabled */
	{ .why = "connect-failure is listed: retry", .outcome = OUT_CONNECT_FAILURE, .want = RR_NONE },
	{ .why = "reset is listed: retry", .outcome = OUT_RESET, .want = RR_NONE },
	{ .why = "timeout is listed: retry", .outcome = OUT_TIMEOUT, .want = RR_NONE },
	{ .why = "502 is listed: retry", .status = 502, .want = RR_NONE },
	{ .why = "503 is listed: retry", .status = 503, .want = RR_NONE },
	{ .why = "504 is listed: retry", .status = 504, .want = RR_NONE },
	{ .why = "500 is not listed: no retry, no refusal", .status = 500, .want = RR_NOT_LISTED },
	{ .why = "429 is not listed by default", .status = 429, .want = RR_NOT_LISTED },
	{ .why = "200 is never listed", .status = 200, .want = RR_NOT_LISTED },
	{ .why = "a status above 599 is never listed", .status = 600, .want = RR_NOT_LISTED },
	{ .why = "connect-failure not in retry.on: not listed", .outcome = OUT_CONNECT_FAILURE,
	  .on_clear = RETRY_ON_CONNECT_FAILURE, .want = RR_NOT_LISTED },
	{ .why = "reset not in retry.on: not listed", .outcome = OUT_RESET,
	  .on_clear = RETRY_ON_RESET, .want = RR_NOT_LISTED },
	{ .why = "timeout not in retry.on: not listed", .outcome = OUT_TIMEOUT,
	  .on_clear = RETRY_ON_TIMEOUT, .want = RR_NOT_LISTED },
	{ .why = "no outcome is not listed", .explicit_outcome_none = true, .want = RR_NOT_LISTED },
	{ .why = "listed but retry.enabled is off: disabled", .cfg_disabled = true,
	  .want = RR_DISABLED },
	{ .why = "listed but the runtime switch is off: disabled", .runtime_off = true,
	  .want = RR_DISABLED },
	{ .why = "not listed and disabled: not listed (no refusal header)", .status = 500,
	  .cfg_disabled = true, .want = RR_NOT_LISTED },

	/* rule 2: nested */
	{ .why = "retrying already done deeper: nested", .nested = true, .want = RR_NESTED },
	{ .why = "disabled beats nested", .nested = true, .runtime_off = true, .want = RR_DISABLED },
	{ .why = "a nested connect-failure is nested too", .outcome = OUT_CONNECT_FAILURE,
	  .nested = true, .want = RR_NESTED },

	/* rule 3: attempts */
	{ .why = "2 attempts of 3: retry", .attempts = 2, .want = RR_NONE },
	{ .why = "3 attempts of 3: max-attempts", .attempts = 3, .want = RR_MAX_ATTEMPTS },
	{ .why = "max_attempts 1 never retries", .max_attempts = 1, .want = RR_MAX_ATTEMPTS },
	{ .why = "nested beats max-attempts", .nested = true, .attempts = 3, .want = RR_NESTED },

	/* rule 4: method */
	{ .why = "PUT is idempotent", .method = "PUT", .outcome = OUT_RESET, .want = RR_NONE },
	{ .why = "DELETE is idempotent", .method = "DELETE", .outcome = OUT_RESET, .want = RR_NONE },
	{ .why = "POST without key after reset: non-idempotent", .method = "POST",
	  .outcome = OUT_RESET, .want = RR_NON_IDEMPOTENT },
	{ .why = "POST without key after timeout: non-idempotent", .method = "POST",
	  .outcome = OUT_TIMEOUT, .want = RR_NON_IDEMPOTENT },
	{ .why = "POST without key after 503: non-idempotent", .method = "POST",
	  .want = RR_NON_IDEMPOTENT },
	{ .why = "POST without key after connect-failure: retry (never reached the upstream)",
	  .method = "POST", .outcome = OUT_CONNECT_FAILURE, .want = RR_NONE },
	{ .why = "POST with key after reset (require-key): retry", .method = "POST",
	  .outcome = OUT_RESET, .has_key = true, .want = RR_NONE },
	{ .why = "PATCH with key after 503 (require-key): retry", .method = "PATCH",
	  .has_key = true, .want = RR_NONE },
	{ .why = "non_idempotent never: POST with key is refused", .method = "POST",
	  .has_key = true, .ni = NI_NEVER, .want = RR_NON_IDEMPOTENT },
	{ .why = "non_idempotent never still retries a connect-failure", .method = "POST",
	  .outcome = OUT_CONNECT_FAILURE, .ni = NI_NEVER, .want = RR_NONE },
	{ .why = "non_idempotent always: POST without key after reset retries", .method = "POST",
	  .outcome = OUT_RESET, .ni = NI_ALWAYS, .want = RR_NONE },
	{ .why = "GET under never is still idempotent", .ni = NI_NEVER, .want = RR_NONE },
	{ .why = "max-attempts beats non-idempotent", .method = "POST", .attempts = 3,
	  .want = RR_MAX_ATTEMPTS },
	{ .why = "POST on an idempotent path after reset: retry", .method = "POST",
	  .idempotent_path = true, .outcome = OUT_RESET, .want = RR_NONE },
	{ .why = "an idempotent path is idempotent whatever non_idempotent says", .method = "POST",
	  .idempotent_path = true, .ni = NI_NEVER, .want = RR_NONE },

	/* rule 4 where this hop enforces the key (SPEC §6): the service behind does not
	 * deduplicate, so the key licenses only a retry of what cannot have executed */
	{ .why = "enforced key, 503 in release_on: retry", .method = "POST", .has_key = true,
	  .enforced = true, .not_executed = true, .want = RR_NONE },
	{ .why = "enforced key, 503 not in release_on: non-idempotent", .method = "POST",
	  .has_key = true, .enforced = true, .want = RR_NON_IDEMPOTENT },
	{ .why = "enforced key after reset: non-idempotent", .method = "POST", .has_key = true,
	  .enforced = true, .outcome = OUT_RESET, .want = RR_NON_IDEMPOTENT },
	{ .why = "enforced key after timeout: non-idempotent", .method = "POST", .has_key = true,
	  .enforced = true, .outcome = OUT_TIMEOUT, .want = RR_NON_IDEMPOTENT },
	{ .why = "enforced key after connect-failure: retry", .method = "POST", .has_key = true,
	  .enforced = true, .outcome = OUT_CONNECT_FAILURE, .want = RR_NONE },
	{ .why = "enforced gRPC call, unavailable not in release_on: non-idempotent",
	  .method = "POST", .has_key = true, .enforced = true, .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .want = RR_NON_IDEMPOTENT },
	{ .why = "enforced gRPC call, unavailable in release_on: retry", .method = "POST",
	  .has_key = true, .enforced = true, .grpc = true, .grpc_status = GRPC_UNAVAILABLE,
	  .not_executed = true, .want = RR_NONE },
	{ .why = "enforced, GET with a key is idempotent anyway", .has_key = true,
	  .enforced = true, .outcome = OUT_RESET, .want = RR_NONE },
	{ .why = "enforced, POST on an idempotent path after reset: retry", .method = "POST",
	  .has_key = true, .enforced = true, .idempotent_path = true, .outcome = OUT_RESET,
	  .want = RR_NONE },
	{ .why = "enforced, non_idempotent always: the key is not the license, retry",
	  .method = "POST", .has_key = true, .enforced = true, .ni = NI_ALWAYS,
	  .outcome = OUT_RESET, .want = RR_NONE },
	{ .why = "enforced, never: a release_on answer licenses nothing", .method = "POST",
	  .has_key = true, .enforced = true, .not_executed = true, .ni = NI_NEVER,
	  .want = RR_NON_IDEMPOTENT },
	{ .why = "not enforced (no key) and a release_on answer: non-idempotent", .method = "POST",
	  .not_executed = true, .want = RR_NON_IDEMPOTENT },
	{ .why = "max-attempts beats the enforcing hop's non-idempotent", .method = "POST",
	  .has_key = true, .enforced = true, .attempts = 3, .want = RR_MAX_ATTEMPTS },
	{ .why = "the enforcing hop's non-idempotent beats body-too-large", .method = "POST",
	  .has_key = true, .enforced = true, .outcome = OUT_RESET, .body_big = true,
	  .want = RR_NON_IDEMPOTENT },

	/* rule 5: body */
	{ .why = "a body over retry.max_body: body-too-large", .body_big = true,
	  .want = RR_BODY_TOO_LARGE },
	{ .why = "POST with key and oversized body: body-too-large", .method = "POST",
	  .has_key = true, .body_big = true, .want = RR_BODY_TOO_LARGE },
	{ .why = "body-too-large holds even after connect-failure", .outcome = OUT_CONNECT_FAILURE,
	  .body_big = true, .want = RR_BODY_TOO_LARGE },
	{ .why = "non-idempotent beats body-too-large", .method = "POST", .outcome = OUT_RESET,
	  .body_big = true, .want = RR_NON_IDEMPOTENT },

	/* rule 6: the wait */
	{ .why = "zero jitter: the retry may start now", .want = RR_NONE, .want_start_in = 0 },
	{ .why = "full jitter at its top: backoff base before retry 1", .rand = RAND_TOP,
	  .want = RR_NONE, .want_start_in = 25 * MS },
	{ .why = "before retry 2 the cap doubles", .attempts = 2, .rand = RAND_TOP,
	  .want = RR_NONE, .want_start_in = 50 * MS },
	{ .why = "Retry-After replaces the backoff", .has_ra = true, .ra_us = 2 * S,
	  .rand = RAND_TOP, .want = RR_NONE, .want_start_in = 2 * S },
	{ .why = "Retry-After: 0 means no wait beyond the backoff", .has_ra = true, .ra_us = 0,
	  .rand = RAND_TOP, .want = RR_NONE, .want_start_in = 25 * MS },
	{ .why = "Retry-After exactly retry_after.max is acceptable", .has_ra = true,
	  .ra_us = 10 * S, .deadline_in_us = 20 * S, .want = RR_NONE, .want_start_in = 10 * S },
	{ .why = "Retry-After longer than retry_after.max: retry-after", .has_ra = true,
	  .ra_us = 11 * S, .deadline_in_us = 20 * S, .want = RR_RETRY_AFTER },
	{ .why = "Retry-After that does not fit the deadline: deadline", .has_ra = true,
	  .ra_us = 8 * S, .want = RR_DEADLINE },
	{ .why = "Retry-After past both: retry-after comes first", .has_ra = true, .ra_us = 11 * S,
	  .want = RR_RETRY_AFTER },
	{ .why = "a huge Retry-After saturates into retry-after", .has_ra = true,
	  .ra_us = INT64_MAX, .want = RR_RETRY_AFTER },
	{ .why = "the hold pushes the start later", .hold_in_us = 3 * S, .rand = RAND_TOP,
	  .want = RR_NONE, .want_start_in = 3 * S },
	{ .why = "a hold already over does not delay", .hold_in_us = -1 * S, .rand = RAND_TOP,
	  .want = RR_NONE, .want_start_in = 25 * MS },
	{ .why = "a hold ending before the hint: the hint", .has_ra = true, .ra_us = 2 * S,
	  .hold_in_us = 1 * S, .want = RR_NONE, .want_start_in = 2 * S },
	{ .why = "a hold ending after the hint: the hold", .has_ra = true, .ra_us = 1 * S,
	  .hold_in_us = 3 * S, .want = RR_NONE, .want_start_in = 3 * S },
	{ .why = "a hold further than retry_after.max: retry-after", .hold_in_us = 12 * S,
	  .deadline_in_us = 30 * S, .want = RR_RETRY_AFTER },
	{ .why = "a hold further than max even when the hint is small: retry-after", .has_ra = true,
	  .ra_us = 1 * S, .hold_in_us = 12 * S, .deadline_in_us = 30 * S, .want = RR_RETRY_AFTER },
	{ .why = "a hold past the deadline: deadline", .hold_in_us = 6 * S, .want = RR_DEADLINE },
	{ .why = "a huge hold saturates into retry-after", .hold_in_us = INT64_MAX - NOW,
	  .want = RR_RETRY_AFTER },
	{ .why = "backoff plus deadline.min past the deadline: deadline", .rand = RAND_TOP,
	  .deadline_in_us = 29 * MS, .want = RR_DEADLINE },
	{ .why = "backoff plus deadline.min exactly at the deadline: retry", .rand = RAND_TOP,
	  .deadline_in_us = 30 * MS, .want = RR_NONE, .want_start_in = 25 * MS },
	{ .why = "less than deadline.min left: deadline even with no wait", .deadline_in_us = 4 * MS,
	  .want = RR_DEADLINE },
	{ .why = "deadline already gone: deadline", .deadline_in_us = -1, .want = RR_DEADLINE },
	{ .why = "body-too-large beats the wait", .body_big = true, .deadline_in_us = -1,
	  .want = RR_BODY_TOO_LARGE },
	{ .why = "an idempotent path still needs a replayable body", .method = "POST",
	  .idempotent_path = true, .body_big = true, .want = RR_BODY_TOO_LARGE },

	/* SPEC §10: a gRPC outcome is its grpc-status; every call is a POST */
	{ .why = "gRPC unavailable on an idempotent path: retry", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .idempotent_path = true,
	  .want = RR_NONE, .want_start_in = 0 },
	{ .why = "gRPC internal is not listed by default", .grpc = true,
	  .grpc_status = GRPC_INTERNAL, .method = "POST", .idempotent_path = true,
	  .want = RR_NOT_LISTED },
	{ .why = "gRPC ok is never listed", .grpc = true, .grpc_status = 0, .method = "POST",
	  .grpc_on = 0xffffffffu, .idempotent_path = true, .want = RR_NOT_LISTED },
	{ .why = "a gRPC code listed by name: retry", .grpc = true, .grpc_status = 8,
	  .grpc_on = 1u << 8, .method = "POST", .has_key = true, .want = RR_NONE },
	{ .why = "only the listed codes: unavailable dropped from retry.on", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .grpc_on = 1u << 8, .method = "POST", .has_key = true,
	  .want = RR_NOT_LISTED },
	{ .why = "the HTTP status beside a gRPC outcome is not judged", .grpc = true,
	  .status = 503, .grpc_status = GRPC_INTERNAL, .method = "POST", .has_key = true,
	  .want = RR_NOT_LISTED },
	{ .why = "a grpc-status without a gRPC outcome is not judged", .status = 200,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .has_key = true,
	  .want = RR_NOT_LISTED },
	{ .why = "gRPC deadline-exceeded listed: never retried, the call's time is gone",
	  .grpc = true, .grpc_status = GRPC_DEADLINE_EXCEEDED, .grpc_on = 1u << 4, .method = "POST",
	  .idempotent_path = true, .want = RR_DEADLINE },
	{ .why = "gRPC deadline-exceeded not listed: relayed without a refusal", .grpc = true,
	  .grpc_status = GRPC_DEADLINE_EXCEEDED, .method = "POST", .idempotent_path = true,
	  .want = RR_NOT_LISTED },
	{ .why = "gRPC unavailable without key or idempotent path: non-idempotent", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .want = RR_NON_IDEMPOTENT },
	{ .why = "gRPC unavailable with idempotency-key: retry", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .has_key = true, .want = RR_NONE },
	{ .why = "gRPC unavailable under always: retry", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .ni = NI_ALWAYS, .want = RR_NONE },
	{ .why = "gRPC on an idempotent path under never: retry", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .ni = NI_NEVER,
	  .idempotent_path = true, .want = RR_NONE },
	{ .why = "a gRPC call after connect-failure: retry whatever the method",
	  .outcome = OUT_CONNECT_FAILURE, .method = "POST", .want = RR_NONE },
	{ .why = "a gRPC call after reset without key: non-idempotent", .outcome = OUT_RESET,
	  .method = "POST", .want = RR_NON_IDEMPOTENT },
	{ .why = "a gRPC call marked by its client's retries: nested", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .has_key = true, .nested = true,
	  .want = RR_NESTED },
	{ .why = "gRPC unavailable disabled: disabled", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .has_key = true, .runtime_off = true,
	  .want = RR_DISABLED },
	{ .why = "gRPC with attempts used up: max-attempts", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .has_key = true, .attempts = 3,
	  .want = RR_MAX_ATTEMPTS },
	{ .why = "gRPC whose messages outgrew max_body: body-too-large", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .has_key = true, .body_big = true,
	  .want = RR_BODY_TOO_LARGE },
	{ .why = "pushback replaces the backoff like Retry-After", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .has_key = true, .has_ra = true,
	  .ra_us = 300 * MS, .rand = RAND_TOP, .want = RR_NONE, .want_start_in = 300 * MS },
	{ .why = "pushback 0 replaces the backoff too: at once", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .has_key = true, .has_ra = true,
	  .ra_us = 0, .rand = RAND_TOP, .want = RR_NONE, .want_start_in = 0 },
	{ .why = "pushback beyond retry_after.max: retry-after", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .has_key = true, .has_ra = true,
	  .ra_us = 11 * S, .deadline_in_us = 20 * S, .want = RR_RETRY_AFTER },
	{ .why = "pushback that does not fit the deadline: deadline", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .has_key = true, .has_ra = true,
	  .ra_us = 6 * S, .want = RR_DEADLINE },
	{ .why = "a negative or malformed pushback: retry-after", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .has_key = true,
	  .pushback_refuse = true, .want = RR_RETRY_AFTER },
	{ .why = "a refusing pushback beats the deadline", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .has_key = true,
	  .pushback_refuse = true, .deadline_in_us = 4 * MS, .want = RR_RETRY_AFTER },
	{ .why = "non-idempotent beats a refusing pushback", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .pushback_refuse = true,
	  .want = RR_NON_IDEMPOTENT },
	{ .why = "a refusing pushback on an unlisted code: not listed", .grpc = true,
	  .grpc_status = GRPC_INTERNAL, .method = "POST", .has_key = true,
	  .pushback_refuse = true, .want = RR_NOT_LISTED },
	{ .why = "a refusing pushback beats an empty budget", .grpc = true,
	  .grpc_status = GRPC_UNAVAILABLE, .method = "POST", .has_key = true,
	  .pushback_refuse = true, .gates = true, .tokens = 0, .cap = 32, .want = RR_RETRY_AFTER },

	/* rule 7: a token, then a slot, judged over a snapshot */
	{ .why = "tokens and a slot: retry", .gates = true, .tokens = 5, .in_flight = 3, .cap = 32,
	  .rand = RAND_TOP, .want = RR_NONE, .want_start_in = 25 * MS },
	{ .why = "budget empty: budget", .gates = true, .tokens = 0, .in_flight = 0, .cap = 32,
	  .want = RR_BUDGET },
	{ .why = "slots full: retries-in-flight", .gates = true, .tokens = 5, .in_flight = 32,
	  .cap = 32, .want = RR_RETRIES_IN_FLIGHT },
	{ .why = "budget empty and slots full: budget comes first", .gates = true, .tokens = 0,
	  .in_flight = 32, .cap = 32, .want = RR_BUDGET },
	{ .why = "0.99 of a token is no token: budget", .gates = true, .tokens = 0.99,
	  .in_flight = 0, .cap = 32, .want = RR_BUDGET },
	{ .why = "exactly one token: retry", .gates = true, .tokens = 1.0, .in_flight = 0,
	  .cap = 32, .want = RR_NONE },
	{ .why = "the last free slot: retry", .gates = true, .tokens = 1.0, .in_flight = 31,
	  .cap = 32, .want = RR_NONE },
	{ .why = "more in flight than a lowered cap: retries-in-flight", .gates = true,
	  .tokens = 5, .in_flight = 40, .cap = 32, .want = RR_RETRIES_IN_FLIGHT },
	{ .why = "max_retries_in_flight 0 refuses every retry", .gates = true, .tokens = 5,
	  .in_flight = 0, .cap = 0, .want = RR_RETRIES_IN_FLIGHT },
	{ .why = "without a snapshot rule 7 is the caller's: a zero snapshot is ignored",
	  .gates = false, .tokens = 0, .in_flight = 0, .cap = 0, .want = RR_NONE },
	{ .why = "not listed beats budget: no refusal", .status = 500, .gates = true, .tokens = 0,
	  .cap = 32, .want = RR_NOT_LISTED },
	{ .why = "non-idempotent beats budget", .method = "POST", .outcome = OUT_RESET,
	  .gates = true, .tokens = 0, .cap = 32, .want = RR_NON_IDEMPOTENT },
	{ .why = "retry-after beats retries-in-flight", .has_ra = true, .ra_us = 11 * S,
	  .gates = true, .tokens = 5, .in_flight = 32, .cap = 32, .want = RR_RETRY_AFTER },
	{ .why = "deadline beats budget", .deadline_in_us = 4 * MS, .gates = true, .tokens = 0,
	  .cap = 32, .want = RR_DEADLINE },
	{ .why = "a hold past the deadline beats a full cap: deadline", .hold_in_us = 6 * S,
	  .gates = true, .tokens = 5, .in_flight = 32, .cap = 32, .want = RR_DEADLINE },
};

static enum refusal run_row(const struct row *t, int64_t *start)
{
	struct cfg_retry r = base_retry();
	r.enabled = !t->cfg_disabled;
	if (t->max_attempts)
		r.max_attempts = t->max_attempts;
	r.on_flags &= ~t->on_clear;
	r.non_idempotent = t->ni;
	if (t->grpc_on)
		r.on_grpc = t->grpc_on;

	struct retry_facts f;
	memset(&f, 0, sizeof(f));
	f.outcome = t->explicit_outcome_none ? OUT_NONE : t->outcome ? t->outcome : OUT_STATUS;
	f.status = f.outcome == OUT_STATUS ? (t->status ? t->status : t->grpc ? 200 : 503) : 0;
	f.grpc = t->grpc;
	f.grpc_status = t->grpc_status;
	f.pushback_refuse = t->pushback_refuse;
	f.runtime_enabled = !t->runtime_off;
	f.nested = t->nested;
	f.attempts = t->attempts ? t->attempts : 1;
	f.method = retry_method_class(t->method ? t->method : "GET");
	f.idempotent_path = t->idempotent_path;
	f.has_key = t->has_key;
	f.enforced = t->enforced;
	f.not_executed = t->not_executed;
	f.body_replayable = !t->body_big;
	f.now_us = NOW;
	f.deadline_us = NOW + (t->deadline_in_us ? t->deadline_in_us : 5 * S);
	f.retry_after_us = t->has_ra ? t->ra_us : -1;
	f.hold_until_us = t->hold_in_us ? NOW + t->hold_in_us : 0;
	f.rand = t->rand;
	f.have_gates = t->gates;
	f.gates = (struct retry_gate_snapshot){ .tokens = t->tokens,
	                                        .retries_in_flight = t->in_flight,
	                                        .max_retries_in_flight = t->cap };
	return retry_decide(&r, &dcfg, &f, start);
}

static void test_decide_table(void **state)
{
	int bad = 0;
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		const struct row *t = &rows[i];
		int64_t start = -1;
		enum refusal got = run_row(t, &start);
		bool ok = got == t->want;
		if (ok && got == RR_NONE && start != NOW + t->want_start_in)
			ok = false;
		if (!ok) {
			print_error("%s: got %d \"%s\" start +%lld us, want %d \"%s\" start +%lld us\n",
			            t->why, got, refusal_name(got), (long long)(start - NOW), t->want,
			            refusal_name(t->want), (long long)t->want_start_in);
			bad++;
		}
	}
	assert_int_equal(bad, 0);
}

/* Rule 7 with room to spare changes no answer of rules 1-6, nor the start. */
static void test_roomy_gates_change_nothing(void **state)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct row t = rows[i];
		if (t.gates)
			continue;
		int64_t start = -1, start_gated = -2;
		enum refusal want = run_row(&t, &start);
		t.gates = true;
		t.tokens = 100;
		t.in_flight = 0;
		t.cap = 32;
		enum refusal got = run_row(&t, &start_gated);
		if (got != want || (got == RR_NONE && start != start_gated))
			print_error("%s: %s with room in the gates, %s without\n", t.why,
			            refusal_name(got), refusal_name(want));
		assert_int_equal(got, want);
		if (got == RR_NONE)
			assert_int_equal(start_gated, start);
	}
}

/* SPEC §10: a gRPC outcome whose code is listed is judged by rules 2-7 exactly as a listed
 * HTTP status; one whose code is not listed is not listed, whatever else holds. */
static void test_grpc_outcome_judged_like_status(void **state)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct row t = rows[i];
		if (t.grpc || t.outcome || t.explicit_outcome_none || t.grpc_status || t.pushback_refuse)
			continue;
		int st = t.status ? t.status : 503;
		if (st < 502 || st > 504)
			continue;
		int64_t start = -1, start_grpc = -2;
		enum refusal want = run_row(&t, &start);
		t.grpc = true;
		t.grpc_status = GRPC_UNAVAILABLE;
		t.status = 200;
		enum refusal got = run_row(&t, &start_grpc);
		if (got != want)
			print_error("%s: %s as gRPC unavailable, %s as %d\n", t.why, refusal_name(got),
			            refusal_name(want), st);
		assert_int_equal(got, want);
		/* the start is the same, except that a pushback of 0 replaces the backoff where a
		 * Retry-After of 0 does not */
		if (got == RR_NONE && !(t.has_ra && t.ra_us == 0))
			assert_int_equal(start_grpc, start);
		for (int code = 0; code < GRPC_NCODES; code++) {
			if (code == GRPC_UNAVAILABLE)
				continue;
			t.grpc_status = code;
			assert_int_equal(run_row(&t, &start_grpc), RR_NOT_LISTED);
		}
	}
}

/* A refusing pushback changes nothing that rules 1-5 refuse, and turns every other answer
 * into retry-after (no wait, hold or gate can outvote "do not retry"). */
static void test_pushback_refuse_property(void **state)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct row t = rows[i];
		int64_t start = -1;
		enum refusal before = run_row(&t, &start);
		t.pushback_refuse = true;
		enum refusal got = run_row(&t, &start);
		bool early = before == RR_NOT_LISTED || before == RR_DISABLED || before == RR_NESTED ||
		             before == RR_MAX_ATTEMPTS || before == RR_NON_IDEMPOTENT ||
		             before == RR_BODY_TOO_LARGE ||
		             /* a server's deadline-exceeded is refused before any wait is weighed */
		             (t.grpc && t.grpc_status == GRPC_DEADLINE_EXCEEDED);
		if (got != (early ? before : RR_RETRY_AFTER))
			print_error("%s: %s with a refusing pushback, %s without\n", t.why,
			            refusal_name(got), refusal_name(before));
		assert_int_equal(got, early ? before : RR_RETRY_AFTER);
	}
}

/* Every refusal reason appears in the table. */
static void test_table_covers_every_reason(void **state)
{
	bool seen[RR_NREASONS] = { false };
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		seen[rows[i].want] = true;
	for (int r = RR_NONE; r < RR_NREASONS; r++) {
		if (!seen[r])
			print_error("no row for reason %d \"%s\"\n", r, refusal_name((enum refusal)r));
		assert_true(seen[r]);
	}
}

/* A race lost between the snapshot and the taking is named by what was not got. */
static void test_gate_taken(void **state)
{
	assert_int_equal(retry_gate_taken(true, true), RR_NONE);
	assert_int_equal(retry_gate_taken(true, false), RR_BUDGET);
	assert_int_equal(retry_gate_taken(false, false), RR_RETRIES_IN_FLIGHT);
	assert_int_equal(retry_gate_taken(false, true), RR_RETRIES_IN_FLIGHT);
}

/* May the request be re-sent after a reset (so a pooled connection is worth the risk)? The
 * rows state what differs from "a GET without body, not nested, require-key". Whether a
 * connect-failure may be retried is not this question: nothing was sent then, and
 * retry_decide() lets any method go again. */
static const struct replay_row {
	const char *why;
	const char *method;         /* NULL: GET */
	bool has_key;
	bool idempotent_path;
	bool body_big;              /* streamed, or over retry.max_body */
	bool nested;
	enum non_idempotent ni;
	enum outcome outcome;       /* ignored: the question is about a reset */
	bool enforced;              /* this hop enforces the key (SPEC §6) */
	bool not_executed;          /* ignored too: a reset may have executed */
	bool want;
} replay_rows[] = {
	{ .why = "GET after reset: yes", .want = true },
	{ .why = "PUT after reset: yes", .method = "PUT", .want = true },
	{ .why = "POST without key (require-key): no", .method = "POST", .want = false },
	{ .why = "POST with key (require-key): yes", .method = "POST", .has_key = true,
	  .want = true },
	{ .why = "POST with key under never: no", .method = "POST", .has_key = true,
	  .ni = NI_NEVER, .want = false },
	{ .why = "POST without key under always: yes", .method = "POST", .ni = NI_ALWAYS,
	  .want = true },
	{ .why = "GET under never: yes", .ni = NI_NEVER, .want = true },
	{ .why = "POST on an idempotent path: yes", .method = "POST", .idempotent_path = true,
	  .want = true },
	{ .why = "a streamed body: no", .body_big = true, .want = false },
	{ .why = "a streamed body under always: no", .method = "POST", .ni = NI_ALWAYS,
	  .body_big = true, .want = false },
	{ .why = "a nested request: no", .nested = true, .want = false },
	{ .why = "an outcome of connect-failure in the facts changes nothing: POST without key "
	  "is no", .method = "POST", .outcome = OUT_CONNECT_FAILURE, .want = false },
	{ .why = "POST with a key enforced here: no (a reset may have executed)", .method = "POST",
	  .has_key = true, .enforced = true, .want = false },
	{ .why = "... even when the last outcome was a release_on answer", .method = "POST",
	  .has_key = true, .enforced = true, .not_executed = true, .want = false },
	{ .why = "GET with a key enforced here: yes", .has_key = true, .enforced = true,
	  .want = true },
	{ .why = "POST on an idempotent path enforced here: yes", .method = "POST",
	  .has_key = true, .enforced = true, .idempotent_path = true, .want = true },
};

static struct retry_facts replay_facts(const struct replay_row *t)
{
	struct retry_facts f;
	memset(&f, 0, sizeof(f));
	f.outcome = t->outcome;
	f.method = retry_method_class(t->method ? t->method : "GET");
	f.has_key = t->has_key;
	f.idempotent_path = t->idempotent_path;
	f.body_replayable = !t->body_big;
	f.nested = t->nested;
	f.enforced = t->enforced;
	f.not_executed = t->not_executed;
	return f;
}

static void test_may_replay_table(void **state)
{
	int bad = 0;
	for (size_t i = 0; i < sizeof(replay_rows) / sizeof(replay_rows[0]); i++) {
		const struct replay_row *t = &replay_rows[i];
		struct cfg_retry r = base_retry();
		r.non_idempotent = t->ni;
		struct retry_facts f = replay_facts(t);
		if (retry_may_replay(&r, &f) != t->want) {
			print_error("%s: got %d\n", t->why, !t->want);
			bad++;
		}
	}
	assert_int_equal(bad, 0);
}

/* retry_may_replay() is retry_decide() for a reset with every other rule passing: over every
 * combination of its inputs, yes exactly when retry_decide() would retry the reset. */
static void test_may_replay_agrees_with_decide(void **state)
{
	static const char *const methods[] = { "GET", "POST" };
	static const enum non_idempotent nis[] = { NI_REQUIRE_KEY, NI_NEVER, NI_ALWAYS };
	for (unsigned bits = 0; bits < 32; bits++)
		for (size_t m = 0; m < 2; m++)
			for (size_t n = 0; n < 3; n++) {
				struct replay_row t = {
					.method = methods[m], .has_key = bits & 1,
					.idempotent_path = bits & 2, .body_big = bits & 4,
					.nested = bits & 8, .enforced = bits & 16, .ni = nis[n],
				};
				struct cfg_retry r = base_retry();
				r.non_idempotent = t.ni;
				struct retry_facts f = replay_facts(&t);
				bool replay = retry_may_replay(&r, &f);
				f.outcome = OUT_RESET;
				f.runtime_enabled = true;
				f.attempts = 1;
				f.now_us = NOW;
				f.deadline_us = NOW + 5 * S;
				f.retry_after_us = -1;
				int64_t start;
				assert_int_equal(replay, retry_decide(&r, &dcfg, &f, &start) == RR_NONE);
			}
}

/* Rule 6 at the end of a backoff, for a hold that appeared during the wait. A 5 s deadline,
 * deadline.min 5 ms, retry_after.max 10 s; times relative to NOW. */
static const struct recheck_row {
	const char *why;
	int64_t hold_in_us;         /* 0: no hold */
	int64_t deadline_in_us;     /* 0: 5 s */
	enum refusal want;
	int64_t want_start_in;      /* with RR_NONE */
} recheck_rows[] = {
	{ .why = "no hold: start now", .want = RR_NONE, .want_start_in = 0 },
	{ .why = "a hold already over: start now", .hold_in_us = -2 * S, .want = RR_NONE,
	  .want_start_in = 0 },
	{ .why = "a hold within retry_after.max and the deadline: start at the hold",
	  .hold_in_us = 2 * S, .want = RR_NONE, .want_start_in = 2 * S },
	{ .why = "a hold exactly retry_after.max ahead: start at the hold", .hold_in_us = 10 * S,
	  .deadline_in_us = 20 * S, .want = RR_NONE, .want_start_in = 10 * S },
	{ .why = "a hold past retry_after.max: retry-after", .hold_in_us = 10 * S + 1,
	  .deadline_in_us = 20 * S, .want = RR_RETRY_AFTER },
	{ .why = "a hold past both: retry-after comes first", .hold_in_us = 12 * S,
	  .want = RR_RETRY_AFTER },
	{ .why = "a huge hold saturates into retry-after", .hold_in_us = INT64_MAX - NOW,
	  .want = RR_RETRY_AFTER },
	{ .why = "a hold exactly deadline less deadline.min: start at the hold",
	  .hold_in_us = 5 * S - 5 * MS, .want = RR_NONE, .want_start_in = 5 * S - 5 * MS },
	{ .why = "a hold past deadline less deadline.min: deadline", .hold_in_us = 5 * S - 4 * MS,
	  .want = RR_DEADLINE },
	{ .why = "no hold but less than deadline.min left: deadline", .deadline_in_us = 4 * MS,
	  .want = RR_DEADLINE },
};

static void test_recheck_hold_table(void **state)
{
	struct cfg_retry r = base_retry();
	int bad = 0;
	for (size_t i = 0; i < sizeof(recheck_rows) / sizeof(recheck_rows[0]); i++) {
		const struct recheck_row *t = &recheck_rows[i];
		int64_t start = -1;
		int64_t deadline = NOW + (t->deadline_in_us ? t->deadline_in_us : 5 * S);
		int64_t hold = t->hold_in_us ? NOW + t->hold_in_us : 0;
		enum refusal got = retry_recheck_hold(&r, &dcfg, NOW, deadline, hold, &start);
		if (got != t->want || (got == RR_NONE && start != NOW + t->want_start_in)) {
			print_error("%s: got \"%s\" start +%lld us\n", t->why, refusal_name(got),
			            (long long)(start - NOW));
			bad++;
		}
	}
	assert_int_equal(bad, 0);
}

/* The cap min(max, base * 2^(n-1)) that the jitter is drawn under and the --check report
 * sums. */
static void test_backoff_cap_table(void **state)
{
	static const struct {
		const char *why;
		int64_t base_us, max_us;
		int n;
		int64_t want;
	} t[] = {
		{ "n=1: base", 25 * MS, 250 * MS, 1, 25 * MS },
		{ "n=2: doubles", 25 * MS, 250 * MS, 2, 50 * MS },
		{ "n=3", 25 * MS, 250 * MS, 3, 100 * MS },
		{ "n=4", 25 * MS, 250 * MS, 4, 200 * MS },
		{ "n=5: max governs", 25 * MS, 250 * MS, 5, 250 * MS },
		{ "n=6", 25 * MS, 250 * MS, 6, 250 * MS },
		{ "n=7", 25 * MS, 250 * MS, 7, 250 * MS },
		{ "n=8", 25 * MS, 250 * MS, 8, 250 * MS },
		{ "n=9", 25 * MS, 250 * MS, 9, 250 * MS },
		{ "n=10", 25 * MS, 250 * MS, 10, 250 * MS },
		{ "n=0 counts as 1", 25 * MS, 250 * MS, 0, 25 * MS },
		{ "n=INT_MAX does not overflow", 25 * MS, 250 * MS, INT_MAX, 250 * MS },
		{ "base above max: max from n=1", 300 * MS, 250 * MS, 1, 250 * MS },
		{ "base above max: max at n=4", 300 * MS, 250 * MS, 4, 250 * MS },
		{ "base equal to max", 100 * MS, 100 * MS, 7, 100 * MS },
		{ "zero base: no backoff", 0, 250 * MS, 1, 0 },
		{ "zero base at n=10: no backoff", 0, 250 * MS, 10, 0 },
		{ "zero max: no backoff", 25 * MS, 0, 3, 0 },
		{ "2^62 under an INT64_MAX max", 1, INT64_MAX, 63, INT64_C(1) << 62 },
		{ "doubling past 2^62 saturates", 1, INT64_MAX, 64, INT64_MAX },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct cfg_retry r = base_retry();
		r.backoff_base_us = t[i].base_us;
		r.backoff_max_us = t[i].max_us;
		int64_t got = cfg_backoff_cap(&r, t[i].n);
		if (got != t[i].want)
			print_error("%s: got %lld\n", t[i].why, (long long)got);
		assert_int_equal(got, t[i].want);
		/* the jitter spans exactly [0, cap] */
		assert_int_equal(retry_backoff(&r, t[i].n, UINT64_MAX), t[i].want);
		assert_int_equal(retry_backoff(&r, t[i].n, 0), 0);
	}
}

static uint64_t xorshift(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ULL;
}

/* Backoff before retry n is uniform in [0, min(max, base * 2^(n-1))]: never above the cap,
 * and the draws cover the whole range (both ends and the middle). */
static void test_backoff_bounds(void **state)
{
	struct cfg_retry r = base_retry();
	uint64_t seed = 88172645463325252ULL;
	for (int n = 1; n <= 10; n++) {
		int64_t cap = 25 * MS << (n - 1);
		if (cap > 250 * MS)
			cap = 250 * MS;
		int64_t lo = INT64_MAX, hi = -1;
		double sum = 0;
		int low_tenth = 0, high_tenth = 0;
		const int draws = 100000;
		for (int i = 0; i < draws; i++) {
			int64_t b = retry_backoff(&r, n, xorshift(&seed));
			assert_true(b >= 0);
			assert_true(b <= cap);
			lo = b < lo ? b : lo;
			hi = b > hi ? b : hi;
			sum += (double)b;
			low_tenth += b < cap / 10;
			high_tenth += b > cap - cap / 10;
		}
		assert_true(lo < cap / 1000);
		assert_true(hi > cap - cap / 1000);
		double mean = sum / draws;
		assert_true(mean > 0.48 * (double)cap && mean < 0.52 * (double)cap);
		assert_true(low_tenth > draws / 12 && low_tenth < draws / 8);
		assert_true(high_tenth > draws / 12 && high_tenth < draws / 8);
		assert_int_equal(retry_backoff(&r, n, 0), 0);
		assert_int_equal(retry_backoff(&r, n, UINT64_MAX), cap);
	}
}

static void test_backoff_edges(void **state)
{
	struct cfg_retry r = base_retry();
	/* large n must not overflow base * 2^(n-1) */
	assert_int_equal(retry_backoff(&r, 64, UINT64_MAX), 250 * MS);
	assert_int_equal(retry_backoff(&r, INT_MAX, UINT64_MAX), 250 * MS);
	/* n below 1 is treated as retry 1 */
	assert_int_equal(retry_backoff(&r, 0, UINT64_MAX), 25 * MS);
	/* a max near INT64_MAX: doubling saturates instead of wrapping */
	r.backoff_base_us = 1;
	r.backoff_max_us = INT64_MAX;
	assert_int_equal(retry_backoff(&r, 1000, UINT64_MAX), INT64_MAX);
	assert_true(retry_backoff(&r, 1000, UINT64_MAX / 2) > 0);
	assert_int_equal(retry_backoff(&r, 3, UINT64_MAX), 4);
	/* zero base: no backoff */
	r.backoff_base_us = 0;
	assert_int_equal(retry_backoff(&r, 5, UINT64_MAX), 0);
	/* equal base and max: the cap from retry 1 on */
	r.backoff_base_us = r.backoff_max_us = 100 * MS;
	assert_int_equal(retry_backoff(&r, 1, UINT64_MAX), 100 * MS);
	assert_int_equal(retry_backoff(&r, 7, UINT64_MAX), 100 * MS);
}

static void test_method_class(void **state)
{
	static const struct { const char *m; enum method_class want; } t[] = {
		{ "GET", MC_IDEMPOTENT }, { "HEAD", MC_IDEMPOTENT }, { "OPTIONS", MC_IDEMPOTENT },
		{ "TRACE", MC_IDEMPOTENT }, { "PUT", MC_IDEMPOTENT }, { "DELETE", MC_IDEMPOTENT },
		{ "POST", MC_OTHER }, { "PATCH", MC_OTHER }, { "CONNECT", MC_OTHER },
		{ "PROPFIND", MC_OTHER },
		/* methods are case-sensitive: "get" is not GET */
		{ "get", MC_OTHER }, { "Get", MC_OTHER }, { "GETX", MC_OTHER }, { "GE", MC_OTHER },
		{ "", MC_OTHER }, { NULL, MC_OTHER },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		if (retry_method_class(t[i].m) != t[i].want)
			print_error("method \"%s\"\n", t[i].m ? t[i].m : "(null)");
		assert_int_equal(retry_method_class(t[i].m), t[i].want);
	}
}

/* The SPEC §4 reason strings, exactly. */
static void test_names(void **state)
{
	assert_string_equal(refusal_name(RR_NONE), "");
	assert_string_equal(refusal_name(RR_NOT_LISTED), "");
	assert_string_equal(refusal_name(RR_DISABLED), "disabled");
	assert_string_equal(refusal_name(RR_NESTED), "nested");
	assert_string_equal(refusal_name(RR_MAX_ATTEMPTS), "max-attempts");
	assert_string_equal(refusal_name(RR_NON_IDEMPOTENT), "non-idempotent");
	assert_string_equal(refusal_name(RR_BODY_TOO_LARGE), "body-too-large");
	assert_string_equal(refusal_name(RR_RETRY_AFTER), "retry-after");
	assert_string_equal(refusal_name(RR_DEADLINE), "deadline");
	assert_string_equal(refusal_name(RR_BUDGET), "budget");
	assert_string_equal(refusal_name(RR_RETRIES_IN_FLIGHT), "retries-in-flight");
	assert_string_equal(refusal_name(RR_NREASONS), "");
	assert_string_equal(refusal_name((enum refusal)-1), "");

	assert_string_equal(outcome_name(OUT_CONNECT_FAILURE), "connect-failure");
	assert_string_equal(outcome_name(OUT_RESET), "reset");
	assert_string_equal(outcome_name(OUT_TIMEOUT), "timeout");
	assert_string_equal(outcome_name(OUT_STATUS), "status");
	assert_string_equal(outcome_name(OUT_NONE), "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decide_table),
		cmocka_unit_test(test_roomy_gates_change_nothing),
		cmocka_unit_test(test_table_covers_every_reason),
		cmocka_unit_test(test_gate_taken),
		cmocka_unit_test(test_grpc_outcome_judged_like_status),
		cmocka_unit_test(test_pushback_refuse_property),
		cmocka_unit_test(test_may_replay_table),
		cmocka_unit_test(test_may_replay_agrees_with_decide),
		cmocka_unit_test(test_recheck_hold_table),
		cmocka_unit_test(test_backoff_cap_table),
		cmocka_unit_test(test_backoff_bounds),
		cmocka_unit_test(test_backoff_edges),
		cmocka_unit_test(test_method_class),
		cmocka_unit_test(test_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
