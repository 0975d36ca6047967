/*
 * h2_fields: the validity of one HTTP/2 field, as nghttp2 judged it (see h2_fields.h).
 */
#include <string.h>

#include "http/h2_fields.h"
#include "base/util.h"

const uint8_t h2f_class[256] = {
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 3, 0, 1, 3, 3, 3, 3, 2, 2, 3, 3, 2, 3, 3, 0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 0, 2, 0, 0,
	2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 2, 1, 3,
	1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 1, 0, 3, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
};

#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull
/* Whether any byte of X is below LOW (<= 0x80) or is DEL, eight at a time (a byte below LOW
 * borrows into its top bit: the classic "has less" test). */
static bool word_has_ctl(uint64_t x, uint64_t low)
{
	uint64_t del = x ^ (0x7f * ONES);
	return (((x - low * ONES) & ~x) | ((del - ONES) & ~del)) & HIGHS;
}

/* No byte below LOW but TAB (when TAB), nor DEL. */
static bool bytes_ok(const char *v, size_t n, unsigned low, bool tab)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t x;
		memcpy(&x, v + i, 8);
		if (word_has_ctl(x, low))
			break;          /* the bytes decide, one at a time */
	}
	for (; i < n; i++) {
		unsigned c = (unsigned char)v[i];
		if ((c < low && !(tab && c == '\t')) || c == 0x7f)
			return false;
	}
	return true;
}

bool h2f_value_ok(const char *v, size_t n)
{
	if (n > 0 && (v[0] == ' ' || v[0] == '\t' || v[n - 1] == ' ' || v[n - 1] == '\t'))
		return false;
	return bytes_ok(v, n, 0x20, true);
}

bool h2f_path_ok(const char *v, size_t n)
{
	return bytes_ok(v, n, 0x21, false);
}

int64_t h2f_parse_length(const char *v, size_t n)
{
	int64_t x = 0;
	if (n == 0)
		return -2;
	for (size_t i = 0; i < n; i++) {
		if (v[i] < '0' || v[i] > '9' || x > (INT64_MAX - (v[i] - '0')) / 10)
			return -2;
		x = x * 10 + (v[i] - '0');
	}
	return x;
}

enum h2f_kind h2f_regular(const char *n, size_t nl, const char *v, size_t vl)
{
	if (nl == 0 || !h2f_all_of(n, nl, H2F_NAME) || !h2f_value_ok(v, vl))
		return H2F_BAD;
	switch (nl) {
	case 2:
		return memcmp(n, "te", 2) != 0 || str_ieq(v, vl, "trailers", 8) ? H2F_OTHER : H2F_BAD;
	case 4:
		return memcmp(n, "host", 4) == 0 ? H2F_HOST : H2F_OTHER;
	case 7:
		return memcmp(n, "upgrade", 7) != 0 ? H2F_OTHER : H2F_BAD;
	case 10:
		return memcmp(n, "connection", 10) != 0 && memcmp(n, "keep-alive", 10) != 0
		       ? H2F_OTHER : H2F_BAD;
	case 14:
		return memcmp(n, "content-length", 14) == 0 ? H2F_CONTENT_LENGTH : H2F_OTHER;
	case 16:
		return memcmp(n, "proxy-connection", 16) != 0 ? H2F_OTHER : H2F_BAD;
	case 17:
		return memcmp(n, "transfer-encoding", 17) != 0 ? H2F_OTHER : H2F_BAD;
	default:
		return H2F_OTHER;
	}
}
