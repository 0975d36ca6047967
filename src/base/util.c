/*
 * util: small pure helpers (see util.h). Nothing here allocates except the x* wrappers and the
 * growing string built on them, and nothing depends on the locale: configuration and HTTP
 * syntax are ASCII.
 */
#include "base/util.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ascii_lower(int c)
{
	return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c;
}

/* Leading decimal digits of S as an int64 (no sign, at least one digit). Sets *end past them.
 * -1 on no digit or int64 overflow. */
static int parse_digits(const char *s, int64_t *v, const char **end)
{
	int64_t n = 0;
	const char *p = s;

	while (*p >= '0' && *p <= '9') {
		int d = *p - '0';
		if (n > (INT64_MAX - d) / 10)
			return -1;
		n = n * 10 + d;
		p++;
	}
	if (p == s)
		return -1;
	*v = n;
	*end = p;
	return 0;
}

/* The unit table is the whole syntax: a number followed by exactly one of these. */
struct unit {
	const char *name;
	int64_t factor;
};

static int parse_scaled(const char *s, const struct unit *units, int64_t *out)
{
	const char *end;
	int64_t n;

	if (!s || parse_digits(s, &n, &end) < 0)
		return -1;
	for (const struct unit *u = units; u->name; u++) {
		if (strcmp(end, u->name) != 0)
			continue;
		if (n > INT64_MAX / u->factor)
			return -1;
		*out = n * u->factor;
		return 0;
	}
	return -1;
}

int parse_duration(const char *s, int64_t *us)
{
	/* "" (a bare integer) means milliseconds */
	static const struct unit units[] = {
		{ "ms", 1000 }, { "s", 1000000 }, { "m", 60000000 }, { "h", 3600000000LL },
		{ "", 1000 }, { NULL, 0 },
	};
	return parse_scaled(s, units, us);
}

int parse_size(const char *s, int64_t *bytes)
{
	static const struct unit units[] = {
		{ "", 1 }, { "B", 1 }, { "KiB", 1LL << 10 }, { "MiB", 1LL << 20 }, { "GiB", 1LL << 30 },
		{ NULL, 0 },
	};
	return parse_scaled(s, units, bytes);
}

size_t format_duration(int64_t us, char *buf, size_t cap)
{
	/* largest unit that represents the value exactly, so that parsing it back is lossless */
	static const struct unit units[] = {
		{ "h", 3600000000LL }, { "m", 60000000 }, { "s", 1000000 }, { "ms", 1000 }, { NULL, 0 },
	};
	int n;

	if (us == 0)
		n = snprintf(buf, cap, "0s");
	else {
		const struct unit *u = units;
		while (u->name && us % u->factor != 0)
			u++;
		if (u->name)
			n = snprintf(buf, cap, "%lld%s", (long long)(us / u->factor), u->name);
		else
			n = snprintf(buf, cap, "%lldus", (long long)us);
	}
	return n < 0 ? 0 : (size_t)n;
}

bool str_ieq_fold(const char *a, const char *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (ascii_lower((unsigned char)a[i]) != ascii_lower((unsigned char)b[i]))
			return false;
	return true;
}

/* N bytes of SRC lower-cased into DST, a word at a time: a header name is ASCII, and a byte
 * loop (or nghttp2's own downcase) costs ~12 instructions a byte of every name of every
 * request and response. A byte gets 0x20 where it is 'A'..'Z': h + 0x3f carries into the top
 * bit from 'A' up, h + 0x25 from '[' up, so their XOR marks exactly the capitals (h is the
 * byte without its top bit, so no sum carries into the next byte; ~x leaves bytes >= 0x80
 * alone). */
#define LOWER_WORD(x, T, ones)                                                          \
	((x) | ((~(x) & ((((x) & (T)(0x7f * (ones))) + (T)(0x3f * (ones))) ^              \
	                 (((x) & (T)(0x7f * (ones))) + (T)(0x25 * (ones)))) &             \
	         (T)(0x80 * (ones))) >> 2))
#define ONES64 0x0101010101010101ull
#define ONES32 0x01010101u

void ascii_lower_copy(char *dst, const char *src, size_t n)
{
	uint64_t x;
	uint32_t y;
	if (n >= 8) {
		for (size_t i = 0; i + 8 < n; i += 8) {
			memcpy(&x, src + i, 8);
			x = LOWER_WORD(x, uint64_t, ONES64);
			memcpy(dst + i, &x, 8);
		}
		/* the last word, overlapping the one before where N is no multiple of 8: the
		 * bytes it shares are lower-cased the same way twice */
		memcpy(&x, src + n - 8, 8);
		x = LOWER_WORD(x, uint64_t, ONES64);
		memcpy(dst + n - 8, &x, 8);
	} else if (n >= 4) {
		/* two 4-byte words, overlapping likewise (server, date, etag, vary, ...) */
		memcpy(&y, src, 4);
		y = LOWER_WORD(y, uint32_t, ONES32);
		memcpy(dst, &y, 4);
		memcpy(&y, src + n - 4, 4);
		y = LOWER_WORD(y, uint32_t, ONES32);
		memcpy(dst + n - 4, &y, 4);
	} else {
		for (size_t i = 0; i < n; i++) {
			char c = src[i];
			dst[i] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
		}
	}
}

bool str_iprefix(const char *s, size_t len, const char *prefix)
{
	size_t plen = strlen(prefix);
	return plen <= len && str_ieq(s, plen, prefix, plen);
}

int split_host_port(const char *s, char *host, size_t hostcap, int *port)
{
	const char *h, *hend, *p;
	char v6[INET6_ADDRSTRLEN + 1];
	unsigned char addr[16];
	size_t hlen;
	long n = 0;

	if (!s || !*s)
		return -1;
	if (s[0] == '[') {
		h = s + 1;
		hend = strchr(h, ']');
		if (!hend || hend[1] != ':')
			return -1;
		p = hend + 2;
		hlen = (size_t)(hend - h);
		/* a bracketed host is an IPv6 literal and nothing else */
		if (hlen == 0 || hlen >= sizeof v6)
			return -1;
		memcpy(v6, h, hlen);
		v6[hlen] = '\0';
		if (inet_pton(AF_INET6, v6, addr) != 1)
			return -1;
	} else {
		h = s;
		hend = strrchr(s, ':');
		/* more than one colon: an IPv6 address without brackets, ambiguous with the port */
		if (!hend || hend == s || memchr(s, ':', (size_t)(hend - s)))
			return -1;
		p = hend + 1;
		hlen = (size_t)(hend - h);
		if (memchr(h, '[', hlen) || memchr(h, ']', hlen))
			return -1;
	}
	/* port: 1-65535, digits only */
	if (*p == '\0' || strlen(p) > 5)
		return -1;
	for (const char *q = p; *q; q++) {
		if (*q < '0' || *q > '9')
			return -1;
		n = n * 10 + (*q - '0');
	}
	if (n < 1 || n > 65535)
		return -1;
	if (hlen >= hostcap)
		return -1;
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	*port = (int)n;
	return 0;
}

uint64_t rand_next(uint64_t *state)
{
	uint64_t x = *state;

	/* xorshift's only fixed point is 0; a zero seed would return 0 forever */
	if (x == 0)
		x = 0x9E3779B97F4A7C15ULL;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return x * 0x2545F4914F6CDD1DULL;
}

/* 32 bits as 8 lowercase hex digits, a word at a time: each nibble spread into a byte of
 * its own, then '0' added, and 'a' - '0' - 10 more where the nibble is 10 or above (adding 6
 * carries into the byte's high nibble exactly then). The digits come least significant
 * first: for a random id the order does not matter. */
static void hex8(char *out, uint32_t x)
{
	uint64_t v = x;
	v = (v | v << 16) & 0x0000ffff0000ffffull;
	v = (v | v << 8) & 0x00ff00ff00ff00ffull;
	v = (v | v << 4) & 0x0f0f0f0f0f0f0f0full;
	uint64_t ten = ((v + 0x0606060606060606ull) >> 4) & 0x0101010101010101ull;
	v += 0x3030303030303030ull + ten * ('a' - '0' - 10);
	memcpy(out, &v, 8);
}

void request_id_new(char out[33], uint64_t *rng)
{
	uint64_t r1 = rand_next(rng), r2 = rand_next(rng);
	hex8(out, (uint32_t)r1);
	hex8(out + 8, (uint32_t)(r1 >> 32));
	hex8(out + 16, (uint32_t)r2);
	hex8(out + 24, (uint32_t)(r2 >> 32));
	out[32] = 0;
}

static void *oom(size_t n)
{
	fprintf(stderr, "retrygate: out of memory (%zu bytes)\n", n);
	abort();
}

/* A size of 0 is rounded up to 1 so that NULL always means failure. */
void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	return p ? p : oom(n);
}

void *xcalloc(size_t n, size_t m)
{
	void *p = calloc(n ? n : 1, m ? m : 1);
	return p ? p : oom(n * m);
}

void *xrealloc(void *p, size_t n)
{
	void *q = realloc(p, n ? n : 1);
	return q ? q : oom(n);
}

char *xstrdup(const char *s)
{
	return xstrndup(s, strlen(s));
}

char *xstrndup(const char *s, size_t n)
{
	char *p = xmalloc(n + 1);
	memcpy(p, s, n);
	p[n] = '\0';
	return p;
}

void magic_fail(const char *file, int line, const char *what)
{
	fprintf(stderr, "%s:%d: %s: bad magic (a callback on a freed or foreign object)\n", file, line,
	        what);
	abort();
}

/* ------------------------------------------------------------------ growing strings */

void sb_putn(struct strbuf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		b->cap = (b->len + n + 1) * 2;
		b->s = xrealloc(b->s, b->cap);
	}
	memcpy(b->s + b->len, s, n);
	b->len += n;
	b->s[b->len] = '\0';
}

void sb_puts(struct strbuf *b, const char *s)
{
	sb_putn(b, s, strlen(s));
}

void sb_vprintf(struct strbuf *b, const char *fmt, va_list ap)
{
	va_list ap2;
	int n;

	va_copy(ap2, ap);
	n = vsnprintf(NULL, 0, fmt, ap2);
	va_end(ap2);
	if (n < 0)
		return;
	if (b->len + (size_t)n + 1 > b->cap) {
		b->cap = (b->len + (size_t)n + 1) * 2;
		b->s = xrealloc(b->s, b->cap);
	}
	vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
	b->len += (size_t)n;
}

void sb_printf(struct strbuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	sb_vprintf(b, fmt, ap);
	va_end(ap);
}

/* ------------------------------------------------------------------ JSON strings */

/* The length of the valid UTF-8 sequence (2 to 4 bytes) at P, N bytes available; 0 when
 * there is none: a stray continuation byte, an overlong form, a surrogate, above U+10FFFF,
 * or cut short (RFC 3629 table 3-7). */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
	unsigned char c = p[0], lo = 0x80, hi = 0xbf;
	size_t len;

	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		lo = c == 0xe0 ? 0xa0 : 0x80;      /* overlong */
		hi = c == 0xed ? 0x9f : 0xbf;      /* surrogates */
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		lo = c == 0xf0 ? 0x90 : 0x80;      /* overlong */
		hi = c == 0xf4 ? 0x8f : 0xbf;      /* above U+10FFFF */
	} else
		return 0;
	if (n < len || p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if (p[i] < 0x80 || p[i] > 0xbf)
			return 0;
	return len;
}

size_t json_escape(char *dst, size_t cap, const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t o = 0;

	if (cap == 0)
		return 0;
	for (size_t i = 0; s && i < n;) {
		char tmp[8];
		const char *piece = tmp;
		size_t len = 1, used = 1;
		unsigned char c = p[i];

		if (c == '"' || c == '\\') {
			tmp[0] = '\\';
			tmp[1] = (char)c;
			len = 2;
		} else if (c < 0x20 || c == 0x7f) {
			const char *esc = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" :
			                  c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
			if (esc)
				piece = esc;
			else
				snprintf(tmp, sizeof tmp, "\\u%04x", c);
			len = strlen(piece);
		} else if (c < 0x80)
			tmp[0] = (char)c;
		else if ((used = utf8_seq(p + i, n - i))) {
			piece = s + i;
			len = used;
		} else {
			piece = "\\ufffd";
			len = 6;
			used = 1;
		}
		if (o + len >= cap)
			break;
		memcpy(dst + o, piece, len);
		o += len;
		i += used;
	}
	dst[o] = '\0';
	return o;
}
