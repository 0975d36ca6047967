/*
 * fuzz_deadline: libFuzzer target for the deadline and Retry-After parsers (SPEC §3, §4).
 *
 * Input: byte 0 picks the conflict flags for deadline_resolve(), bytes 1-8 are a time value
 * (a wall clock "now" for Retry-After and a budget to format), the rest is a header value;
 * split on '\n' it also gives the five deadline headers. Invariants checked, beyond ASan and
 * UBSan being quiet:
 *  - a parsed deadline or Retry-After delay is never negative;
 *  - formatting a time and parsing it back never gives more time than was formatted, and is
 *    stable: format(parse(format(x))) == format(x);
 *  - a resolved budget lies in [0, deadline.max].
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "policy/deadline.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Format US as kind K, parse it back, and check the round trip. */
static void check_round_trip(enum dl_kind k, int64_t us)
{
	char buf[DEADLINE_FMT_MAX], again[DEADLINE_FMT_MAX];
	int n = deadline_format(k, us, buf, sizeof(buf));
	if (n <= 0 || (size_t)n != strlen(buf))
		abort();
	int64_t back = -1;
	int rc = deadline_parse(k, buf, (size_t)n, &back);
	if (rc == DL_NONE) {
		/* only an Envoy kind says "0", and only for less than 1 ms */
		if (k != DL_ENVOY_UPSTREAM_RQ && k != DL_ENVOY_EXPECTED_RQ)
			abort();
		if (us >= 1000)
			abort();
		return;
	}
	if (rc != DL_OK || back < 0 || back > (us < 0 ? 0 : us))
		abort();
	int m = deadline_format(k, back, again, sizeof(again));
	if (m != n || memcmp(buf, again, (size_t)n) != 0)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 9)
		return 0;
	uint8_t flags = data[0];
	int64_t t;
	memcpy(&t, data + 1, sizeof(t));
	const char *v = (const char *)data + 9;
	size_t len = size - 9;

	/* every kind on the raw value */
	for (int k = 0; k < DL_NKINDS; k++) {
		int64_t us = -1;
		int rc = deadline_parse((enum dl_kind)k, v, len, &us);
		if (rc == DL_OK) {
			if (us < 0)
				abort();
			check_round_trip((enum dl_kind)k, us);
		} else if (rc != DL_BAD && rc != DL_NONE) {
			abort();
		}
		check_round_trip((enum dl_kind)k, t);
	}

	/* the five headers at once: '\n'-separated fields, absent when empty */
	struct dl_value vals[DL_NKINDS];
	memset(vals, 0, sizeof(vals));
	const char *p = v, *end = v + len;
	for (int k = 0; k < DL_NKINDS && p <= end; k++) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *e = nl ? nl : end;
		if (e > p) {
			vals[k].v = p;
			vals[k].len = (size_t)(e - p);
			vals[k].present = 1;
			vals[k].conflict = (flags >> k) & 1;
		}
		if (!nl)
			break;
		p = nl + 1;
	}
	const struct cfg_deadline cfg = { .default_us = 5000000, .max_us = 30000000, .min_us = 5000 };
	int64_t budget = -1;
	int kind = -2;
	int rc = deadline_resolve(vals, &cfg, &budget, &kind);
	if (rc == DL_OK) {
		if (budget < 0 || budget > cfg.max_us || kind < -1 || kind >= DL_NKINDS)
			abort();
		if (kind >= 0 && !vals[kind].present)
			abort();
	} else if (rc != DL_BAD) {
		abort();
	}

	/* Retry-After, against the input's clock and a fixed one */
	const time_t nows[2] = { (time_t)t, (time_t)1767225600 };
	for (int i = 0; i < 2; i++) {
		int64_t delay = -1;
		int r = retry_after_parse(v, len, nows[i], &delay);
		if (r == 0 && delay < 0)
			abort();
		if (r != 0 && r != -1)
			abort();
	}
	return 0;
}
