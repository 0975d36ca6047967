/*
 * h2_fields: the validity of one HTTP/2 field (RFC 9113 §8.2, §8.2.2), pure and shared by
 * both HTTP/2 sessions, which check requests and responses themselves (nghttp2's HTTP
 * messaging checks are off on both: they cost ~230 instructions a field on top of ours). The
 * rules are nghttp2's (lib/nghttp2_http.c, nghttp2_helper.c): names are lowercase token
 * bytes, values have no control byte but HTAB and no surrounding whitespace, and the
 * connection-specific fields (and a te other than "trailers") are refused.
 */
#ifndef RG_H2_FIELDS_H
#define RG_H2_FIELDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The bytes of a field name (tchar, lower case) and of an authority (reg-name, IP literal
 * and port bytes, RFC 3986 §3.2). A table: every name of every message passes here. */
#define H2F_NAME 1
#define H2F_AUTHORITY 2
extern const uint8_t h2f_class[256];

/* Whether every byte of V[N] is of class CLS (none: true). */
static inline bool h2f_all_of(const char *v, size_t n, unsigned cls)
{
	unsigned all = cls;
	for (size_t i = 0; i < n; i++)
		all &= h2f_class[(unsigned char)v[i]];
	return all != 0;
}

/* A value: no NUL, CR, LF or other control byte but HTAB, nor DEL; no leading or trailing
 * SP / HTAB (RFC 9113 §8.2.1). */
bool h2f_value_ok(const char *v, size_t n);
/* A :path: visible bytes only (no control byte, SP or DEL). */
bool h2f_path_ok(const char *v, size_t n);
/* A content-length: its digits, up to INT64_MAX; -2 for anything else. */
int64_t h2f_parse_length(const char *v, size_t n);

/* What a regular (non-pseudo) field is to the checks above it. */
enum h2f_kind {
	H2F_BAD,                /* malformed: its name or value, connection-specific, te */
	H2F_OTHER,
	H2F_HOST,
	H2F_CONTENT_LENGTH,
};
enum h2f_kind h2f_regular(const char *n, size_t nl, const char *v, size_t vl);

#endif
