/*
 * deadline: the deadline headers of SPEC §3 and the Retry-After header of SPEC §4.
 *
 * Pure: no clock (the caller passes "now" where wall time matters), no I/O, no allocation.
 * Only syntax errors are malformed: a syntactically valid but huge value saturates (to
 * INT64_MAX µs at most) and is clamped to deadline.max by deadline_resolve(). Formatting
 * never rounds up, so a next hop is never promised more time than this hop has.
 */
#include "policy/deadline.h"
#include "http/grpc.h"
#include "http/h1_write.h"
#include "http/h1_parser.h"
#include "base/util.h"

#include <stdbool.h>
#include <string.h>

#define US_PER_MS  1000LL
#define US_PER_S   1000000LL

#define DL_NAMES(X)                                                   \
	X(DL_X_TIMEOUT_MS, "X-Timeout-Ms")                              \
	X(DL_GRPC_TIMEOUT, "grpc-timeout")                              \
	X(DL_CONNECT_TIMEOUT_MS, "connect-timeout-ms")                  \
	X(DL_ENVOY_UPSTREAM_RQ, "x-envoy-upstream-rq-timeout-ms")       \
	X(DL_ENVOY_EXPECTED_RQ, "x-envoy-expected-rq-timeout-ms")
#define DL_NAME(k, s) [k] = s,
#define DL_LEN(k, s) [k] = sizeof(s) - 1,
const char *const deadline_header_name[DL_NKINDS] = { DL_NAMES(DL_NAME) };
const size_t deadline_header_len[DL_NKINDS] = { DL_NAMES(DL_LEN) };

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* Strip optional whitespace (RFC 9110 OWS: SP / HTAB) from both ends of [*v, *v + *len). */
static void trim_ows(const char **v, size_t *len)
{
	const char *p = *v;
	size_t n = *len;
	while (n > 0 && (p[0] == ' ' || p[0] == '\t')) {
		p++;
		n--;
	}
	while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
		n--;
	*v = p;
	*len = n;
}

/* One or more ASCII digits and nothing else, as a non-negative integer saturated at LIMIT
 * (so "99999999999999999999999" is LIMIT, not an overflow). 0 or -1 if not all digits. */
static int parse_digits_sat(const char *v, size_t len, int64_t limit, int64_t *out)
{
	if (len == 0)
		return -1;
	int64_t x = 0;
	for (size_t i = 0; i < len; i++) {
		if (!is_digit(v[i]))
			return -1;
		int d = v[i] - '0';
		if (x > (limit - d) / 10)
			x = limit;          /* keep scanning: a later non-digit still makes it malformed */
		else
			x = x * 10 + d;
	}
	*out = x;
	return 0;
}

/* grpc-timeout (gRPC over HTTP/2 spec): TimeoutValue TimeoutUnit, the value 1 to 8 ASCII
 * digits (leading zeros count), the unit one of H M S m u n. 99999999H is 3.6e17 µs, so no
 * value can overflow. Nanoseconds round UP to whole microseconds: "1n" is a (tiny) non-zero
 * budget, not "already expired"; only a zero value means expired. */
static int parse_grpc(const char *v, size_t len, int64_t *us)
{
	if (len < 2 || len > 9)
		return DL_BAD;
	int64_t x;
	if (parse_digits_sat(v, len - 1, INT64_MAX, &x) < 0)
		return DL_BAD;
	switch (v[len - 1]) {
	case 'H': *us = x * 3600 * US_PER_S; break;
	case 'M': *us = x * 60 * US_PER_S; break;
	case 'S': *us = x * US_PER_S; break;
	case 'm': *us = x * US_PER_MS; break;
	case 'u': *us = x; break;
	case 'n': *us = (x + 999) / 1000; break;
	default: return DL_BAD;
	}
	return DL_OK;
}

int deadline_parse(enum dl_kind k, const char *v, size_t len, int64_t *us)
{
	if (!v || (unsigned)k >= DL_NKINDS)
		return DL_BAD;
	trim_ows(&v, &len);
	if (k == DL_GRPC_TIMEOUT)
		return parse_grpc(v, len, us);

	/* the integer-milliseconds kinds: digits only, no sign */
	int64_t ms;
	if (parse_digits_sat(v, len, INT64_MAX / US_PER_MS, &ms) < 0)
		return DL_BAD;
	if (ms == 0 && (k == DL_ENVOY_UPSTREAM_RQ || k == DL_ENVOY_EXPECTED_RQ))
		return DL_NONE;     /* Envoy reads 0 as "no timeout" */
	*us = ms * US_PER_MS;
	return DL_OK;
}

int deadline_resolve(const struct dl_value vals[DL_NKINDS], const struct cfg_deadline *cfg,
                     int64_t *budget_us, int *kind)
{
	for (int k = 0; k < DL_NKINDS; k++) {
		const struct dl_value *dv = &vals[k];
		if (!dv->present)
			continue;
		/* this is the first present one (an Envoy 0 before it counted as absent): only
		 * it is looked at, and a repeat with a different value makes it malformed */
		if (dv->conflict)
			return DL_BAD;
		int64_t us;
		int rc = deadline_parse((enum dl_kind)k, dv->v, dv->len, &us);
		if (rc == DL_BAD)
			return DL_BAD;
		if (rc == DL_NONE)
			continue;
		*budget_us = us < cfg->max_us ? us : cfg->max_us;
		*kind = k;
		return DL_OK;
	}
	*budget_us = cfg->default_us < cfg->max_us ? cfg->default_us : cfg->max_us;
	*kind = -1;
	return DL_OK;
}

/* Returns -1 (and an empty string if CAP allows) when the text does not fit: a truncated
 * number would be a wrong deadline, so the caller must not send it. */
int deadline_format(enum dl_kind k, int64_t us, char *buf, size_t cap)
{
	int n;

	if (us < 0)
		us = 0;
	if ((unsigned)k >= DL_NKINDS) {
		n = -1;
	} else if (k != DL_GRPC_TIMEOUT) {
		/* every attempt writes one, so no printf (h1_write.h's digits) */
		char d[24];
		size_t dn = h1_fmt_int(d, us / US_PER_MS);
		n = dn < cap ? (int)dn : -1;
		if (n > 0) {
			memcpy(buf, d, dn);
			buf[dn] = '\0';
		}
	} else {
		/* one gRPC format everywhere (grpc.c): whole milliseconds, so it says the same time
		 * as X-Timeout-Ms beside it */
		char g[16];
		size_t gn = grpc_timeout_format(us, g);
		n = gn < cap ? (int)gn : -1;
		if (n > 0)
			memcpy(buf, g, gn + 1);
	}
	if (n < 0 || (size_t)n >= cap) {
		if (cap > 0)
			buf[0] = '\0';
		return -1;
	}
	return n;
}

/* ---- Retry-After: HTTP-date (RFC 9110 §5.6.7) ---- */

static const char *const day_short[7] = { "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun" };
static const char *const day_long[7] = {
	"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday",
};
static const char *const month_name[12] = {
	"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
};

/* A cursor over the value: every match_* advances it on success only. HTTP-date is
 * case-sensitive (RFC 9110 §5.6.7), so names are compared exactly. */
struct cur {
	const char *p;
	const char *end;
};

static bool match_lit(struct cur *c, const char *s)
{
	size_t n = strlen(s);
	if ((size_t)(c->end - c->p) < n || memcmp(c->p, s, n) != 0)
		return false;
	c->p += n;
	return true;
}

/* exactly N digits */
static bool match_num(struct cur *c, int n, int *out)
{
	if (c->end - c->p < n)
		return false;
	int x = 0;
	for (int i = 0; i < n; i++) {
		if (!is_digit(c->p[i]))
			return false;
		x = x * 10 + (c->p[i] - '0');
	}
	c->p += n;
	*out = x;
	return true;
}

static bool match_name(struct cur *c, const char *const *names, int count, int *idx)
{
	for (int i = 0; i < count; i++)
		if (match_lit(c, names[i])) {
			*idx = i;
			return true;
		}
	return false;
}

/* time-of-day = hour ":" minute ":" second; second 60 is a leap second */
static bool match_time(struct cur *c, int *h, int *mi, int *s)
{
	return match_num(c, 2, h) && match_lit(c, ":") && match_num(c, 2, mi) && match_lit(c, ":") &&
	       match_num(c, 2, s) && *h <= 23 && *mi <= 59 && *s <= 60;
}

static bool is_leap(int64_t y)
{
	return y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
}

static int days_in_month(int64_t y, int m)
{
	static const int dim[12] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
	return m == 2 && is_leap(y) ? 29 : dim[m - 1];
}

/* Days from 1970-01-01 to Y-M-D in the proleptic Gregorian calendar (H. Hinnant's
 * days_from_civil), so no dependency on the process's time zone. */
static int64_t days_from_civil(int64_t y, int m, int d)
{
	y -= m <= 2;
	int64_t era = (y >= 0 ? y : y - 399) / 400;
	int64_t yoe = y - era * 400;
	int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - 719468;
}

/* RFC 850's two-digit year: the year with those last two digits nearest to NOW_YEAR,
 * except that one more than 50 years ahead is taken as the one a century before
 * (RFC 9110 §5.6.7). */
static int64_t expand_year2(int yy, int64_t now_year)
{
	int64_t y = now_year - now_year % 100 + yy;
	if (y > now_year + 50)
		y -= 100;
	else if (y + 100 <= now_year + 50)
		y += 100;
	return y;
}

static int64_t year_of(time_t t)
{
	/* inverse of days_from_civil, year only */
	int64_t z = (int64_t)t / 86400;
	if ((int64_t)t % 86400 < 0)
		z--;
	z += 719468;
	int64_t era = (z >= 0 ? z : z - 146096) / 146097;
	int64_t doe = z - era * 146097;
	int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	int64_t mp = (5 * doy + 2) / 153;
	return yoe + era * 400 + (mp >= 10);
}

/* Parse the three HTTP-date forms into seconds since the epoch. 0, or -1 if malformed.
 *   IMF-fixdate  "Sun, 06 Nov 1994 08:49:37 GMT"
 *   rfc850-date  "Sunday, 06-Nov-94 08:49:37 GMT"
 *   asctime-date "Sun Nov  6 08:49:37 1994"
 * The day name must be a valid one but is not checked against the date: it is redundant,
 * and RFC 9110 gives the date itself the authority. */
static int parse_http_date(const char *v, size_t len, time_t now, int64_t *secs)
{
	struct cur c = { v, v + len };
	int wd, mon, day, h, mi, s;
	int64_t year;

	if (len >= 4 && v[3] == ',') {
		int y4;
		if (!(match_name(&c, day_short, 7, &wd) && match_lit(&c, ", ") &&
		      match_num(&c, 2, &day) && match_lit(&c, " ") &&
		      match_name(&c, month_name, 12, &mon) && match_lit(&c, " ") &&
		      match_num(&c, 4, &y4) && match_lit(&c, " ") && match_time(&c, &h, &mi, &s) &&
		      match_lit(&c, " GMT")))
			return -1;
		year = y4;
	} else if (len >= 4 && v[3] == ' ') {
		int y4;
		if (!(match_name(&c, day_short, 7, &wd) && match_lit(&c, " ") &&
		      match_name(&c, month_name, 12, &mon) && match_lit(&c, " ")))
			return -1;
		/* day = 2DIGIT / ( SP DIGIT ) */
		if (!(match_num(&c, 2, &day) || (match_lit(&c, " ") && match_num(&c, 1, &day))))
			return -1;
		if (!(match_lit(&c, " ") && match_time(&c, &h, &mi, &s) && match_lit(&c, " ") &&
		      match_num(&c, 4, &y4)))
			return -1;
		year = y4;
	} else {
		int y2;
		if (!(match_name(&c, day_long, 7, &wd) && match_lit(&c, ", ") &&
		      match_num(&c, 2, &day) && match_lit(&c, "-") &&
		      match_name(&c, month_name, 12, &mon) && match_lit(&c, "-") &&
		      match_num(&c, 2, &y2) && match_lit(&c, " ") && match_time(&c, &h, &mi, &s) &&
		      match_lit(&c, " GMT")))
			return -1;
		/* a clock outside years 0-9999 is not a real "now"; keep the arithmetic
		 * in range rather than trust it */
		int64_t now_year = year_of(now);
		now_year = now_year < 0 ? 0 : now_year > 9999 ? 9999 : now_year;
		year = expand_year2(y2, now_year);
	}
	if (c.p != c.end)
		return -1;
	mon += 1;
	if (day < 1 || day > days_in_month(year, mon))
		return -1;
	*secs = days_from_civil(year, mon, day) * 86400 + h * 3600 + mi * 60 + s;
	return 0;
}

int retry_after_parse(const char *v, size_t len, time_t now, int64_t *delay_us)
{
	if (!v)
		return -1;
	trim_ows(&v, &len);
	if (len == 0)
		return -1;

	if (is_digit(v[0])) {
		/* delta-seconds = 1*DIGIT; a huge value saturates (it is refused by
		 * retry_after.max anyway) */
		int64_t s;
		if (parse_digits_sat(v, len, INT64_MAX / US_PER_S, &s) < 0)
			return -1;
		*delay_us = s * US_PER_S;
		return 0;
	}

	int64_t when;
	if (parse_http_date(v, len, now, &when) < 0)
		return -1;
	int64_t d;
	if (__builtin_sub_overflow(when, (int64_t)now, &d))
		d = (int64_t)now < 0 ? INT64_MAX : 0;   /* only with an absurd NOW */
	if (d <= 0)
		*delay_us = 0;
	else
		*delay_us = d > INT64_MAX / US_PER_S ? INT64_MAX : d * US_PER_S;
	return 0;
}

/* Every field of every request is looked up here: the lengths, known in advance, turn most
 * fields away before any byte is compared. */
int deadline_header_kind(const char *name, size_t nlen)
{
	for (int k = 0; k < DL_NKINDS; k++)
		if (nlen == deadline_header_len[k] && str_ieq(name, nlen, deadline_header_name[k], nlen))
			return k;
	return -1;
}

void deadline_collect(const struct http_hdr *hdrs, int nhdrs, struct dl_value vals[DL_NKINDS],
                      bool present[DL_NKINDS])
{
	memset(vals, 0, sizeof(struct dl_value) * DL_NKINDS);
	memset(present, 0, sizeof(bool) * DL_NKINDS);
	for (int i = 0; i < nhdrs; i++) {
		int k = deadline_header_kind(hdrs[i].name, hdrs[i].nlen);
		if (k < 0)
			continue;
		struct dl_value *v = &vals[k];
		if (v->present && (v->len != hdrs[i].vlen || memcmp(v->v, hdrs[i].value, v->len) != 0))
			v->conflict = 1;
		if (!v->present) {
			v->v = hdrs[i].value;
			v->len = hdrs[i].vlen;
			v->present = 1;
		}
		present[k] = true;
	}
}
