/*
 * util: small pure helpers shared by several files: duration and size syntax (SPEC §2),
 * case-insensitive comparisons, host:port splitting, a fast PRNG, a growing string, JSON
 * string escaping.
 */
#ifndef RG_UTIL_H
#define RG_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* "250ms" "2s" "1m" "24h", or a bare integer meaning milliseconds; no fractions or compounds.
 * Returns 0 and sets *us, or -1. Overflow is an error. */
int parse_duration(const char *s, int64_t *us);
/* "512" "512B" "64KiB" "1MiB" "1GiB". Returns 0 and sets *bytes, or -1. */
int parse_size(const char *s, int64_t *bytes);
/* The inverse of parse_duration: the largest unit that is exact ("250ms", "5s", "1m", "24h";
 * 0 is "0s"). Returns the length it needed, like snprintf. */
size_t format_duration(int64_t us, char *buf, size_t cap);

/* N bytes of A and B equal but for ASCII case. */
bool str_ieq_fold(const char *a, const char *b, size_t n);
/* A[ALEN] equals B[BLEN] but for ASCII case. Inline, so that the exact compare, which
 * answers most calls (an HTTP/2 peer's names are lowercase, as are most HTTP/1 ones and every
 * literal they are compared with), is inlined for a literal's length. */
static inline bool str_ieq(const char *a, size_t alen, const char *b, size_t blen)
{
	return alen == blen && (memcmp(a, b, blen) == 0 || str_ieq_fold(a, b, blen));
}
/* N bytes of SRC into DST with ASCII capitals lowercased (an HTTP/2 field name). */
void ascii_lower_copy(char *dst, const char *src, size_t n);
bool str_iprefix(const char *s, size_t len, const char *prefix);

/* Split "host:port" / "[v6]:port" into host (no brackets) and port. 0 or -1. */
int split_host_port(const char *s, char *host, size_t hostcap, int *port);

/* xorshift64*: per-thread state, never 0 */
uint64_t rand_next(uint64_t *state);

/* DESIGN rule 2: in a debug build (the sanitizer build defines RG_CHECK_MAGIC), every void *arg
 * that comes back from libevent or from a lower layer's callback is checked against its
 * object's magic number, so a callback on a freed or foreign object stops at once. */
#ifdef RG_CHECK_MAGIC
#define MAGIC_CHECK(p, m) ((p)->magic == (m) ? (void)0 : magic_fail(__FILE__, __LINE__, #p))
#else
#define MAGIC_CHECK(p, m) ((void)0)
#endif
_Noreturn void magic_fail(const char *file, int line, const char *what);

/* DESIGN rule 2: the one writer of an object's state, `static void FN(struct TYPE *, enum
 * ETYPE)`; in the debug build it stops when a terminal state (TERMINAL) would be left. */
#ifdef RG_CHECK_MAGIC
#define STATE_TERMINAL_CHECK(o, st, terminal) \
	((o)->state == (terminal) && (st) != (terminal) ? magic_fail(__FILE__, __LINE__, #terminal " is terminal") : (void)0)
#else
#define STATE_TERMINAL_CHECK(o, st, terminal) ((void)0)
#endif
#define DEFINE_STATE_SETTER(fn, type, etype, terminal) \
	static void fn(struct type *o, enum etype st) \
	{ \
		STATE_TERMINAL_CHECK(o, st, terminal); \
		o->state = st; \
	}
/* 32 random hex digits and a NUL: an X-Request-Id of ours */
void request_id_new(char out[33], uint64_t *rng);

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t m);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);

/* The body of a JSON string (no quotes) for the N bytes at S (NULL: none), into DST: '"' and
 * '\\' escaped, control bytes as \n \r \t \b \f or \u00XX, DEL as \u007f, bytes >= 0x80 kept
 * where they form valid UTF-8 and each other byte replaced by \ufffd, so the output is always
 * valid JSON. At most CAP-1 bytes and a NUL, never cutting an escape or a character (6 * N + 1
 * always holds it all). Returns the length written. */
size_t json_escape(char *dst, size_t cap, const char *s, size_t n);

/* A growing NUL-terminated string: { 0 } is empty (s NULL until the first append); the owner
 * frees s. */
struct strbuf {
	char *s;
	size_t len, cap;
};

void sb_putn(struct strbuf *b, const char *s, size_t n);
void sb_puts(struct strbuf *b, const char *s);
void sb_vprintf(struct strbuf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
void sb_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
