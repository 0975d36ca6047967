/*
 * grpc: the pure facts of SPEC §10, no I/O and no state: which request is gRPC, the status
 * codes and their names, grpc-timeout and grpc-retry-pushback-ms in their wire formats, the
 * grpc-status retrygate answers for each §5 reason, and which codes are definite answers for
 * idempotency enforcement (§6). The exchange, the policy (config, retry, admit, forward,
 * respond) and the idempotency job all ask here, so no file spells a code twice.
 */
#ifndef RG_GRPC_H
#define RG_GRPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GRPC_NCODES 17          /* OK (0) .. UNAUTHENTICATED (16) */

enum grpc_code {
	GRPC_OK = 0,
	GRPC_CANCELLED = 1,
	GRPC_UNKNOWN = 2,
	GRPC_INVALID_ARGUMENT = 3,
	GRPC_DEADLINE_EXCEEDED = 4,
	GRPC_NOT_FOUND = 5,
	GRPC_ALREADY_EXISTS = 6,
	GRPC_PERMISSION_DENIED = 7,
	GRPC_RESOURCE_EXHAUSTED = 8,
	GRPC_FAILED_PRECONDITION = 9,
	GRPC_ABORTED = 10,
	GRPC_OUT_OF_RANGE = 11,
	GRPC_UNIMPLEMENTED = 12,
	GRPC_INTERNAL = 13,
	GRPC_UNAVAILABLE = 14,
	GRPC_DATA_LOSS = 15,
	GRPC_UNAUTHENTICATED = 16,
};

/* A content-type that makes an HTTP/2 request gRPC: application/grpc, or starting with
 * application/grpc+ or application/grpc; (case-insensitive). */
bool grpc_content_type(const char *v, size_t n);

/* grpc-status: 1-3 ASCII digits. Returns 0..16; a well-formed code above 16 is UNKNOWN (2)
 * as gRPC clients read it; -1 when malformed (empty, not digits). */
int grpc_status_parse(const char *v, size_t n);

/* "ok", "cancelled", "unknown", "invalid-argument", ..., "unauthenticated" (SPEC §10's names,
 * also the metric's status label); "unknown" for a code outside 0..16. */
const char *grpc_status_name(int code);

/* The code named NAME (N bytes), or -1. "ok" is a name like the others. */
int grpc_status_by_name(const char *name, size_t n);

/* grpc-timeout for US microseconds (a negative one counts as 0): at most 8 digits and a unit;
 * milliseconds ("950m") when it fits, else seconds, minutes, hours (rounded down, capped at
 * "99999999H"); 0 is "0m". Between 1 and 999 µs it is microseconds ("999u"): "0m" would tell
 * the server the call has already expired. Writes a NUL-terminated string, returns its
 * length. */
size_t grpc_timeout_format(int64_t us, char out[16]);

/* grpc-retry-pushback-ms: a non-negative decimal integer of milliseconds gives true with *US
 * set (saturating at INT64_MAX/2); anything else (negative, empty, malformed) gives false:
 * "do not retry" (SPEC §10). */
bool grpc_pushback_parse(const char *v, size_t n, int64_t *us);

/* The grpc-status of a response retrygate makes with §5 reason REASON (SPEC §10's table);
 * *PUSHBACK_MS is set to the grpc-retry-pushback-ms to send (1000 for overloaded) or -1 for
 * none. An unlisted reason is UNAVAILABLE. */
int grpc_status_for_reason(const char *reason, int *pushback_ms);

/* A definite answer for idempotency enforcement (SPEC §10): OK, INVALID_ARGUMENT, NOT_FOUND,
 * ALREADY_EXISTS, PERMISSION_DENIED, FAILED_PRECONDITION, OUT_OF_RANGE, UNIMPLEMENTED,
 * UNAUTHENTICATED. Any other code leaves the outcome unknown, as a 5xx does. */
bool grpc_definite(int code);

/* What a gRPC client reads as the call's status (SPEC §10's downstream count): CODE when a
 * grpc-status reached it (>= 0). Without one: a stream that did not end normally (COMPLETE
 * false: retrygate resets it with INTERNAL_ERROR) is INTERNAL, as gRPC maps that RST_STREAM;
 * a response that ended without grpc-status is read from HTTP_STATUS by gRPC's HTTP mapping
 * (400 INTERNAL, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 UNIMPLEMENTED, 429 502 503
 * 504 UNAVAILABLE, anything else, 200 included, UNKNOWN). */
int grpc_client_code(int code, int http_status, bool complete);

/* Which of the response fields retrygate reads a name (N bytes, any case) is. */
enum grpc_field { GRPC_F_OTHER, GRPC_F_STATUS, GRPC_F_PUSHBACK };
enum grpc_field grpc_field_kind(const char *name, size_t n);

struct http_hdr;
/* The grpc-status among fields F[N] (grpc_status_parse), or -1 when none is well-formed. */
int grpc_status_field(const struct http_hdr *f, int n);

#endif
