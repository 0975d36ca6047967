/*
 * deadline: the deadline headers of SPEC §3 — parse, format, and pick the inbound one.
 * Pure: no clock, no I/O. All times are microseconds.
 */
#ifndef RG_DEADLINE_H
#define RG_DEADLINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "config/config.h"

/* In the order SPEC §3 reads them: the first present one wins. */
enum dl_kind {
	DL_X_TIMEOUT_MS,            /* X-Timeout-Ms: integer ms */
	DL_GRPC_TIMEOUT,            /* grpc-timeout: 1-8 digits + H M S m u n */
	DL_CONNECT_TIMEOUT_MS,      /* connect-timeout-ms: integer ms */
	DL_ENVOY_UPSTREAM_RQ,       /* x-envoy-upstream-rq-timeout-ms: ms, 0 = no timeout */
	DL_ENVOY_EXPECTED_RQ,       /* x-envoy-expected-rq-timeout-ms: ms, 0 = no timeout */
	DL_NKINDS
};

extern const char *const deadline_header_name[DL_NKINDS];
extern const size_t deadline_header_len[DL_NKINDS];   /* strlen of each name */

/* One header's value as received. present=0: absent. conflict=1: the header appeared more
 * than once with different values (malformed). */
struct dl_value {
	const char *v;
	size_t len;
	int present;
	int conflict;
};

#define DL_OK       0
#define DL_NONE     1   /* an Envoy header saying 0 = "no timeout": treat as absent */
#define DL_BAD     -1

struct http_hdr;

/* The deadline header NAME names, or -1. */
int deadline_header_kind(const char *name, size_t nlen);

/* Collect the deadline headers of a request: VALS gets the first value of each kind (a repeat
 * with a different value marks it conflicting), PRESENT which kinds appeared at all. */
void deadline_collect(const struct http_hdr *hdrs, int nhdrs, struct dl_value vals[DL_NKINDS],
                      bool present[DL_NKINDS]);

/* Parse one value of kind K (optional surrounding spaces/tabs allowed, nothing else).
 * Integer ms kinds: digits only (saturating); a sign is malformed. */
int deadline_parse(enum dl_kind k, const char *v, size_t len, int64_t *us);

/* Pick the inbound deadline budget from the five values: first present wins (an Envoy 0
 * passes to the next), absent -> cfg->default_us, above cfg->max_us -> clamped.
 * Returns DL_OK with *budget_us (0 means already expired) and *kind (the kind used, or -1
 * when the default applied), or DL_BAD when the first present one is malformed. */
int deadline_resolve(const struct dl_value vals[DL_NKINDS], const struct cfg_deadline *cfg,
                     int64_t *budget_us, int *kind);

/* Format US (>= 0) in K's own format into BUF (NUL-terminated); returns the length.
 * ms kinds: floor(us / 1000). grpc-timeout: the finest unit whose value fits 8 digits,
 * truncated (never rounds up). */
int deadline_format(enum dl_kind k, int64_t us, char *buf, size_t cap);
/* A BUF of this size always fits (19 digits of ms + NUL); a smaller one that does not fit
 * makes deadline_format() return -1 with BUF empty: a truncated number must not be sent. */
#define DEADLINE_FMT_MAX 24

/* Retry-After (RFC 9110 §10.2.3): delta-seconds or an HTTP-date (IMF-fixdate, and the obsolete
 * RFC 850 and asctime forms). NOW is wall-clock seconds. Returns 0 and *delay_us (a past date
 * gives 0), or -1 if malformed. */
int retry_after_parse(const char *v, size_t len, time_t now, int64_t *delay_us);

#endif
