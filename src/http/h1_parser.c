/*
 * h1_parser: HTTP/1.x message parsing for one direction of one connection (contract in
 * h1_parser.h).
 *
 * Bytes flow like this. A head is parsed by llhttp straight from the caller's evbuffer chains;
 * the bytes llhttp consumed are copied once into hbuf, which the msg owns and reuses from
 * message to message. Callbacks record offsets into hbuf, never pointers (hbuf may move while
 * a head grows); pointers are made when the head is complete and stay valid until
 * http_msg_next(). llhttp is paused at the end of every head, so it never reads body or
 * pipelined bytes by itself. A Content-Length body is then moved with evbuffer_remove_buffer()
 * without llhttp: whole chains change hands, only partial ones are copied (once). A chunked
 * body goes back to llhttp for the framing only: it pauses at each chunk header; the chunk
 * data is shown to llhttp just to keep its state in step (it only counts it) and moved with
 * evbuffer_remove_buffer(). Chunk extensions and trailers are checked by llhttp, bounded here,
 * and dropped.
 *
 * Request heads: llhttp does the syntax with every lenient flag off (one of them loops forever
 * on a NUL in llhttp 9.4); this file adds the policy of SPEC §5 and §8. A 400 ends parsing at
 * once. 414, 431, 501 and 505 are noted and parsing goes on, so that a 400 later in the head
 * still wins: precedence 400 > 414 > 431 > 501 > 505. Two refusals of llhttp's are turned into
 * 501/505 only when the rest of the head is valid: a method we don't serve is shown to llhttp
 * as "GET ", and a well-formed version llhttp rejects (HTTP/1.2) is rewritten to 1.1 in hbuf
 * and the request line parsed again.
 */
#include "http/h1_parser.h"

#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

/* llhttp.h declares an enum constant HTTP_HEAD (the method) as http.h does (the event): give
 * llhttp's another name here. No file should include both headers without doing the same. */
#define HTTP_HEAD LLHTTP_METHOD_HEAD
#include <llhttp.h>
#undef HTTP_HEAD

#define DEFAULT_MAX_HEADER_BYTES (32u * 1024)
#define DEFAULT_MAX_URI_BYTES    (8u * 1024)
#define HBUF_MIN                 512
#define BODY_STEP                ((size_t)1 << 30)  /* evbuffer_remove_buffer() returns int */
#define PEEK_VECS                16

enum msg_state {
	M_HEAD,         /* reading a head */
	M_NOBODY,       /* head delivered, no body: the next feed says DONE */
	M_BODY_CL,      /* Content-Length body, `left` bytes to go */
	M_CHUNK_FRAME,  /* llhttp reads a chunk line, the CRLF after data, or the trailers */
	M_CHUNK_DATA,   /* `left` bytes of chunk data to go */
	M_BODY_EOF,     /* response body runs until the peer closes */
	M_DONE,         /* message over (also after a 1xx or 101 head) */
	M_ERROR,
};

enum head_phase {
	HP_PRE,         /* request: leading empty lines and the method, scanned here */
	HP_PARSE,       /* llhttp reads the head */
	HP_VERSION,     /* request: llhttp refused a version "HTTP/d.d"; waiting for the next byte */
};

/* A header line in hbuf, by offsets, with its name's class (enum hname). */
struct hspan {
	uint32_t noff, nlen, voff, vlen;
	uint8_t cls;
};

/* Parse state of one head, cleared when a head starts (and when a request line is re-parsed). */
struct parse {
	size_t url_off, url_len, ver_off, ver_len, reason_off, reason_len;
	bool url_seen, url_done, ver_seen;
	int vmaj, vmin;                 /* version as received, before any rewrite */
	int hstate;                     /* 0 between lines, 1 in a name, 2 in a value */
	struct hspan cur;
	int lines;                      /* header lines seen; the first HTTP_MAX_HEADERS are kept */
	int host_count;
	size_t host_off, host_len;
	int cl_count;
	int64_t cl;
	int te_count, te_chunked;
	bool te_last_chunked, te_other;
	bool conn_close, conn_keepalive, conn_upgrade, has_upgrade, expect_100;
	/* refusals noted while parsing (first detail of each), decided when the head ends */
	const char *pend_414, *pend_431, *pend_501, *pend_505;
	/* a callback that returns HPE_USER leaves its verdict here */
	int cb_status;
	const char *cb_detail;
	/* set by the pausing callbacks */
	bool head_done, chunk_header, msg_done;
};

struct http_msg {
	llhttp_t p;
	enum http_kind kind;
	struct http_limits lim;
	enum msg_state state;
	bool expect_head;               /* response: the request was HEAD (sticky, see expect) */
	bool head_taken;                /* http_msg_take completed a head: the next feed says so */

	/* head bytes: hbuf[0, hlen) is what llhttp consumed of this head */
	char *hbuf;
	size_t hcap, hlen, head_size;
	/* the data llhttp is executing: its first byte is hbuf offset xoff */
	const char *xbase;
	size_t xoff;

	/* request line start */
	enum head_phase hphase;
	bool pre_cr, in_method, msubst, vsubst, is_connect, is_options;
	size_t mstart, msp;             /* method offset, offset of the SP after it */

	struct parse ps;

	/* body */
	uint64_t left;
	size_t frame_bytes, trailer_bytes;
	int trailer_lines;
	bool first_chunk, in_trailers;

	/* verdict */
	int err_status;
	const char *err_reason, *err_detail;

	/* the head as delivered; path may live past the head in hbuf */
	const char *path_static;
	size_t path_off, path_len;
	struct hspan hs[HTTP_MAX_HEADERS];
	struct http_hdr hdrs[HTTP_MAX_HEADERS];
	struct http_head head;
};

/* ------------------------------------------------------------------ small helpers */

static size_t min_sz(size_t a, size_t b)
{
	return a < b ? a : b;
}

static bool is_tchar(unsigned char c)
{
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
		return true;
	return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool is_digit(unsigned char c)
{
	return c >= '0' && c <= '9';
}

static bool is_hex(unsigned char c)
{
	return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static unsigned char lower(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c;
}

/* ASCII case-insensitive equality of S[0,N) and LIT[0,LN), LIT lowercase (letters, digits and
 * "-_.:/" only: every caller's is a literal, see IEQ). Only S's bytes are folded, a word at a
 * time: a byte of LIT at or above 'a' is a letter, so its position takes the 0x20 bit. Heads
 * meet these compares for every Host, Content-Length and Connection field. */
#define ONES8 0x0101010101010101ull
#define HIGH8 0x8080808080808080ull
static uint64_t fold_cmp8(const char *s, const char *lit)
{
	uint64_t a, b;
	memcpy(&a, s, 8);
	memcpy(&b, lit, 8);
	return (a | (((b + 0x1f * ONES8) & HIGH8) >> 2)) ^ b;
}

static uint32_t fold_cmp4(const char *s, const char *lit)
{
	uint32_t a, b;
	memcpy(&a, s, 4);
	memcpy(&b, lit, 4);
	return (a | (((b + 0x1f1f1f1fu) & 0x80808080u) >> 2)) ^ b;
}

static bool ieq_n(const char *s, size_t n, const char *lit, size_t ln)
{
	size_t i;
	if (n != ln)
		return false;
	if (n >= 8) {
		for (i = 0; i + 8 <= n; i += 8)
			if (fold_cmp8(s + i, lit + i))
				return false;
		return i == n || !fold_cmp8(s + n - 8, lit + n - 8);
	}
	if (n >= 4)
		return !(fold_cmp4(s, lit) | fold_cmp4(s + n - 4, lit + n - 4));
	for (i = 0; i < n; i++)
		if (lower((unsigned char)s[i]) != (unsigned char)lit[i])
			return false;
	return true;
}

#define ieq(s, n, lit) ieq_n((s), (n), "" lit, sizeof(lit) - 1)

static bool ieqn(const char *a, size_t an, const char *b, size_t bn)
{
	size_t i;
	if (an != bn)
		return false;
	for (i = 0; i < an; i++)
		if (lower((unsigned char)a[i]) != lower((unsigned char)b[i]))
			return false;
	return true;
}

static bool is_ows(char c)
{
	return c == ' ' || c == '\t';
}

static void trim_ows(const char **s, size_t *n)
{
	while (*n > 0 && is_ows((*s)[0])) {
		(*s)++;
		(*n)--;
	}
	while (*n > 0 && is_ows((*s)[*n - 1]))
		(*n)--;
}

/* Next element of a comma-separated list: *S walks [*S, END) and becomes NULL after the last
 * element. Elements come trimmed; empty ones are returned (length 0) so callers can refuse them. */
static bool list_next(const char **s, const char *end, const char **elt, size_t *len)
{
	const char *p = *s, *q;
	if (p == NULL)
		return false;
	q = memchr(p, ',', (size_t)(end - p));
	*elt = p;
	*len = (size_t)((q ? q : end) - p);
	trim_ows(elt, len);
	*s = q ? q + 1 : NULL;
	return true;
}

static void hbuf_reserve(struct http_msg *m, size_t need)
{
	size_t cap = m->hcap ? m->hcap : HBUF_MIN;
	char *nb;
	if (need <= m->hcap)
		return;
	while (cap < need)
		cap *= 2;
	nb = realloc(m->hbuf, cap);
	if (nb == NULL)
		abort();        /* as util.h's xrealloc: memory exhaustion is not survivable */
	m->hbuf = nb;
	m->hcap = cap;
}

/* The first chain of IN in *V; false when IN is empty. Peeking with len 1 fills the whole first
 * chain: a negative len would make evbuffer_peek() walk every chain to count them, which is
 * O(pipeline depth) per call. */
static bool peek_first(struct evbuffer *in, struct evbuffer_iovec *v)
{
	if (evbuffer_get_length(in) == 0)
		return false;
	if (evbuffer_peek(in, 1, NULL, v, 1) < 1 || v->iov_len == 0) {
		v->iov_base = evbuffer_pullup(in, 1);
		v->iov_len = 1;
	}
	return true;
}

/* hbuf offset of AT, a pointer into the data llhttp is executing. */
static size_t off_of(const struct http_msg *m, const char *at)
{
	return m->xoff + (size_t)(at - m->xbase);
}

/* Make hbuf hold the executing data up to hbuf offset OFF (capacity reserved by the caller). */
static void head_sync(struct http_msg *m, size_t off)
{
	const char *src;
	if (off <= m->hlen)
		return;
	src = m->xbase + (m->hlen - m->xoff);
	if (src != m->hbuf + m->hlen)
		memcpy(m->hbuf + m->hlen, src, off - m->hlen);
	m->hlen = off;
}

static enum http_event fail(struct http_msg *m, int status, const char *detail)
{
	m->state = M_ERROR;
	m->err_status = status;
	m->err_detail = detail;
	switch (status) {
	case 400: m->err_reason = "bad-request"; break;
	case 414: m->err_reason = "uri-too-long"; break;
	case 431: m->err_reason = "headers-too-large"; break;
	case 501: m->err_reason = "not-implemented"; break;
	case 505: m->err_reason = "version-not-supported"; break;
	default:  m->err_reason = "bad-response"; break;
	}
	return HTTP_ERROR;
}

/* The status for malformed input in this direction. */
static int bad(const struct http_msg *m)
{
	return m->kind == HTTP_REQUEST_KIND ? 400 : 502;
}

/* From a callback: record the verdict and stop llhttp (which may report it under another
 * code, e.g. HPE_CB_HEADER_VALUE_COMPLETE; callers look at ps.cb_status). */
static int cb_fail(struct http_msg *m, int status, const char *detail)
{
	m->ps.cb_status = status;
	m->ps.cb_detail = detail;
	return HPE_USER;
}

/* ------------------------------------------------------------------ header semantics */

enum hname {
	HN_OTHER, HN_HOST, HN_CL, HN_TE, HN_UNDERSCORE, HN_CONNECTION, HN_UPGRADE, HN_EXPECT,
	HN_KEEPALIVE, HN_PROXYCONN, HN_TEHDR, HN_TRAILER,
};

/* Most names are none of these: the length and first letter reject them before any compare. */
static enum hname classify(const char *n, size_t len)
{
	unsigned char c0 = len > 0 ? lower((unsigned char)n[0]) : 0;
	if (c0 != 't' && c0 != 'h' && c0 != 'e' && c0 != 'u' && c0 != 'c' && c0 != 'k' && c0 != 'p')
		return HN_OTHER;
	switch (len) {
	case 2:  return ieq(n, len, "te") ? HN_TEHDR : HN_OTHER;
	case 4:  return ieq(n, len, "host") ? HN_HOST : HN_OTHER;
	case 6:  return ieq(n, len, "expect") ? HN_EXPECT : HN_OTHER;
	case 7:
		if (ieq(n, len, "upgrade"))
			return HN_UPGRADE;
		return ieq(n, len, "trailer") ? HN_TRAILER : HN_OTHER;
	case 10:
		if (ieq(n, len, "connection"))
			return HN_CONNECTION;
		return ieq(n, len, "keep-alive") ? HN_KEEPALIVE : HN_OTHER;
	case 14:
		if (ieq(n, len, "content-length"))
			return HN_CL;
		return ieq(n, len, "content_length") ? HN_UNDERSCORE : HN_OTHER;
	case 16: return ieq(n, len, "proxy-connection") ? HN_PROXYCONN : HN_OTHER;
	case 17:
		if (ieq(n, len, "transfer-encoding"))
			return HN_TE;
		return ieq(n, len, "transfer_encoding") ? HN_UNDERSCORE : HN_OTHER;
	default: return HN_OTHER;
	}
}

static bool hop_class(enum hname c)
{
	switch (c) {
	case HN_CL: case HN_TE: case HN_CONNECTION: case HN_UPGRADE: case HN_KEEPALIVE:
	case HN_PROXYCONN: case HN_TEHDR: case HN_TRAILER:
		return true;
	default:
		return false;
	}
}

/* unreserved / sub-delims (RFC 3986 §3.2.2 reg-name, pct-encoded apart) */
static bool is_regname(unsigned char c)
{
	switch (c) {
	case '-': case '.': case '_': case '~': case '!': case '$': case '&': case '\'':
	case '(': case ')': case '*': case '+': case ',': case ';': case '=':
		return true;
	default:
		return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c);
	}
}

/* uri-host [ ":" port ] (RFC 3986 / RFC 9110 §7.2). Empty is valid syntax (a Host for a target
 * without authority); finish_request refuses it, as we route no such target, and the
 * absolute-form caller refuses an empty authority itself. */
static bool host_valid(const char *s, size_t n)
{
	size_t i = 0, digits = 0;
	if (n == 0)
		return true;
	if (s[0] == '[') {
		for (i = 1; i < n && s[i] != ']'; i++)
			if (!is_hex((unsigned char)s[i]) && s[i] != ':' && s[i] != '.')
				return false;
		if (i >= n || i == 1)
			return false;
		i++;
	} else {
		for (; i < n && s[i] != ':'; i++) {
			unsigned char c = (unsigned char)s[i];
			if (is_regname(c))
				continue;
			if (c == '%' && i + 2 < n && is_hex((unsigned char)s[i + 1]) &&
			    is_hex((unsigned char)s[i + 2])) {
				i += 2;
				continue;
			}
			return false;
		}
		if (i == 0)
			return false;
	}
	if (i == n)
		return true;
	if (s[i] != ':')
		return false;
	for (i++; i < n; i++, digits++)
		if (!is_digit((unsigned char)s[i]) || digits >= 5)
			return false;
	return true;
}

/* Split a valid authority into host and port (DEFPORT when absent or empty). */
static void authority_split(const char *s, size_t n, size_t *hlen, long *port, long defport)
{
	size_t i = 0;
	if (n > 0 && s[0] == '[') {
		while (i < n && s[i] != ']')
			i++;
		if (i < n)
			i++;
	} else {
		while (i < n && s[i] != ':')
			i++;
	}
	*hlen = i;
	*port = defport;
	if (i + 1 < n) {
		long v = 0;
		for (i++; i < n; i++)
			v = v * 10 + (s[i] - '0');
		*port = v;
	}
}

/* Same authority, ports compared after replacing an absent port by the scheme's default. */
static bool authority_eq(const char *a, size_t an, const char *b, size_t bn, long defport)
{
	size_t ah, bh;
	long ap, bp;
	authority_split(a, an, &ah, &ap, defport);
	authority_split(b, bn, &bh, &bp, defport);
	return ap == bp && ieqn(a, ah, b, bh);
}

/* One element of a Transfer-Encoding list: token *( OWS ";" OWS token "=" (token|quoted) ).
 * Returns false when malformed; *name_len gets the coding name's length, *params whether any
 * parameter follows. */
static bool coding_parse(const char *s, size_t n, size_t *name_len, bool *params)
{
	size_t i = 0;
	while (i < n && is_tchar((unsigned char)s[i]))
		i++;
	if (i == 0)
		return false;
	*name_len = i;
	*params = false;
	while (i < n) {
		while (i < n && is_ows(s[i]))
			i++;
		if (i == n || s[i] != ';')
			return false;
		*params = true;
		for (i++; i < n && is_ows(s[i]); i++)
			;
		if (i == n || !is_tchar((unsigned char)s[i]))
			return false;
		while (i < n && is_tchar((unsigned char)s[i]))
			i++;
		if (i == n || s[i] != '=')
			return false;
		i++;
		if (i < n && s[i] == '"') {
			for (i++; i < n && s[i] != '"'; i++)
				if (s[i] == '\\')
					i++;
			if (i >= n)
				return false;
			i++;
		} else {
			size_t st = i;
			while (i < n && is_tchar((unsigned char)s[i]))
				i++;
			if (i == st)
				return false;
		}
	}
	return true;
}

/* Transfer-Encoding value V: accumulate into the parse state; 0 or a callback error. */
static int te_value(struct http_msg *m, const char *v, size_t vn)
{
	struct parse *ps = &m->ps;
	const char *it = v, *elt;
	size_t len, name_len;
	bool params;
	while (list_next(&it, v + vn, &elt, &len)) {
		if (len == 0)
			return cb_fail(m, bad(m), "empty element in Transfer-Encoding");
		if (!coding_parse(elt, len, &name_len, &params))
			return cb_fail(m, bad(m), "malformed Transfer-Encoding");
		if (ieq(elt, name_len, "chunked")) {
			if (params)
				return cb_fail(m, bad(m), "parameters on chunked");
			if (++ps->te_chunked > 1)
				return cb_fail(m, bad(m), "chunked applied twice");
			ps->te_last_chunked = true;
		} else {
			ps->te_other = true;
			ps->te_last_chunked = false;
		}
	}
	return 0;
}

/* Connection value: the options we act on. Listed names are marked hop-by-hop later. */
static void connection_value(struct parse *ps, const char *v, size_t vn)
{
	const char *it = v, *elt;
	size_t len;
	while (list_next(&it, v + vn, &elt, &len)) {
		if (ieq(elt, len, "close"))
			ps->conn_close = true;
		else if (ieq(elt, len, "keep-alive"))
			ps->conn_keepalive = true;
		else if (ieq(elt, len, "upgrade"))
			ps->conn_upgrade = true;
	}
}

/* A complete header line of the head, in hbuf. Returns 0 or a callback error. */
static int header_line(struct http_msg *m, const struct hspan *h)
{
	struct parse *ps = &m->ps;
	const char *name = m->hbuf + h->noff;
	const char *val = m->hbuf + h->voff;
	size_t vn = h->vlen;
	bool req = m->kind == HTTP_REQUEST_KIND;
	enum hname cls = classify(name, h->nlen);
	int64_t cl = 0;
	size_t i;

	while (vn > 0 && is_ows(val[vn - 1]))  /* llhttp strips leading OWS only */
		vn--;
	if (++ps->lines > HTTP_MAX_HEADERS) {
		if (!req)
			return cb_fail(m, 502, "too many header lines");
		if (ps->pend_431 == NULL)
			ps->pend_431 = "more than 100 header lines";
	} else {
		struct hspan *s = &m->hs[ps->lines - 1];
		s->noff = h->noff;
		s->nlen = h->nlen;
		s->voff = h->voff;
		s->vlen = (uint32_t)vn;
		s->cls = (uint8_t)cls;
	}

	switch (cls) {
	case HN_HOST:
		if (!req)
			break;
		if (++ps->host_count > 1)
			return cb_fail(m, 400, "more than one Host");
		if (!host_valid(val, vn))
			return cb_fail(m, 400, "invalid Host");
		ps->host_off = h->voff;
		ps->host_len = vn;
		break;
	case HN_CL:
		if (++ps->cl_count > 1)
			return cb_fail(m, bad(m), "repeated Content-Length");
		if (ps->te_count > 0)
			return cb_fail(m, bad(m), "Content-Length with Transfer-Encoding");
		if (vn == 0)
			return cb_fail(m, bad(m), "empty Content-Length");
		for (i = 0; i < vn; i++) {
			if (!is_digit((unsigned char)val[i]))
				return cb_fail(m, bad(m), "invalid Content-Length");
			if (cl > (INT64_MAX - 9) / 10)
				return cb_fail(m, bad(m), "Content-Length overflow");
			cl = cl * 10 + (val[i] - '0');
		}
		ps->cl = cl;
		break;
	case HN_TE:
		++ps->te_count;
		if (ps->cl_count > 0)
			return cb_fail(m, bad(m), "Transfer-Encoding with Content-Length");
		if (ps->vmaj == 1 && ps->vmin == 0)
			return cb_fail(m, bad(m), "Transfer-Encoding on HTTP/1.0");
		return te_value(m, val, vn);
	case HN_UNDERSCORE:
		return cb_fail(m, bad(m), "Transfer_Encoding or Content_Length");
	case HN_CONNECTION:
		connection_value(ps, val, vn);
		break;
	case HN_UPGRADE:
		/* SPEC §9: h2c is not upgraded to; the request is served over HTTP/1.1 */
		if (!ieq(val, vn, "h2c"))
			ps->has_upgrade = true;
		break;
	case HN_EXPECT:
		if (ieq(val, vn, "100-continue"))
			ps->expect_100 = true;
		break;
	default:
		break;
	}
	return 0;
}

/* ------------------------------------------------------------------ llhttp callbacks */

static int on_url(llhttp_t *p, const char *at, size_t len)
{
	struct http_msg *m = p->data;
	struct parse *ps = &m->ps;
	size_t off = off_of(m, at), i;

	if (!ps->url_seen) {
		if (off != m->msp + 1)
			return cb_fail(m, 400, "more than one space after the method");
		ps->url_seen = true;
		ps->url_off = off;
	} else if (off != ps->url_off + ps->url_len) {
		return cb_fail(m, 400, "request target in pieces");
	}
	for (i = 0; i < len; i++) {
		unsigned char c = (unsigned char)at[i];
		if (c == '#')
			return cb_fail(m, 400, "fragment in request target");
		if (c <= 0x20 || c >= 0x7f)
			return cb_fail(m, 400, "control or non-ASCII byte in request target");
	}
	ps->url_len += len;
	if (ps->url_len > m->lim.max_uri_bytes && ps->pend_414 == NULL)
		ps->pend_414 = "request target longer than max_uri_bytes";
	return 0;
}

static int on_url_complete(llhttp_t *p)
{
	struct http_msg *m = p->data;
	m->ps.url_done = true;
	return 0;
}

static int on_status(llhttp_t *p, const char *at, size_t len)
{
	struct http_msg *m = p->data;
	if (m->ps.reason_len == 0)
		m->ps.reason_off = off_of(m, at);
	m->ps.reason_len += len;
	return 0;
}

static int on_version(llhttp_t *p, const char *at, size_t len)
{
	struct http_msg *m = p->data;
	struct parse *ps = &m->ps;
	size_t off = off_of(m, at);

	if (!ps->ver_seen) {
		/* llhttp skips extra spaces before "HTTP/": the grammar allows exactly one */
		if (m->kind == HTTP_REQUEST_KIND && off != ps->url_off + ps->url_len + 6)
			return cb_fail(m, 400, "more than one space before the version");
		ps->ver_seen = true;
		ps->ver_off = off;
	}
	ps->ver_len += len;
	return 0;
}

static int on_version_complete(llhttp_t *p)
{
	struct http_msg *m = p->data;
	struct parse *ps = &m->ps;

	if (m->vsubst)          /* the real version was recorded before the rewrite */
		return 0;
	ps->vmaj = p->http_major;
	ps->vmin = p->http_minor;
	if (ps->vmaj == 1 && (ps->vmin == 0 || ps->vmin == 1))
		return 0;
	if (m->kind == HTTP_RESPONSE_KIND)
		return cb_fail(m, 502, "unsupported HTTP version");
	if (ps->pend_505 == NULL)
		ps->pend_505 = "unsupported HTTP version";
	return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
	struct http_msg *m = p->data;
	struct parse *ps = &m->ps;
	if (m->state != M_HEAD)         /* a trailer: dropped */
		return 0;
	if (ps->hstate != 1) {
		ps->hstate = 1;
		ps->cur.noff = (uint32_t)off_of(m, at);
		ps->cur.nlen = 0;
		ps->cur.vlen = 0;
	}
	ps->cur.nlen += (uint32_t)len;
	return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
	struct http_msg *m = p->data;
	struct parse *ps = &m->ps;
	if (m->state != M_HEAD)
		return 0;
	if (ps->hstate != 2) {
		ps->hstate = 2;
		ps->cur.voff = (uint32_t)off_of(m, at);
	}
	ps->cur.vlen += (uint32_t)len;
	return 0;
}

static int on_header_value_complete(llhttp_t *p)
{
	struct http_msg *m = p->data;
	struct parse *ps = &m->ps;

	if (m->state != M_HEAD)         /* a trailer: counted by on_header_field_complete */
		return 0;
	if (ps->hstate == 1) {          /* no value span at all: an empty value */
		ps->cur.voff = ps->cur.noff + ps->cur.nlen;
		ps->cur.vlen = 0;
	}
	ps->hstate = 0;
	head_sync(m, ps->cur.voff + ps->cur.vlen);
	return header_line(m, &ps->cur);
}

/* Trailer lines are counted here: llhttp 9.2 does not call on_header_value_complete for
 * them. Head lines are counted by on_header_value_complete. */
static int on_header_field_complete(llhttp_t *p)
{
	struct http_msg *m = p->data;
	if (m->state != M_HEAD && ++m->trailer_lines > HTTP_MAX_HEADERS)
		return cb_fail(m, m->kind == HTTP_REQUEST_KIND ? 431 : 502,
		               "more than 100 trailer lines");
	return 0;
}

static int on_headers_complete(llhttp_t *p)
{
	struct http_msg *m = p->data;
	m->ps.head_done = true;
	return HPE_PAUSED;              /* the body is ours to frame; see finish_*() */
}

static int on_chunk_header(llhttp_t *p)
{
	struct http_msg *m = p->data;
	m->left = p->content_length;
	m->ps.chunk_header = true;
	return HPE_PAUSED;              /* the data is moved by feed_chunked(), not by llhttp */
}

static int on_message_complete(llhttp_t *p)
{
	struct http_msg *m = p->data;
	m->ps.msg_done = true;
	return HPE_PAUSED;              /* never run into the next pipelined message */
}

static const llhttp_settings_t req_settings = {
	.on_url = on_url,
	.on_url_complete = on_url_complete,
	.on_version = on_version,
	.on_header_field = on_header_field,
	.on_header_value = on_header_value,
	.on_headers_complete = on_headers_complete,
	.on_message_complete = on_message_complete,
	.on_version_complete = on_version_complete,
	.on_header_field_complete = on_header_field_complete,
	.on_header_value_complete = on_header_value_complete,
	.on_chunk_header = on_chunk_header,
};

static const llhttp_settings_t resp_settings = {
	.on_status = on_status,
	.on_version = on_version,
	.on_header_field = on_header_field,
	.on_header_value = on_header_value,
	.on_headers_complete = on_headers_complete,
	.on_message_complete = on_message_complete,
	.on_version_complete = on_version_complete,
	.on_header_field_complete = on_header_field_complete,
	.on_header_value_complete = on_header_value_complete,
	.on_chunk_header = on_chunk_header,
};

/* ------------------------------------------------------------------ heads */

int http_method_class(const char *s, size_t n)
{
	static const char *const ok[] = {
		"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH", "PROPFIND",
		"PROPPATCH", "MKCOL", "COPY", "MOVE", "LOCK", "UNLOCK",
	};
	size_t i;
	for (i = 0; i < sizeof ok / sizeof ok[0]; i++)
		if (strlen(ok[i]) == n && memcmp(ok[i], s, n) == 0)
			return METH_OK;
	if (n == 7 && memcmp(s, "CONNECT", 7) == 0)
		return METH_CONNECT;
	return METH_OTHER;
}

/* Execute llhttp over LEN bytes of DATA, which are hbuf offset OFF on; *used gets what it
 * consumed, which is in hbuf on return. hbuf must have room for OFF + LEN. */
static llhttp_errno_t head_exec(struct http_msg *m, const char *data, size_t len, size_t off,
                                size_t *used)
{
	llhttp_errno_t e;
	m->xbase = data;
	m->xoff = off;
	e = llhttp_execute(&m->p, data, len);
	if (e == HPE_OK) {
		*used = len;
	} else {
		const char *pos = llhttp_get_error_pos(&m->p);
		*used = (pos != NULL && pos >= data && pos <= data + len) ? (size_t)(pos - data) : 0;
	}
	head_sync(m, off + *used);
	return e;
}

static void parse_reset(struct http_msg *m)
{
	memset(&m->ps, 0, sizeof m->ps);
	m->ps.cl = -1;
}

/* Request: the method is in hbuf[mstart, msp); start llhttp on it, unless DEFER (the caller
 * executes it with the rest of the head: one llhttp call, not two). A method we don't serve is
 * shown to llhttp as GET (noted 501), so that the rest of the head is still checked. */
static bool begin_request(struct http_msg *m, bool defer)
{
	const char *name = m->hbuf + m->mstart;
	size_t n = m->msp - m->mstart, used;
	int cls = http_method_class(name, n);
	llhttp_errno_t e;

	llhttp_init(&m->p, HTTP_REQUEST, &req_settings);
	m->p.data = m;
	parse_reset(m);
	memcpy(m->head.method, name, min_sz(n, sizeof m->head.method - 1));
	m->head.method[min_sz(n, sizeof m->head.method - 1)] = 0;
	m->is_connect = cls == METH_CONNECT;
	m->is_options = n == 7 && memcmp(name, "OPTIONS", 7) == 0;
	m->msubst = cls == METH_OTHER;
	if (cls == METH_CONNECT)
		m->ps.pend_501 = "CONNECT not implemented";
	else if (cls == METH_OTHER)
		m->ps.pend_501 = "method not implemented";
	m->hphase = HP_PARSE;
	if (m->msubst) {
		m->xbase = "GET ";      /* no span callback fires on the method: never mapped */
		m->xoff = m->msp;
		e = llhttp_execute(&m->p, "GET ", 4);
	} else if (defer) {
		e = HPE_OK;
	} else {
		e = head_exec(m, name, n + 1, m->mstart, &used);
	}
	return e == HPE_OK;
}

/* Request: leading empty lines, then the method token up to its SP, into hbuf. Returns the
 * bytes used and sets *res: 0 need more, 1 method complete, -1 malformed (*detail). */
static size_t pre_scan(struct http_msg *m, const char *d, size_t len, int *res,
                       const char **detail)
{
	size_t i;
	*res = 0;
	for (i = 0; i < len; i++) {
		unsigned char c = (unsigned char)d[i];
		if (m->pre_cr) {
			if (c != '\n') {
				*res = -1;
				*detail = "bare CR before the request line";
				break;
			}
			m->pre_cr = false;
		} else if (!m->in_method) {
			if (c == '\r') {
				m->pre_cr = true;
			} else if (is_tchar(c)) {
				m->in_method = true;
				m->mstart = m->hlen + i;
			} else {
				*res = -1;
				*detail = c == '\n' ? "bare LF before the request line" : "invalid method";
				break;
			}
		} else if (c == ' ') {
			m->msp = m->hlen + i;
			*res = 1;
			i++;
			break;
		} else if (!is_tchar(c)) {
			*res = -1;
			*detail = "invalid method or request line";
			break;
		}
	}
	memcpy(m->hbuf + m->hlen, d, i);
	m->hlen += i;
	return i;
}

/* The request version at ver_off is "HTTP/" DIGIT "." DIGIT, ending at hbuf offset END. */
static bool version_wellformed(const struct http_msg *m, size_t end)
{
	const struct parse *ps = &m->ps;
	const char *v = m->hbuf + ps->ver_off;
	return ps->ver_seen && ps->ver_len == 3 && end == ps->ver_off + 3 && ps->ver_off >= 5 &&
	       memcmp(v - 5, "HTTP/", 5) == 0 && is_digit((unsigned char)v[0]) && v[1] == '.' &&
	       is_digit((unsigned char)v[2]);
}

/* llhttp refused a well-formed version it doesn't know: note 505, rewrite it to 1.1 and parse
 * the request line again, so the rest of the head is still checked for a 400. */
static bool version_rewrite(struct http_msg *m)
{
	size_t voff = m->ps.ver_off, start = m->msp + 1, used;
	int vmaj = m->hbuf[voff] - '0', vmin = m->hbuf[voff + 2] - '0';
	memcpy(m->hbuf + voff, "1.1", 3);
	m->vsubst = true;
	if (!begin_request(m, false))
		return false;
	m->ps.vmaj = vmaj;
	m->ps.vmin = vmin;
	m->ps.pend_505 = "unsupported HTTP version";
	return head_exec(m, m->hbuf + start, m->hlen - start, start, &used) == HPE_OK &&
	       used == m->hlen - start;
}

/* Request: the target ended at a CR (no " HTTP/x.y"), which llhttp reads as an HTTP/0.9
 * request line and then waits for header lines: the head can only be refused, so now. The
 * target's span has ended once a byte after it was consumed (url_done is not set on this
 * path: llhttp completes the URL only before a version). */
static bool version_missing(const struct http_msg *m)
{
	size_t end = m->ps.url_off + m->ps.url_len;
	return m->kind == HTTP_REQUEST_KIND && m->ps.url_seen && !m->ps.ver_seen &&
	       end < m->hlen && (m->hbuf[end] == '\r' || m->hbuf[end] == '\n');
}

/* The request target: form, Host agreement; sets path. NULL or the 400 detail. */
static const char *check_target(struct http_msg *m)
{
	struct parse *ps = &m->ps;
	const char *t = m->hbuf + ps->url_off, *auth, *rest, *end;
	size_t n = ps->url_len, alen;
	long defport;

	if (!ps->url_seen || n == 0)
		return "missing request target";
	if (m->is_connect)              /* authority-form; refused with 501 */
		return NULL;
	if (n == 1 && t[0] == '*') {
		if (!m->is_options)
			return "* target for a method other than OPTIONS";
		m->path_static = "*";
		m->path_len = 1;
		return NULL;
	}
	if (t[0] == '/') {
		m->path_off = ps->url_off;
		m->path_len = n;
		return NULL;
	}
	if (n > 7 && ieq(t, 7, "http://")) {
		auth = t + 7;
		defport = 80;
	} else if (n > 8 && ieq(t, 8, "https://")) {
		auth = t + 8;
		defport = 443;
	} else {
		return "request target is not origin-form nor http(s) absolute-form";
	}
	end = t + n;
	for (rest = auth; rest < end && *rest != '/' && *rest != '?'; rest++)
		if (*rest == '@')
			return "userinfo in request target";
	alen = (size_t)(rest - auth);
	if (alen == 0 || !host_valid(auth, alen))
		return "invalid authority in request target";
	if (ps->host_count == 1 &&
	    !authority_eq(auth, alen, m->hbuf + ps->host_off, ps->host_len, defport))
		return "target authority differs from Host";
	if (ps->host_count == 0) {      /* HTTP/1.0 without Host: the authority names the host */
		ps->host_off = (size_t)(auth - m->hbuf);
		ps->host_len = alen;
	}
	if (rest == end) {
		m->path_static = "/";
		m->path_len = 1;
	} else if (*rest == '?') {      /* "/" + query, kept after the head in hbuf */
		size_t qlen = (size_t)(end - rest), qoff = (size_t)(rest - m->hbuf);
		hbuf_reserve(m, m->hlen + 1 + qlen);
		m->hbuf[m->hlen] = '/';
		memcpy(m->hbuf + m->hlen + 1, m->hbuf + qoff, qlen);
		m->path_off = m->hlen;
		m->path_len = qlen + 1;
	} else {
		m->path_off = (size_t)(rest - m->hbuf);
		m->path_len = (size_t)(end - rest);
	}
	return NULL;
}

/* Fill the public head from the parse state (hbuf no longer moves until http_msg_next). */
static void build_head(struct http_msg *m)
{
	struct parse *ps = &m->ps;
	struct http_head *h = &m->head;
	int i, j, n = ps->lines < HTTP_MAX_HEADERS ? ps->lines : HTTP_MAX_HEADERS;

	for (i = 0; i < n; i++) {
		const struct hspan *s = &m->hs[i];
		m->hdrs[i].name = m->hbuf + s->noff;
		m->hdrs[i].nlen = s->nlen;
		m->hdrs[i].value = m->hbuf + s->voff;
		m->hdrs[i].vlen = s->vlen;
		m->hdrs[i].hop = hop_class((enum hname)s->cls);
	}
	/* names listed in Connection are hop-by-hop too */
	for (j = 0; j < n; j++) {
		const char *it, *end, *elt;
		size_t len;
		if (m->hs[j].cls != HN_CONNECTION)
			continue;
		it = m->hdrs[j].value;
		end = it + m->hdrs[j].vlen;
		while (list_next(&it, end, &elt, &len))
			for (i = 0; len > 0 && i < n; i++)
				if (ieqn(m->hdrs[i].name, m->hdrs[i].nlen, elt, len))
					m->hdrs[i].hop = true;
	}
	h->hdrs = m->hdrs;
	h->nhdrs = n;
	h->version = ps->vmin == 0 ? 10 : 11;
	h->content_length = ps->cl_count > 0 ? ps->cl : -1;
	h->chunked = ps->te_count > 0;
	h->upgrade = ps->conn_upgrade && ps->has_upgrade;
	if (h->version == 11)
		h->keep_alive = !ps->conn_close;
	else
		h->keep_alive = ps->conn_keepalive && !ps->conn_close;
	m->head_size = m->hlen;
}

static enum http_event finish_request(struct http_msg *m)
{
	struct parse *ps = &m->ps;
	struct http_head *h = &m->head;
	const char *d;
	bool chunked = ps->te_count > 0;

	/* 400 first */
	if (!ps->ver_seen)
		return fail(m, 400, "request line without HTTP version");
	if ((d = check_target(m)) != NULL)
		return fail(m, 400, d);
	if (ps->host_count == 0 && ps->vmaj == 1 && ps->vmin == 1)
		return fail(m, 400, "missing Host");
	if (ps->host_count == 1 && ps->host_len == 0)
		return fail(m, 400, "empty Host");
	if (ps->te_count > 0 && !ps->te_last_chunked)
		return fail(m, 400, "Transfer-Encoding not ending in chunked");
	/* our reading of the framing must be llhttp's, which frames the chunks */
	if (chunked != ((m->p.flags & F_CHUNKED) != 0) ||
	    (ps->cl_count > 0) != ((m->p.flags & F_CONTENT_LENGTH) != 0))
		return fail(m, 400, "ambiguous message framing");
	/* then 414, 431 */
	if (ps->pend_414)
		return fail(m, 414, ps->pend_414);
	if (m->hlen > m->lim.max_header_bytes)
		return fail(m, 431, "head larger than max_header_bytes");
	if (ps->pend_431)
		return fail(m, 431, ps->pend_431);
	/* then 501, 505 */
	if (ps->pend_501)
		return fail(m, 501, ps->pend_501);
	if (ps->te_other)
		return fail(m, 501, "transfer-coding other than chunked");
	if (ps->pend_505)
		return fail(m, 505, ps->pend_505);

	build_head(m);
	h->method_head = strcmp(h->method, "HEAD") == 0;
	h->target = m->hbuf + ps->url_off;
	h->target_len = ps->url_len;
	h->path = m->path_static ? m->path_static : m->hbuf + m->path_off;
	h->path_len = m->path_len;
	h->host = ps->host_len > 0 ? m->hbuf + ps->host_off : (ps->host_count ? "" : NULL);
	h->host_len = ps->host_len;
	h->expect_continue = ps->expect_100 && h->version == 11;
	if (chunked) {
		llhttp_resume(&m->p);
		m->state = M_CHUNK_FRAME;
		m->first_chunk = true;
	} else if (ps->cl > 0) {
		m->left = (uint64_t)ps->cl;
		m->state = M_BODY_CL;
	} else {
		m->state = M_NOBODY;
	}
	return HTTP_HEAD;
}

static enum http_event finish_response(struct http_msg *m)
{
	struct parse *ps = &m->ps;
	struct http_head *h = &m->head;
	int status = m->p.status_code;
	bool chunked = ps->te_count > 0;
	size_t i;

	if (status < 100 || status > 599)
		return fail(m, 502, "status code out of range");
	for (i = 0; i < ps->reason_len; i++) {
		unsigned char c = (unsigned char)m->hbuf[ps->reason_off + i];
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return fail(m, 502, "control byte in reason phrase");
	}
	if (ps->te_count > 0 && !ps->te_last_chunked)
		return fail(m, 502, "Transfer-Encoding not ending in chunked");
	if (ps->te_other)       /* we forward no transfer-coding but chunked */
		return fail(m, 502, "transfer-coding other than chunked");
	if (chunked != ((m->p.flags & F_CHUNKED) != 0) ||
	    (ps->cl_count > 0) != ((m->p.flags & F_CONTENT_LENGTH) != 0))
		return fail(m, 502, "ambiguous message framing");
	if (status == 204 && (chunked || (ps->cl_count > 0 && ps->cl != 0)))
		return fail(m, 502, "204 with a body");
	/* a 304 may carry the Content-Length of the 200 it stands for (RFC 9110 §8.6) */
	if (status == 304 && chunked)
		return fail(m, 502, "304 with Transfer-Encoding");

	build_head(m);
	h->status = status;
	h->reason = m->hbuf + ps->reason_off;
	h->reason_len = ps->reason_len;
	if (status < 200 || status == 204 || status == 304 || m->expect_head) {
		m->state = status < 200 ? M_DONE : M_NOBODY;
	} else if (chunked) {
		llhttp_resume(&m->p);
		m->state = M_CHUNK_FRAME;
		m->first_chunk = true;
	} else if (ps->cl_count > 0) {
		m->left = (uint64_t)ps->cl;
		m->state = ps->cl > 0 ? M_BODY_CL : M_NOBODY;
	} else {
		h->body_until_close = true;
		h->keep_alive = false;
		m->state = M_BODY_EOF;
	}
	return HTTP_HEAD;
}

/* The head passed max_header_bytes before it ended, with no 400 in what was received. Still
 * inside the request target, it is the target that does not fit: 414, as nginx answers. */
static enum http_event head_too_big(struct http_msg *m)
{
	if (m->kind == HTTP_RESPONSE_KIND)
		return fail(m, 502, "response head too large");
	if (m->ps.pend_414)
		return fail(m, 414, m->ps.pend_414);
	if (m->hphase != HP_PRE && m->ps.url_seen && !m->ps.url_done)
		return fail(m, 414, "request target does not fit in max_header_bytes");
	return fail(m, 431, "head larger than max_header_bytes");
}

/* Where head bytes come from: the caller's evbuffer, or bytes just read (http_msg_take). */
struct hsrc {
	struct evbuffer *in;            /* NULL: P, N */
	const char *p;
	size_t n;
};

static bool src_peek(struct hsrc *src, struct evbuffer_iovec *v)
{
	if (src->in)
		return peek_first(src->in, v);
	v->iov_base = (void *)(uintptr_t)src->p;
	v->iov_len = src->n;
	return src->n > 0;
}

static void src_drain(struct hsrc *src, size_t n)
{
	if (src->in) {
		evbuffer_drain(src->in, n);
	} else {
		src->p += n;
		src->n -= n;
	}
}

static enum http_event feed_head(struct http_msg *m, struct hsrc *in)
{
	for (;;) {
		struct evbuffer_iovec v;
		const char *data, *detail = NULL;
		size_t len, used = 0, pre = 0, h0 = m->hlen;
		llhttp_errno_t e = HPE_OK;
		int res;

		if (m->hlen > m->lim.max_header_bytes)
			return head_too_big(m);
		if (!src_peek(in, &v))
			return HTTP_NEED_MORE;
		data = v.iov_base;
		len = min_sz(v.iov_len, m->lim.max_header_bytes + 1 - m->hlen);
		hbuf_reserve(m, m->hlen + len);

		switch (m->hphase) {
		case HP_PRE:
			/* the method and what follows it in this chain are parsed in one go */
			pre = pre_scan(m, data, len, &res, &detail);
			if (res < 0)
				return fail(m, 400, detail);
			if (res == 0 || pre == len) {
				if (res > 0 && !begin_request(m, false))
					return fail(m, 400, "request line refused");
				src_drain(in, pre);
				continue;
			}
			/* the method is in this chain: llhttp reads it and the rest in one call, from
			 * the method's first byte (in hbuf already); not a substituted one */
			if (!begin_request(m, m->mstart >= h0))
				return fail(m, 400, "request line refused");
			if (m->mstart >= h0 && !m->msubst) {
				pre = m->mstart - h0;
				e = head_exec(m, data + pre, len - pre, m->mstart, &used);
			} else {
				e = head_exec(m, data + pre, len - pre, m->hlen, &used);
			}
			break;
		case HP_VERSION:
			if (data[0] != '\r')
				return fail(m, 400, "malformed HTTP version");
			if (!version_rewrite(m))
				return fail(m, 400, "request line refused");
			continue;
		case HP_PARSE:
			e = head_exec(m, data, len, m->hlen, &used);
			break;
		}
		src_drain(in, pre + used);
		/* llhttp reports our callbacks' refusals under several codes (HPE_USER,
		 * HPE_CB_HEADER_VALUE_COMPLETE, ...): the verdict they left is what counts */
		if (m->ps.cb_status != 0)
			return fail(m, m->ps.cb_status, m->ps.cb_detail);
		switch (e) {
		case HPE_OK:
			if (version_missing(m))
				return fail(m, 400, "request line without HTTP version");
			continue;
		case HPE_PAUSED:
			if (!m->ps.head_done)
				return fail(m, bad(m), "parser paused inside a head");
			return m->kind == HTTP_REQUEST_KIND ? finish_request(m) : finish_response(m);
		case HPE_INVALID_VERSION:
			/* a second refusal after the rewrite would loop: malformed it is */
			if (m->kind == HTTP_RESPONSE_KIND || m->vsubst ||
			    !version_wellformed(m, m->hlen))
				return fail(m, bad(m), "malformed HTTP version");
			if (pre + used == len) {        /* is the next byte the CR? wait for it */
				m->hphase = HP_VERSION;
				continue;
			}
			if (data[pre + used] != '\r')
				return fail(m, 400, "malformed HTTP version");
			if (!version_rewrite(m))
				return fail(m, 400, "request line refused");
			continue;
		default:
			return fail(m, bad(m), llhttp_get_error_reason(&m->p));
		}
	}
}

/* ------------------------------------------------------------------ bodies */

/* Move N bytes of IN (available) to OUT. */
static void move_body(struct evbuffer *in, struct evbuffer *out, size_t n)
{
	if (evbuffer_remove_buffer(in, out, n) != (int)n)
		abort();        /* n was available: libevent broke its contract */
}

static enum http_event feed_cl(struct http_msg *m, struct evbuffer *in, struct evbuffer *out,
                               size_t max)
{
	size_t n;
	if (m->left == 0) {
		m->state = M_DONE;
		return HTTP_DONE;
	}
	n = min_sz(min_sz(evbuffer_get_length(in), max), BODY_STEP);
	if (m->left < n)
		n = (size_t)m->left;
	if (n == 0)
		return HTTP_NEED_MORE;
	move_body(in, out, n);
	m->left -= n;
	return HTTP_BODY;
}

/* Chunk data: show up to MAX bytes to llhttp (it only counts them) and move them to OUT. */
static enum http_event chunk_data(struct http_msg *m, struct evbuffer *in, struct evbuffer *out,
                                  size_t max)
{
	struct evbuffer_iovec v[PEEK_VECS];
	size_t n = min_sz(min_sz(evbuffer_get_length(in), max), BODY_STEP), done = 0;
	int i, nv;

	if (m->left < n)
		n = (size_t)m->left;
	if (n == 0)
		return HTTP_NEED_MORE;
	nv = evbuffer_peek(in, (ev_ssize_t)n, NULL, v, PEEK_VECS);
	if (nv > PEEK_VECS)
		nv = PEEK_VECS;
	for (i = 0; i < nv && done < n; i++) {
		size_t len = min_sz(v[i].iov_len, n - done);
		if (llhttp_execute(&m->p, v[i].iov_base, len) != HPE_OK)
			return fail(m, bad(m), "chunk data refused");
		done += len;
	}
	move_body(in, out, done);
	m->left -= done;
	if (m->left == 0) {
		m->state = M_CHUNK_FRAME;
		m->frame_bytes = 0;
		m->first_chunk = false;
	}
	return HTTP_BODY;
}

/* Framing: a chunk line (size, extensions) with the CRLF ending the previous chunk's data, or
 * the trailer section. Bounded: HTTP_MAX_CHUNK_LINE per line, max_header_bytes of trailers. */
static enum http_event feed_chunked(struct http_msg *m, struct evbuffer *in,
                                    struct evbuffer *out, size_t max)
{
	for (;;) {
		struct evbuffer_iovec v;
		size_t slack, bound, count, len, used;
		const char *pos;
		llhttp_errno_t e;

		if (m->state == M_CHUNK_DATA)
			return chunk_data(m, in, out, max);
		if (!peek_first(in, &v))
			return HTTP_NEED_MORE;
		slack = m->first_chunk ? 2 : 4;         /* CRLF ending the line, and the data */
		bound = m->in_trailers ? m->lim.max_header_bytes : HTTP_MAX_CHUNK_LINE + slack;
		count = m->in_trailers ? m->trailer_bytes : m->frame_bytes;
		len = min_sz(v.iov_len, bound + 1 - count);

		m->xbase = v.iov_base;
		m->xoff = 0;
		e = llhttp_execute(&m->p, v.iov_base, len);
		pos = llhttp_get_error_pos(&m->p);
		used = (e == HPE_OK || pos == NULL) ? len : (size_t)(pos - (const char *)v.iov_base);
		evbuffer_drain(in, used);
		count += used;
		if (m->in_trailers)
			m->trailer_bytes = count;
		else
			m->frame_bytes = count;

		if (m->ps.cb_status != 0)
			return fail(m, m->ps.cb_status, m->ps.cb_detail);
		if (e == HPE_PAUSED || e == HPE_PAUSED_UPGRADE) {
			if (m->ps.msg_done) {
				m->state = M_DONE;
				return HTTP_DONE;
			}
			if (e != HPE_PAUSED || !m->ps.chunk_header)
				return fail(m, bad(m), "parser paused inside a body");
			llhttp_resume(&m->p);
			m->ps.chunk_header = false;
			if (m->frame_bytes - slack > HTTP_MAX_CHUNK_LINE)
				return fail(m, bad(m), "chunk line too long");
			if (m->left == 0)
				m->in_trailers = true;
			else
				m->state = M_CHUNK_DATA;
			continue;
		}
		if (e != HPE_OK)
			return fail(m, bad(m), llhttp_get_error_reason(&m->p));
		if (count > bound) {
			if (m->in_trailers)
				return fail(m, m->kind == HTTP_REQUEST_KIND ? 431 : 502,
				            "trailer section too large");
			return fail(m, bad(m), "chunk line too long");
		}
	}
}

/* ------------------------------------------------------------------ API */

static void msg_start(struct http_msg *m)
{
	m->state = M_HEAD;
	m->head_taken = false;
	m->hlen = 0;
	m->head_size = 0;
	m->pre_cr = m->in_method = m->msubst = m->vsubst = false;
	m->is_connect = m->is_options = false;
	m->mstart = m->msp = 0;
	m->left = 0;
	m->frame_bytes = m->trailer_bytes = 0;
	m->trailer_lines = 0;
	m->first_chunk = m->in_trailers = false;
	m->err_status = 0;
	m->err_reason = m->err_detail = NULL;
	m->path_static = NULL;
	m->path_off = m->path_len = 0;
	memset(&m->head, 0, sizeof m->head);
	m->head.content_length = -1;
	parse_reset(m);
	if (m->kind == HTTP_REQUEST_KIND) {
		m->hphase = HP_PRE;
	} else {
		m->hphase = HP_PARSE;
		llhttp_init(&m->p, HTTP_RESPONSE, &resp_settings);
		m->p.data = m;
	}
}

struct http_msg *http_msg_new(enum http_kind kind, const struct http_limits *lim)
{
	struct http_msg *m = calloc(1, sizeof *m);
	if (m == NULL)
		abort();
	m->kind = kind;
	if (lim != NULL)
		m->lim = *lim;
	if (m->lim.max_header_bytes == 0)
		m->lim.max_header_bytes = DEFAULT_MAX_HEADER_BYTES;
	if (m->lim.max_uri_bytes == 0)
		m->lim.max_uri_bytes = DEFAULT_MAX_URI_BYTES;
	/* hs[] offsets are 32-bit */
	if (m->lim.max_header_bytes > UINT32_MAX / 2)
		m->lim.max_header_bytes = UINT32_MAX / 2;
	/* SPEC §2: the smaller limit governs, so a target too long for the head is a 414 */
	if (m->lim.max_uri_bytes > m->lim.max_header_bytes)
		m->lim.max_uri_bytes = m->lim.max_header_bytes;
	msg_start(m);
	return m;
}

void http_msg_free(struct http_msg *m)
{
	if (m == NULL)
		return;
	free(m->hbuf);
	free(m);
}

void http_msg_expect(struct http_msg *m, bool request_was_head)
{
	m->expect_head = request_was_head;
}

enum http_event http_msg_feed(struct http_msg *m, struct evbuffer *in,
                              struct evbuffer *body_out, size_t body_max)
{
	size_t n;
	if (m->head_taken) {
		m->head_taken = false;
		return HTTP_HEAD;
	}
	switch (m->state) {
	case M_HEAD: {
		struct hsrc src = { .in = in };
		return feed_head(m, &src);
	}
	case M_NOBODY:
		m->state = M_DONE;
		return HTTP_DONE;
	case M_BODY_CL:
		return feed_cl(m, in, body_out, body_max);
	case M_CHUNK_FRAME:
	case M_CHUNK_DATA:
		return feed_chunked(m, in, body_out, body_max);
	case M_BODY_EOF:
		n = min_sz(min_sz(evbuffer_get_length(in), body_max), BODY_STEP);
		if (n == 0)
			return HTTP_NEED_MORE;
		move_body(in, body_out, n);
		return HTTP_BODY;
	case M_DONE:
		return HTTP_DONE;
	case M_ERROR:
		break;
	}
	return HTTP_ERROR;
}

size_t http_msg_take(struct http_msg *m, const char *data, size_t len)
{
	if (m->state != M_HEAD)
		return 0;
	struct hsrc src = { .p = data, .n = len };
	if (feed_head(m, &src) == HTTP_HEAD)
		m->head_taken = true;
	return len - src.n;
}

enum http_event http_msg_eof(struct http_msg *m)
{
	switch (m->state) {
	case M_HEAD:
		if (m->kind == HTTP_REQUEST_KIND ? !m->in_method : m->hlen == 0)
			return HTTP_NEED_MORE;
		return fail(m, bad(m), "connection closed inside a head");
	case M_NOBODY:
	case M_BODY_EOF:
		m->state = M_DONE;
		return HTTP_DONE;
	case M_BODY_CL:
		if (m->left == 0) {
			m->state = M_DONE;
			return HTTP_DONE;
		}
		return fail(m, bad(m), "connection closed inside a body");
	case M_CHUNK_FRAME:
	case M_CHUNK_DATA:
		return fail(m, bad(m), "connection closed inside a body");
	case M_DONE:
		return HTTP_NEED_MORE;
	case M_ERROR:
		break;
	}
	return HTTP_ERROR;
}

void http_msg_next(struct http_msg *m)
{
	msg_start(m);
}

const struct http_head *http_msg_head(const struct http_msg *m)
{
	return &m->head;
}

size_t http_msg_head_bytes(const struct http_msg *m)
{
	return m->state == M_HEAD ? m->hlen : m->head_size;
}

void http_msg_error(const struct http_msg *m, int *status, const char **reason,
                    const char **detail)
{
	if (status)
		*status = m->err_status;
	if (reason)
		*reason = m->err_reason;
	if (detail)
		*detail = m->err_detail;
}

const char *http_head_get(const struct http_head *h, const char *name, size_t *len)
{
	size_t n = strlen(name);
	int i;
	for (i = 0; i < h->nhdrs; i++) {
		if (ieqn(h->hdrs[i].name, h->hdrs[i].nlen, name, n)) {
			if (len)
				*len = h->hdrs[i].vlen;
			return h->hdrs[i].value;
		}
	}
	return NULL;
}

int http_head_count(const struct http_head *h, const char *name)
{
	size_t n = strlen(name);
	int i, c = 0;
	for (i = 0; i < h->nhdrs; i++)
		if (ieqn(h->hdrs[i].name, h->hdrs[i].nlen, name, n))
			c++;
	return c;
}
