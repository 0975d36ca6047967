/*
 * grpc: the pure facts of SPEC §10 (see grpc.h). Every parser here reads a header value as
 * it arrived: HTTP/2 field values carry no surrounding whitespace (nghttp2 refuses them), so a
 * space is simply not a digit, and "almost a number" is malformed rather than guessed at.
 */
#include "http/grpc.h"

#include <string.h>

#include "http/h1_parser.h"
#include "http/h1_write.h"
#include "base/util.h"

/* SPEC §10's names, indexed by code; also the metric's status label, so a rename here is a
 * contract change. */
static const char *const code_names[GRPC_NCODES] = {
	[GRPC_OK]                  = "ok",
	[GRPC_CANCELLED]           = "cancelled",
	[GRPC_UNKNOWN]             = "unknown",
	[GRPC_INVALID_ARGUMENT]    = "invalid-argument",
	[GRPC_DEADLINE_EXCEEDED]   = "deadline-exceeded",
	[GRPC_NOT_FOUND]           = "not-found",
	[GRPC_ALREADY_EXISTS]      = "already-exists",
	[GRPC_PERMISSION_DENIED]   = "permission-denied",
	[GRPC_RESOURCE_EXHAUSTED]  = "resource-exhausted",
	[GRPC_FAILED_PRECONDITION] = "failed-precondition",
	[GRPC_ABORTED]             = "aborted",
	[GRPC_OUT_OF_RANGE]        = "out-of-range",
	[GRPC_UNIMPLEMENTED]       = "unimplemented",
	[GRPC_INTERNAL]            = "internal",
	[GRPC_UNAVAILABLE]         = "unavailable",
	[GRPC_DATA_LOSS]           = "data-loss",
	[GRPC_UNAUTHENTICATED]     = "unauthenticated",
};

bool grpc_content_type(const char *v, size_t n)
{
	static const char base[] = "application/grpc";
	const size_t blen = sizeof(base) - 1;

	/* asked of every HTTP/2 request, twice: the lowercase spelling every gRPC library sends is
	 * one memcmp, any other case the general compare */
	if (!v || n < blen || (memcmp(v, base, blen) != 0 && !str_ieq(v, blen, base, blen)))
		return false;
	/* application/grpc-web and application/grpcx are other protocols: only the bare type,
	 * a +codec suffix or parameters make it gRPC */
	return n == blen || v[blen] == '+' || v[blen] == ';';
}

int grpc_status_parse(const char *v, size_t n)
{
	if (!v || n == 0 || n > 3)
		return -1;
	int code = 0;
	for (size_t i = 0; i < n; i++) {
		if (v[i] < '0' || v[i] > '9')
			return -1;
		code = code * 10 + (v[i] - '0');
	}
	/* gRPC clients map a code they do not know to UNKNOWN; so do we, so that retry.on and
	 * the metric see what the client will see */
	return code < GRPC_NCODES ? code : GRPC_UNKNOWN;
}

const char *grpc_status_name(int code)
{
	if (code < 0 || code >= GRPC_NCODES)
		return code_names[GRPC_UNKNOWN];
	return code_names[code];
}

int grpc_status_by_name(const char *name, size_t n)
{
	if (!name)
		return -1;
	for (int c = 0; c < GRPC_NCODES; c++)
		if (strlen(code_names[c]) == n && memcmp(code_names[c], name, n) == 0)
			return c;
	return -1;
}

size_t grpc_timeout_format(int64_t us, char out[16])
{
	static const struct { char unit; int64_t us; } units[] = {
		{ 'm', 1000 }, { 'S', 1000000 }, { 'M', 60 * 1000000LL }, { 'H', 3600 * 1000000LL },
	};
	const int64_t max8 = 99999999;

	if (us < 0)
		us = 0;
	int64_t x;
	char unit;
	if (us > 0 && us < 1000) {
		/* below one millisecond "0m" would tell the server the call has already expired
		 * while we still wait for it: say the microseconds instead */
		x = us;
		unit = 'u';
	} else {
		size_t i = 0;
		while (us / units[i].us > max8 && i + 1 < sizeof(units) / sizeof(units[0]))
			i++;
		x = us / units[i].us;
		if (x > max8)
			x = max8;   /* beyond 99999999H (11,000 years): the most gRPC can say */
		unit = units[i].unit;
	}
	/* every attempt of a call writes one, so no printf: at most 8 digits, the unit, a NUL */
	size_t n = h1_fmt_int(out, x);
	out[n++] = unit;
	out[n] = '\0';
	return n;
}

bool grpc_pushback_parse(const char *v, size_t n, int64_t *us)
{
	const int64_t cap_ms = INT64_MAX / 2 / 1000;

	if (!v || n == 0)
		return false;
	int64_t ms = 0;
	for (size_t i = 0; i < n; i++) {
		if (v[i] < '0' || v[i] > '9')
			return false;   /* a sign, a fraction, a space: "do not retry" */
		/* keep scanning after saturating: a later non-digit still makes it malformed */
		if (ms <= cap_ms)
			ms = ms * 10 + (v[i] - '0');
	}
	*us = ms > cap_ms ? INT64_MAX / 2 : ms * 1000;
	return true;
}

int grpc_status_for_reason(const char *reason, int *pushback_ms)
{
	static const struct { const char *reason; int code; } table[] = {
		{ "bad-deadline", GRPC_INVALID_ARGUMENT },
		{ "idempotency-key-required", GRPC_INVALID_ARGUMENT },
		{ "deadline-exceeded", GRPC_DEADLINE_EXCEEDED },
		{ "body-too-large", GRPC_RESOURCE_EXHAUSTED },
		{ "headers-too-large", GRPC_RESOURCE_EXHAUSTED },
		{ "uri-too-long", GRPC_RESOURCE_EXHAUSTED },
		{ "idempotency-key-mismatch", GRPC_FAILED_PRECONDITION },
		{ "idempotency-in-progress", GRPC_ABORTED },
		{ "no-route", GRPC_UNIMPLEMENTED },
		{ "not-implemented", GRPC_UNIMPLEMENTED },
		{ "connect-failure", GRPC_UNAVAILABLE },
		{ "reset", GRPC_UNAVAILABLE },
		{ "bad-response", GRPC_UNAVAILABLE },
		{ "timeout", GRPC_UNAVAILABLE },
		{ "idempotency-store-unavailable", GRPC_UNAVAILABLE },
		{ "overloaded", GRPC_UNAVAILABLE },
	};

	*pushback_ms = -1;
	if (!reason)
		return GRPC_UNAVAILABLE;
	if (strcmp(reason, "overloaded") == 0)
		*pushback_ms = 1000;    /* as the HTTP form's Retry-After: 1 */
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (strcmp(table[i].reason, reason) == 0)
			return table[i].code;
	/* a reason the table does not list is something went wrong on the way: the caller may
	 * try again, which is what UNAVAILABLE tells a gRPC client */
	return GRPC_UNAVAILABLE;
}

bool grpc_definite(int code)
{
	switch (code) {
	case GRPC_OK:
	case GRPC_INVALID_ARGUMENT:
	case GRPC_NOT_FOUND:
	case GRPC_ALREADY_EXISTS:
	case GRPC_PERMISSION_DENIED:
	case GRPC_FAILED_PRECONDITION:
	case GRPC_OUT_OF_RANGE:
	case GRPC_UNIMPLEMENTED:
	case GRPC_UNAUTHENTICATED:
		return true;
	default:
		return false;
	}
}

int grpc_client_code(int code, int http_status, bool complete)
{
	if (code >= 0)
		return code < GRPC_NCODES ? code : GRPC_UNKNOWN;
	if (!complete)
		return GRPC_INTERNAL;   /* RST_STREAM INTERNAL_ERROR, as a client maps it */
	switch (http_status) {
	case 400: return GRPC_INTERNAL;
	case 401: return GRPC_UNAUTHENTICATED;
	case 403: return GRPC_PERMISSION_DENIED;
	case 404: return GRPC_UNIMPLEMENTED;
	case 429:
	case 502:
	case 503:
	case 504: return GRPC_UNAVAILABLE;
	default: return GRPC_UNKNOWN;
	}
}

enum grpc_field grpc_field_kind(const char *name, size_t n)
{
	/* by length: every other field of a response is told apart without a compare */
	if (n == 11 && str_ieq(name, n, "grpc-status", 11))
		return GRPC_F_STATUS;
	if (n == 22 && str_ieq(name, n, "grpc-retry-pushback-ms", 22))
		return GRPC_F_PUSHBACK;
	return GRPC_F_OTHER;
}

int grpc_status_field(const struct http_hdr *f, int n)
{
	for (int i = 0; i < n; i++)
		if (grpc_field_kind(f[i].name, f[i].nlen) == GRPC_F_STATUS)
			return grpc_status_parse(f[i].value, f[i].vlen);
	return -1;
}
