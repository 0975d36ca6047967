/*
 * config: the YAML policy of SPEC §2 loaded into an immutable struct config.
 *
 * Loading has two passes. (1) libyaml's event API builds a small node tree in which every
 * node keeps its mark (1-based line and column); an alias becomes a second reference to the
 * anchored node. (2) The schema walks the tree: one table of `struct key` per mapping level
 * gives each key's name, type, field offset, default (YAML text, loaded by the same code as the
 * file) and accepted range; a level's `check` then applies the rules that span several keys.
 * Every error is collected with its mark and path, sorted by position and printed at the end.
 * The same tables drive config_to_json(), config_schema_keys() and the free, so adding a key
 * is one line in one table (plus its line in conf/retrygate.yaml, which a test enforces).
 *
 * Invariants of a config that config_load() returned (consumers rely on them):
 *  - at least one listener; each has a literal IP:port, unique among listeners and the admin
 *    address, a unique name (default: its address) and at least one route;
 *  - every route's upstream points into config->upstreams; host is NULL (any) or lower-case,
 *    either a name, "*.suffix" or "[v6]"; path_prefix starts with "/";
 *  - every upstream has at least one endpoint "host:port" with port 1-65535;
 *  - every timeout is > 0 (drain_timeout, backoff and retry_after.max may be 0), every
 *    duration <= 365 days, so adding two to a monotonic clock cannot overflow;
 *    deadline.min < deadline.default <= deadline.max; backoff.base <= backoff.max;
 *  - retry.max_attempts 1-100; budget.ratio and min_per_second >= 0; max_tokens >= 1;
 *  - max_retries_in_flight <= max_in_flight and max_uri_bytes <= max_header_bytes (the smaller
 *    governs: the loader clamps and records a warning when the larger was written);
 *  - idempotency.store is "memory" (store_host NULL) or a decoded redis URL.
 */
#include "config.h"
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#define MAX_DEPTH       64          /* YAML nesting; the schema itself is 7 deep */
#define MAX_WEIGHT      200000      /* nodes with aliases expanded ("billion laughs" bound) */
#define MAX_ANCHORS     1000
#define MAX_ERRORS      200         /* past this the rest are counted, not printed */
#define MAX_FILE_BYTES  (16 << 20)
#define MAX_TABLE_KEYS  24
#define DUR_MAX         (8760LL * 3600 * 1000000)     /* 365 days */
#define KiB             1024LL
#define MiB             (1024LL * KiB)
#define GiB             (1024LL * MiB)
#define HOST_MAX        256

/* ------------------------------------------------------------------ growing strings */

struct strbuf {
	char *s;
	size_t len, cap;
};

static void sb_putn(struct strbuf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		b->cap = (b->len + n + 1) * 2;
		b->s = xrealloc(b->s, b->cap);
	}
	memcpy(b->s + b->len, s, n);
	b->len += n;
	b->s[b->len] = '\0';
}

static void sb_puts(struct strbuf *b, const char *s)
{
	sb_putn(b, s, strlen(s));
}

static void sb_vprintf(struct strbuf *b, const char *fmt, va_list ap)
	__attribute__((format(printf, 2, 0)));
static void sb_vprintf(struct strbuf *b, const char *fmt, va_list ap)
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

static void sb_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct strbuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	sb_vprintf(b, fmt, ap);
	va_end(ap);
}

/* A user's value inside a message: quoted, escaped, shortened; never a raw control byte. */
static const char *quote(const char *s, char *buf, size_t cap)
{
	size_t o = 0, i;

	buf[o++] = '"';
	for (i = 0; s[i] && o + 8 < cap; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"' || c == '\\')
			o += (size_t)snprintf(buf + o, cap - o, "\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
		else
			buf[o++] = (char)c;
	}
	if (s[i])
		o += (size_t)snprintf(buf + o, cap - o, "...");
	snprintf(buf + o, cap - o, "\"");
	return buf;
}

/* ------------------------------------------------------------------ the load context */

struct msg {
	int line, col, seq;
	char *text;
};

struct load {
	const char *file;
	struct config *c;
	struct msg *errs;
	int nerrs, caperrs, dropped;
	struct strbuf path;         /* "listeners[0].routes[1].upstream" while inside it */
	bool in_default;            /* loading a table default: an error is a bug in this file */
	/* during a block's check: which of its keys failed to load, so that cross-key rules
	 * do not pile a second, confusing error onto the first */
	const struct key *check_keys;
	const bool *check_bad;
};

static void load_verror(struct load *ld, int line, int col, const char *fmt, va_list ap)
	__attribute__((format(printf, 4, 0)));
static void load_verror(struct load *ld, int line, int col, const char *fmt, va_list ap)
{
	struct strbuf t = { 0 };

	if (ld->in_default) {
		/* the tables' defaults are loaded by the same code; this cannot pass the unit tests */
		vfprintf(stderr, fmt, ap);
		fprintf(stderr, "\nretrygate: bug: default of %s does not load\n", ld->path.s);
		abort();
	}
	if (ld->nerrs >= MAX_ERRORS) {
		ld->dropped++;
		return;
	}
	sb_printf(&t, "%s:%d:%d: ", ld->file, line, col);
	if (ld->path.len)
		sb_printf(&t, "%s: ", ld->path.s);
	sb_vprintf(&t, fmt, ap);
	if (ld->nerrs == ld->caperrs) {
		ld->caperrs = ld->caperrs ? ld->caperrs * 2 : 16;
		ld->errs = xrealloc(ld->errs, (size_t)ld->caperrs * sizeof *ld->errs);
	}
	ld->errs[ld->nerrs] = (struct msg){ line, col, ld->nerrs, t.s };
	ld->nerrs++;
}

static void load_error(struct load *ld, int line, int col, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void load_error(struct load *ld, int line, int col, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	load_verror(ld, line, col, fmt, ap);
	va_end(ap);
}

static void load_warn(struct load *ld, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void load_warn(struct load *ld, const char *fmt, ...)
{
	struct strbuf t = { 0 };
	struct config *c = ld->c;
	va_list ap;

	sb_printf(&t, "%s: ", ld->path.s);
	va_start(ap, fmt);
	sb_vprintf(&t, fmt, ap);
	va_end(ap);
	c->warnings = xrealloc(c->warnings, (size_t)(c->nwarnings + 1) * sizeof *c->warnings);
	c->warnings[c->nwarnings++] = t.s;
}

/* Appends ".name" (or "name" at the top) to the path; returns the length to restore. */
static size_t path_push(struct load *ld, const char *name)
{
	size_t old = ld->path.len;
	if (old)
		sb_putn(&ld->path, ".", 1);
	sb_puts(&ld->path, name);
	return old;
}

static size_t path_push_index(struct load *ld, int i)
{
	size_t old = ld->path.len;
	sb_printf(&ld->path, "[%d]", i);
	return old;
}

static void path_pop(struct load *ld, size_t old)
{
	ld->path.len = old;
	if (ld->path.s)
		ld->path.s[old] = '\0';
}

static int msg_cmp(const void *a, const void *b)
{
	const struct msg *x = a, *y = b;
	if (x->line != y->line)
		return x->line < y->line ? -1 : 1;
	if (x->col != y->col)
		return x->col < y->col ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* ------------------------------------------------------------------ the YAML node tree */

enum node_kind { N_SCALAR, N_SEQ, N_MAP };

struct node {
	enum node_kind kind;
	bool plain;                 /* untagged plain scalar: may be null, a boolean, a number */
	int line, col;              /* 1-based */
	char *str;                  /* scalar text, NUL-terminated */
	size_t len;
	struct node **kids;         /* sequence items; mapping: key, value, key, value, ... */
	int nkids, capkids;
	size_t weight;              /* nodes in this subtree with aliases expanded, saturated */
	char *anchor;               /* while open; registered when the node is complete */
	struct node *all_next;      /* every node of the tree, for the free */
};

struct anchor {
	char *name;
	struct node *node;
};

struct tree {
	struct node *root, *all;
	struct anchor *anchors;
	int nanchors;
};

static struct node *node_new(struct tree *t, enum node_kind kind, yaml_mark_t m)
{
	struct node *n = xcalloc(1, sizeof *n);
	n->kind = kind;
	n->line = (int)m.line + 1;
	n->col = (int)m.column + 1;
	n->weight = 1;
	n->all_next = t->all;
	t->all = n;
	return n;
}

static void node_add(struct node *parent, struct node *kid)
{
	if (parent->nkids == parent->capkids) {
		parent->capkids = parent->capkids ? parent->capkids * 2 : 4;
		parent->kids = xrealloc(parent->kids, (size_t)parent->capkids * sizeof *parent->kids);
	}
	parent->kids[parent->nkids++] = kid;
}

static void tree_free(struct tree *t)
{
	struct node *n = t->all, *next;
	for (; n; n = next) {
		next = n->all_next;
		free(n->str);
		free(n->kids);
		free(n->anchor);
		free(n);
	}
	for (int i = 0; i < t->nanchors; i++)
		free(t->anchors[i].name);
	free(t->anchors);
	memset(t, 0, sizeof *t);
}

/* A node is complete: its weight is known and its anchor, if any, becomes usable. Anchors are
 * registered only now, so an alias can never point at one of its own ancestors (no cycles). */
static bool tree_close_node(struct load *ld, struct tree *t, struct node *n)
{
	if (n->kind != N_SCALAR) {
		size_t w = 1;
		for (int i = 0; i < n->nkids && w <= MAX_WEIGHT; i++)
			w += n->kids[i]->weight;
		n->weight = w > MAX_WEIGHT ? MAX_WEIGHT + 1 : w;
	}
	if (!n->anchor)
		return true;
	if (t->nanchors == MAX_ANCHORS) {
		load_error(ld, n->line, n->col, "too many anchors (expected at most %d)", MAX_ANCHORS);
		return false;
	}
	t->anchors = xrealloc(t->anchors, (size_t)(t->nanchors + 1) * sizeof *t->anchors);
	t->anchors[t->nanchors++] = (struct anchor){ n->anchor, n };
	n->anchor = NULL;
	return true;
}

static void report_yaml_error(struct load *ld, const yaml_parser_t *p, const char *data, size_t len)
{
	int line = (int)p->problem_mark.line + 1, col = (int)p->problem_mark.column + 1;
	const char *what = p->problem ? p->problem : "cannot parse";

	if (p->error == YAML_READER_ERROR) {
		/* the reader reports a byte offset, not a mark */
		size_t off = p->problem_offset < len ? p->problem_offset : len;
		line = 1;
		col = 1;
		for (size_t i = 0; i < off; i++, col++)
			if (data[i] == '\n') {
				line++;
				col = 0;
			}
		load_error(ld, line, col, "YAML: %s (expected UTF-8 text without control characters)",
		           what);
	} else if (p->context)
		load_error(ld, line, col, "YAML: %s (%s at line %d column %d)", what, p->context,
		           (int)p->context_mark.line + 1, (int)p->context_mark.column + 1);
	else
		load_error(ld, line, col, "YAML: %s", what);
}

static struct node *tree_find_anchor(struct tree *t, const char *name)
{
	for (int i = t->nanchors - 1; i >= 0; i--)
		if (strcmp(t->anchors[i].name, name) == 0)
			return t->anchors[i].node;
	return NULL;
}

/* Builds T from DATA. On a syntax or structure error, reports it and returns false (the tree
 * may be partial and is still the caller's to free). */
static bool tree_parse(struct load *ld, struct tree *t, const char *data, size_t len)
{
	yaml_parser_t p;
	yaml_event_t ev;
	struct node *stack[MAX_DEPTH];
	int depth = 0, docs = 0;
	bool ok = true, done = false;

	if (!yaml_parser_initialize(&p)) {
		fprintf(stderr, "retrygate: out of memory (yaml parser)\n");
		abort();
	}
	yaml_parser_set_input_string(&p, (const unsigned char *)data, len);
	while (ok && !done) {
		struct node *n = NULL;
		const yaml_char_t *anchor = NULL;

		if (!yaml_parser_parse(&p, &ev)) {
			report_yaml_error(ld, &p, data, len);
			ok = false;
			break;
		}
		switch (ev.type) {
		case YAML_STREAM_END_EVENT:
			done = true;
			break;
		case YAML_DOCUMENT_START_EVENT:
			if (++docs > 1) {
				load_error(ld, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1,
				           "a second YAML document (expected exactly one)");
				ok = false;
			}
			break;
		case YAML_SCALAR_EVENT:
			n = node_new(t, N_SCALAR, ev.start_mark);
			n->str = xstrndup((const char *)ev.data.scalar.value, ev.data.scalar.length);
			n->len = ev.data.scalar.length;
			n->plain = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE && !ev.data.scalar.tag;
			anchor = ev.data.scalar.anchor;
			if (strlen(n->str) != n->len) {
				load_error(ld, n->line, n->col, "a NUL character in a value (expected text)");
				ok = false;
			}
			break;
		case YAML_SEQUENCE_START_EVENT:
		case YAML_MAPPING_START_EVENT:
			if (depth == MAX_DEPTH) {
				load_error(ld, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1,
				           "nested deeper than %d levels", MAX_DEPTH);
				ok = false;
				break;
			}
			if (ev.type == YAML_SEQUENCE_START_EVENT) {
				n = node_new(t, N_SEQ, ev.start_mark);
				anchor = ev.data.sequence_start.anchor;
			} else {
				n = node_new(t, N_MAP, ev.start_mark);
				anchor = ev.data.mapping_start.anchor;
			}
			break;
		case YAML_SEQUENCE_END_EVENT:
		case YAML_MAPPING_END_EVENT:
			ok = tree_close_node(ld, t, stack[--depth]);
			break;
		case YAML_ALIAS_EVENT: {
			const char *name = (const char *)ev.data.alias.anchor;
			struct node *target = tree_find_anchor(t, name);
			if (!target) {
				char q[80];
				quote(name, q, sizeof q);
				q[strlen(q) - 1] = '\0';
				load_error(ld, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1,
				           "alias *%s refers to no anchor defined before it", q + 1);
				ok = false;
				break;
			}
			if (depth)
				node_add(stack[depth - 1], target);
			else
				t->root = target;
			break;
		}
		default:
			break;
		}
		if (n) {
			if (anchor)
				n->anchor = xstrdup((const char *)anchor);
			if (depth)
				node_add(stack[depth - 1], n);
			else
				t->root = n;
			if (n->kind == N_SCALAR)
				ok = ok && tree_close_node(ld, t, n);
			else
				stack[depth++] = n;
		}
		yaml_event_delete(&ev);
	}
	yaml_parser_delete(&p);
	if (ok && t->root && t->root->weight > MAX_WEIGHT) {
		load_error(ld, t->root->line, t->root->col,
		           "the document expands to more than %d nodes through its aliases", MAX_WEIGHT);
		ok = false;
	}
	return ok;
}

static bool node_is_null(const struct node *n)
{
	return n->kind == N_SCALAR && n->plain &&
	       (n->len == 0 || !strcmp(n->str, "~") || !strcmp(n->str, "null") ||
	        !strcmp(n->str, "Null") || !strcmp(n->str, "NULL"));
}

static const char *node_kind_name(const struct node *n)
{
	if (n->kind == N_MAP)
		return "a mapping";
	if (n->kind == N_SEQ)
		return "a sequence";
	return node_is_null(n) ? "nothing" : "a scalar";
}

/* The value of KEY in mapping MAP, or NULL. */
static const struct node *node_find(const struct node *map, const char *key)
{
	if (!map || map->kind != N_MAP)
		return NULL;
	for (int i = 0; i + 1 < map->nkids; i += 2)
		if (map->kids[i]->kind == N_SCALAR && !strcmp(map->kids[i]->str, key))
			return map->kids[i + 1];
	return NULL;
}

/* ------------------------------------------------------------------ the schema */

struct json;
struct key;

enum key_type {
	K_STR,      /* char *; `check` validates (and may normalize) */
	K_BOOL,     /* bool: true | false */
	K_INT,      /* int in [min, max] */
	K_I64,      /* int64_t in [min, max] */
	K_NUM,      /* double in [min, max], plain decimal */
	K_DUR,      /* int64_t microseconds in [min, max] */
	K_SIZE,     /* int64_t bytes in [min, max] */
	K_ENUM,     /* int, the index of the word in `names` */
	K_STRS,     /* char ** at off, int count at off2; `check` validates each */
	K_BLOCK,    /* a nested mapping filling `sub` at base + off; KF_GIVEN: bool at off2 */
	K_LIST,     /* sequence of mappings: array at off, int count at off2, elements `sub` */
	K_NAMED,    /* mapping of name -> mapping: as K_LIST, names checked by `check` */
	K_CUSTOM,   /* `parse` and `emit` do it */
};

#define KF_REQUIRED 0x1u        /* no default: missing is an error */
#define KF_NONEMPTY 0x2u        /* strings not "", sequences/mappings with an element */
#define KF_GIVEN    0x4u        /* K_BLOCK: off2 is a bool set when the block is written */

/* A string check: NULL when S is acceptable (it may rewrite S in place, e.g. lower-case it),
 * else "what is wrong (what was expected)", written into BUF or static. */
typedef const char *(*check_fn)(char *s, char *buf, size_t cap);
typedef void (*parse_fn)(struct load *ld, const struct key *k, const struct node *v, void *base);
typedef void (*emit_fn)(struct json *j, const struct key *k, const void *base);

struct block {
	const struct key *keys;     /* ends with { .name = NULL } */
	size_t size;                /* K_LIST / K_NAMED: the element struct */
	size_t name_off;            /* K_NAMED: the char * that receives the name */
	/* rules across keys, after all keys were loaded; MAP may be a null scalar */
	void (*check)(struct load *ld, void *base, const struct node *map);
	void (*release)(void *base);        /* frees fields the keys do not describe */
};

struct key {
	const char *name;
	enum key_type type;
	size_t off;                 /* the field, from the base of the block's struct */
	size_t off2;                /* see enum key_type */
	const char *def;            /* default as YAML text ("[a, b]" for lists); NULL: none */
	unsigned flags;
	int64_t min, max;           /* numbers, durations, sizes */
	check_fn check;
	const char *const *names;   /* K_ENUM */
	const struct block *sub;
	parse_fn parse;             /* K_CUSTOM */
	emit_fn emit;               /* overrides the JSON of the type (redaction, K_CUSTOM) */
	const char *expect;         /* what a value looks like, for messages */
};

#define FIELD(p, off, type) ((type *)(void *)((char *)(p) + (off)))
#define CFIELD(p, off, type) ((const type *)(const void *)((const char *)(p) + (off)))

/* ------------------------------------------------------------------ string checks */

static bool char_is_tchar(int c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c));
}

static bool str_is_visible(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f)
			return false;
	return true;
}

/* DNS-ish: dot-separated labels of letters, digits, '-' and '_', 1-63 each, 253 in all.
 * Also accepts dotted IPv4. */
static bool hostname_ok(const char *h)
{
	size_t label = 0, n = strlen(h);

	if (n == 0 || n > 253)
		return false;
	for (; *h; h++) {
		char c = *h;
		if (c == '.') {
			if (label == 0)
				return false;
			label = 0;
		} else if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		           c == '-' || c == '_') {
			if (++label > 63)
				return false;
		} else
			return false;
	}
	return label > 0;
}

static const char *check_nonempty(char *s, char *buf, size_t cap)
{
	return *s ? NULL : "empty (expected a file path)";
}

static const char *check_visible(char *s, char *buf, size_t cap)
{
	return str_is_visible(s) ? NULL : "contains a space or a non-printable character "
	                                  "(expected printable ASCII)";
}

static const char *check_name(char *s, char *buf, size_t cap)
{
	char q[80];
	size_t n = strlen(s);

	for (const char *p = s; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      strchr("-_.:", *p))) {
			snprintf(buf, cap, "bad name %s (expected letters, digits, '-', '_', '.' or ':')",
			         quote(s, q, sizeof q));
			return buf;
		}
	if (n == 0 || n > 128)
		return "bad name length (expected 1 to 128 characters)";
	return NULL;
}

static const char *check_token(char *s, char *buf, size_t cap)
{
	char q[80];

	for (const char *p = s; *p; p++)
		if (!char_is_tchar((unsigned char)*p))
			goto bad;
	if (*s)
		return NULL;
bad:
	snprintf(buf, cap, "%s is not an HTTP token (expected a name such as POST or Idempotency-Key)",
	         quote(s, q, sizeof q));
	return buf;
}

/* a literal IP and a port, as a listener binds it: names are not resolved here */
static bool listen_parse(const char *s, int *family, unsigned char addr[16], int *port)
{
	char host[HOST_MAX];

	if (split_host_port(s, host, sizeof host, port) < 0)
		return false;
	memset(addr, 0, 16);
	if (s[0] == '[') {
		*family = AF_INET6;
		return inet_pton(AF_INET6, host, addr) == 1;
	}
	*family = AF_INET;
	return inet_pton(AF_INET, host, addr) == 1;
}

static const char *check_listen(char *s, char *buf, size_t cap)
{
	unsigned char addr[16];
	int family, port;
	char q[80];

	if (listen_parse(s, &family, addr, &port))
		return NULL;
	snprintf(buf, cap, "bad address %s (expected IP:port such as 127.0.0.1:15001 or [::1]:15001)",
	         quote(s, q, sizeof q));
	return buf;
}

/* admin.listen: "" turns the admin listener off */
static const char *check_admin_listen(char *s, char *buf, size_t cap)
{
	return *s ? check_listen(s, buf, cap) : NULL;
}

static const char *check_endpoint(char *s, char *buf, size_t cap)
{
	char host[HOST_MAX], q[80];
	int port;

	if (split_host_port(s, host, sizeof host, &port) == 0 && (s[0] == '[' || hostname_ok(host)))
		return NULL;
	snprintf(buf, cap, "bad endpoint %s (expected host:port with port 1-65535, IPv6 in brackets)",
	         quote(s, q, sizeof q));
	return buf;
}

/* Route host pattern: lower-cased in place; "*" alone means any host. */
static const char *check_host(char *s, char *buf, size_t cap)
{
	static const char expect[] = "(expected a name like payments or *.example.com)";
	unsigned char addr[16];
	char q[80], *p = s;

	if (!strcmp(s, "*"))
		return NULL;
	for (; *p; p++)
		if (*p >= 'A' && *p <= 'Z')
			*p = (char)(*p - 'A' + 'a');
	if (s[0] == '[') {
		size_t n = strlen(s);
		char v6[HOST_MAX];
		if (n > 2 && n < sizeof v6 && s[n - 1] == ']') {
			memcpy(v6, s + 1, n - 2);
			v6[n - 2] = '\0';
			if (inet_pton(AF_INET6, v6, addr) == 1)
				return NULL;
		}
		snprintf(buf, cap, "bad IPv6 host %s %s", quote(s, q, sizeof q), expect);
		return buf;
	}
	p = !strncmp(s, "*.", 2) ? s + 2 : s;
	if (strchr(p, '*'))
		snprintf(buf, cap, "host %s: a wildcard is only allowed as the whole first label %s",
		         quote(s, q, sizeof q), expect);
	else if (strchr(p, ':'))
		snprintf(buf, cap, "host %s must not include a port %s", quote(s, q, sizeof q), expect);
	else if (!hostname_ok(p))
		snprintf(buf, cap, "bad host %s %s", quote(s, q, sizeof q), expect);
	else
		return NULL;
	return buf;
}

static const char *check_path_prefix(char *s, char *buf, size_t cap)
{
	char q[80];

	if (s[0] == '/' && str_is_visible(s) && !strchr(s, '#'))
		return NULL;
	snprintf(buf, cap, "bad path prefix %s (expected a path starting with \"/\", printable, "
	         "without spaces or '#')", quote(s, q, sizeof q));
	return buf;
}

static const char *check_sni(char *s, char *buf, size_t cap)
{
	char q[80];

	if (hostname_ok(s))
		return NULL;
	snprintf(buf, cap, "bad server name %s (expected a DNS name)", quote(s, q, sizeof q));
	return buf;
}

/* ------------------------------------------------------------------ the idempotency store URL */

struct store_url {
	bool redis;
	char host[HOST_MAX];
	int port, db;
	const char *user, *pass;    /* into the URL, still percent-encoded */
	size_t user_len, pass_len;
};

/* Decodes %XX escapes of N bytes at S into a new string; NULL when an escape is malformed. */
static char *percent_decode(const char *s, size_t n)
{
	char *out = xmalloc(n + 1), *o = out;

	for (size_t i = 0; i < n; i++) {
		if (s[i] != '%') {
			*o++ = s[i];
			continue;
		}
		unsigned v = 0;
		for (int k = 1; k <= 2; k++) {
			char c = i + (size_t)k < n ? s[i + (size_t)k] : 0;
			int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 :
			        (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
			if (d < 0) {
				free(out);
				return NULL;
			}
			v = v * 16 + (unsigned)d;
		}
		if (v == 0) {
			free(out);
			return NULL;
		}
		*o++ = (char)v;
		i += 2;
	}
	*o = '\0';
	return out;
}

/* "memory" | "redis://[user:password@]host[:port][/db]". */
static bool store_split(const char *s, struct store_url *u)
{
	const char *rest, *at, *hp, *slash, *colon;
	size_t hplen;

	memset(u, 0, sizeof *u);
	if (!strcmp(s, "memory"))
		return true;
	if (strncmp(s, "redis://", 8) != 0)
		return false;
	u->redis = true;
	u->port = 6379;
	rest = s + 8;
	at = strrchr(rest, '@');
	hp = rest;
	if (at) {
		colon = memchr(rest, ':', (size_t)(at - rest));
		if (!colon || colon + 1 == at)
			return false;   /* userinfo must be user:password or :password */
		u->user = rest;
		u->user_len = (size_t)(colon - rest);
		u->pass = colon + 1;
		u->pass_len = (size_t)(at - colon - 1);
		for (int k = 0; k < 2; k++) {
			char *d = k ? percent_decode(u->pass, u->pass_len) :
			              percent_decode(u->user, u->user_len);
			if (!d)
				return false;
			free(d);
		}
		hp = at + 1;
	}
	slash = strchr(hp, '/');
	hplen = slash ? (size_t)(slash - hp) : strlen(hp);
	if (slash) {
		const char *d = slash + 1;
		long db = 0;
		if (!*d || strlen(d) > 6)
			return false;
		for (; *d; d++) {
			if (*d < '0' || *d > '9')
				return false;
			db = db * 10 + (*d - '0');
		}
		u->db = (int)db;
	}
	if (hplen == 0 || hplen >= sizeof u->host)
		return false;
	if (memchr(hp, ':', hplen) || hp[0] == '[') {
		char tmp[HOST_MAX];
		memcpy(tmp, hp, hplen);
		tmp[hplen] = '\0';
		if (split_host_port(tmp, u->host, sizeof u->host, &u->port) < 0)
			return false;
		return hp[0] == '[' || hostname_ok(u->host);
	}
	memcpy(u->host, hp, hplen);
	u->host[hplen] = '\0';
	return hostname_ok(u->host);
}

static const char *check_store(char *s, char *buf, size_t cap)
{
	struct store_url u;
	char q[80];

	if (store_split(s, &u))
		return NULL;
	/* the URL may hold a password: do not echo it */
	if (!strncmp(s, "redis://", 8))
		snprintf(buf, cap, "bad redis URL (expected redis://[user:password@]host:port[/db])");
	else
		snprintf(buf, cap, "unknown store %s (expected \"memory\" or "
		         "\"redis://[user:password@]host:port[/db]\")", quote(s, q, sizeof q));
	return buf;
}

/* ------------------------------------------------------------------ loading values */

static void load_block(struct load *ld, const struct block *b, void *base, const struct node *map);

static void value_error(struct load *ld, const struct node *v, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void value_error(struct load *ld, const struct node *v, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	load_verror(ld, v->line, v->col, fmt, ap);
	va_end(ap);
}

static void type_error(struct load *ld, const struct node *v, const char *expected)
{
	char q[80];

	if (v->kind == N_SCALAR && !v->plain && !strncmp(expected, "true", 4))
		value_error(ld, v, "expected %s, got the string %s (write it without quotes)", expected,
		            quote(v->str, q, sizeof q));
	else if (v->kind == N_SCALAR && !v->plain && !strncmp(expected, "an integer", 10))
		value_error(ld, v, "expected %s, got the string %s (write a number without quotes)",
		            expected, quote(v->str, q, sizeof q));
	else if (v->kind == N_SCALAR && !node_is_null(v))
		value_error(ld, v, "expected %s, got %s", expected, quote(v->str, q, sizeof q));
	else
		value_error(ld, v, "expected %s, got %s", expected, node_kind_name(v));
}

/* The text of a scalar value, or NULL after reporting that V is not one. */
static const char *scalar_text(struct load *ld, const struct node *v, const char *expected)
{
	if (v->kind != N_SCALAR || node_is_null(v)) {
		type_error(ld, v, expected);
		return NULL;
	}
	return v->str;
}

/* -?[0-9]+ ; 0 ok, -1 not an integer, -2 out of int64 */
static int scan_int(const char *s, int64_t *v)
{
	bool neg = *s == '-';
	uint64_t n = 0;
	const char *p = s + neg;

	if (!*p)
		return -1;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		if (n > ((uint64_t)INT64_MAX - (uint64_t)(*p - '0')) / 10)
			return -2;
		n = n * 10 + (uint64_t)(*p - '0');
	}
	*v = neg ? -(int64_t)n : (int64_t)n;
	return 0;
}

/* -?[0-9]+(\.[0-9]+)? only: no exponents, infinities or NaN in a policy file */
static bool scan_num(const char *s, double *v)
{
	const char *p = s + (*s == '-');
	char *end;

	if (*p < '0' || *p > '9')
		return false;
	while (*p >= '0' && *p <= '9')
		p++;
	if (*p == '.') {
		p++;
		if (*p < '0' || *p > '9')
			return false;
		while (*p >= '0' && *p <= '9')
			p++;
	}
	if (*p)
		return false;
	errno = 0;
	*v = strtod(s, &end);
	return errno == 0 && *end == '\0';
}

static void format_value(enum key_type t, int64_t v, char *buf, size_t cap)
{
	if (t == K_DUR)
		format_duration(v, buf, cap);
	else if (t == K_SIZE && v && v % GiB == 0)
		snprintf(buf, cap, "%lldGiB", (long long)(v / GiB));
	else if (t == K_SIZE && v && v % MiB == 0)
		snprintf(buf, cap, "%lldMiB", (long long)(v / MiB));
	else if (t == K_SIZE && v && v % KiB == 0)
		snprintf(buf, cap, "%lldKiB", (long long)(v / KiB));
	else
		snprintf(buf, cap, "%lld", (long long)v);
}

/* V (as written: TEXT) against [k->min, k->max]; reports and returns false when outside. */
static bool range_ok(struct load *ld, const struct key *k, const struct node *v, double val,
                     const char *text)
{
	char lo[32], hi[32], q[80];

	if (val >= (double)k->min && val <= (double)k->max)
		return true;
	format_value(k->type, k->min, lo, sizeof lo);
	format_value(k->type, k->max, hi, sizeof hi);
	quote(text, q, sizeof q);
	if (val == 0 && k->type == K_DUR)
		value_error(ld, v, "a zero timeout is not allowed (expected a duration above 0, "
		            "e.g. 250ms)");
	else if (val > (double)k->max)
		value_error(ld, v, "%s is too large (expected at most %s)", q, hi);
	else if (val < 0 && k->min >= 0)
		value_error(ld, v, "%s is negative (expected %s or more)", q, lo);
	else
		value_error(ld, v, "%s is too small (expected %s or more)", q, lo);
	return false;
}

static const char *key_expect(const struct key *k)
{
	switch (k->type) {
	case K_BOOL: return "true or false";
	case K_INT: case K_I64: return "an integer";
	case K_NUM: return "a number";
	case K_DUR: return "a duration like 250ms, 2s, 1m or 24h";
	case K_SIZE: return "a size like 512, 64KiB, 1MiB or 1GiB";
	case K_BLOCK: case K_NAMED: return "a mapping";
	case K_LIST: return "a sequence of mappings";
	default: return k->expect ? k->expect : "a string";
	}
}

/* "a, b or c" */
static void words_join(const char *const *w, char *buf, size_t cap)
{
	size_t o = 0;
	buf[0] = '\0';
	for (int i = 0; w[i] && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%s", i == 0 ? "" : w[i + 1] ? ", " : " or ",
		                      w[i]);
}

static void strs_free(char **v, int n)
{
	for (int i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static void load_string(struct load *ld, const struct key *k, void *base, const struct node *v)
{
	const char *s = scalar_text(ld, v, key_expect(k));
	char buf[512], *copy;
	const char *why = NULL;

	if (!s)
		return;
	copy = xstrdup(s);
	if ((k->flags & KF_NONEMPTY) && !*copy) {
		snprintf(buf, sizeof buf, "empty (expected %s)", key_expect(k));
		why = buf;
	} else if (k->check)
		why = k->check(copy, buf, sizeof buf);
	if (why) {
		value_error(ld, v, "%s", why);
		free(copy);
		return;
	}
	free(*FIELD(base, k->off, char *));
	*FIELD(base, k->off, char *) = copy;
}

static void load_strings(struct load *ld, const struct key *k, void *base, const struct node *v)
{
	char ***list = FIELD(base, k->off, char **);
	int *count = FIELD(base, k->off2, int);
	char expect[96], buf[512];
	int n;

	snprintf(expect, sizeof expect, "a sequence of %s", k->expect ? k->expect : "strings");
	if (v->kind != N_SEQ && !node_is_null(v)) {
		type_error(ld, v, expect);
		return;
	}
	n = v->kind == N_SEQ ? v->nkids : 0;
	strs_free(*list, *count);
	*list = xcalloc((size_t)n, sizeof **list);
	*count = n;
	if (n == 0 && (k->flags & KF_NONEMPTY))
		value_error(ld, v, "empty (expected at least one %s)", k->expect ? k->expect : "value");
	for (int i = 0; i < n; i++) {
		const struct node *item = v->kids[i];
		const char *s = scalar_text(ld, item, k->expect ? k->expect : "a string"), *why;
		char *copy;
		if (!s)
			continue;
		copy = xstrdup(s);
		why = k->check ? k->check(copy, buf, sizeof buf) : NULL;
		if (why) {
			value_error(ld, item, "%s", why);
			free(copy);
			continue;
		}
		(*list)[i] = copy;
	}
}

static void load_list(struct load *ld, const struct key *k, void *base, const struct node *v)
{
	char **arr = FIELD(base, k->off, char *);
	int *count = FIELD(base, k->off2, int), n;

	if (v->kind != N_SEQ && !node_is_null(v)) {
		type_error(ld, v, key_expect(k));
		return;
	}
	n = v->kind == N_SEQ ? v->nkids : 0;
	if (n == 0 && (k->flags & KF_NONEMPTY)) {
		value_error(ld, v, "empty (expected %s)", k->expect);
		return;
	}
	*arr = xcalloc((size_t)n, k->sub->size);
	*count = n;
	for (int i = 0; i < n; i++) {
		size_t mark = path_push_index(ld, i);
		if (v->kids[i]->kind == N_MAP)
			load_block(ld, k->sub, *arr + (size_t)i * k->sub->size, v->kids[i]);
		else
			type_error(ld, v->kids[i], "a mapping");
		path_pop(ld, mark);
	}
}

struct named {
	const char *name;
	int index;
};

static int named_cmp(const void *a, const void *b)
{
	const struct named *x = a, *y = b;
	int r = strcmp(x->name, y->name);
	return r ? r : (x->index > y->index) - (x->index < y->index);
}

static void load_named(struct load *ld, const struct key *k, void *base, const struct node *v)
{
	char **arr = FIELD(base, k->off, char *);
	int *count = FIELD(base, k->off2, int), n;
	struct named *names;
	char buf[512], q[80];

	if (v->kind != N_MAP && !node_is_null(v)) {
		type_error(ld, v, "a mapping of names to mappings");
		return;
	}
	n = v->kind == N_MAP ? v->nkids / 2 : 0;
	*arr = xcalloc((size_t)n, k->sub->size);
	*count = n;
	names = xcalloc((size_t)n, sizeof *names);
	for (int i = 0; i < n; i++) {
		const struct node *kn = v->kids[2 * i], *vn = v->kids[2 * i + 1];
		char *elem = *arr + (size_t)i * k->sub->size, *name;
		const char *why;
		size_t mark;

		names[i] = (struct named){ "", i };
		if (kn->kind != N_SCALAR || node_is_null(kn)) {
			type_error(ld, kn, "a name");
			continue;
		}
		name = xstrdup(kn->str);
		*FIELD(elem, k->sub->name_off, char *) = name;
		names[i].name = name;
		mark = path_push(ld, name);
		if ((why = k->check(name, buf, sizeof buf)))
			value_error(ld, kn, "%s", why);
		if (vn->kind == N_MAP || node_is_null(vn))
			load_block(ld, k->sub, elem, vn);
		else
			type_error(ld, vn, "a mapping");
		path_pop(ld, mark);
	}
	/* duplicates: sorted by name, then by position, so the later one is reported */
	qsort(names, (size_t)n, sizeof *names, named_cmp);
	for (int i = 1; i < n; i++) {
		const struct node *first = v->kids[2 * names[i - 1].index];
		const struct node *dup = v->kids[2 * names[i].index];
		if (!*names[i].name || strcmp(names[i].name, names[i - 1].name))
			continue;
		size_t mark = path_push(ld, names[i].name);
		value_error(ld, dup, "%s is defined twice (first at line %d)",
		            quote(names[i].name, q, sizeof q), first->line);
		path_pop(ld, mark);
	}
	free(names);
	if (n == 0 && (k->flags & KF_NONEMPTY))
		value_error(ld, v, "empty (expected %s)", k->expect);
}

static void load_value(struct load *ld, const struct key *k, void *base, const struct node *v)
{
	const char *s;
	int64_t i64;
	double d;
	char q[80];

	switch (k->type) {
	case K_STR:
		load_string(ld, k, base, v);
		return;
	case K_STRS:
		load_strings(ld, k, base, v);
		return;
	case K_BLOCK:
		if (v->kind != N_MAP && !node_is_null(v)) {
			type_error(ld, v, "a mapping");
			return;
		}
		if (k->flags & KF_GIVEN)
			*FIELD(base, k->off2, bool) = true;
		load_block(ld, k->sub, (char *)base + k->off, v);
		return;
	case K_LIST:
		load_list(ld, k, base, v);
		return;
	case K_NAMED:
		load_named(ld, k, base, v);
		return;
	case K_CUSTOM:
		k->parse(ld, k, v, base);
		return;
	default:
		break;
	}
	if (!(s = scalar_text(ld, v, key_expect(k))))
		return;
	switch (k->type) {
	case K_BOOL:
		if (v->plain && (!strcmp(s, "true") || !strcmp(s, "false")))
			*FIELD(base, k->off, bool) = s[0] == 't';
		else
			type_error(ld, v, "true or false");
		break;
	case K_INT:
	case K_I64: {
		int r = v->plain ? scan_int(s, &i64) : -1;
		if (r == -1)
			type_error(ld, v, "an integer");
		else if (r == -2)
			value_error(ld, v, "%s is too large", quote(s, q, sizeof q));
		else if (range_ok(ld, k, v, (double)i64, s)) {
			if (k->type == K_INT)
				*FIELD(base, k->off, int) = (int)i64;
			else
				*FIELD(base, k->off, int64_t) = i64;
		}
		break;
	}
	case K_NUM:
		if (!v->plain || !scan_num(s, &d))
			type_error(ld, v, "a number such as 0.2");
		else if (range_ok(ld, k, v, d, s))
			*FIELD(base, k->off, double) = d;
		break;
	case K_DUR:
		if (parse_duration(s, &i64) < 0)
			value_error(ld, v, "bad duration %s (expected a whole number with a unit ms, s, m "
			            "or h, e.g. 250ms; a bare number is milliseconds)", quote(s, q, sizeof q));
		else if (range_ok(ld, k, v, (double)i64, s))
			*FIELD(base, k->off, int64_t) = i64;
		break;
	case K_SIZE:
		if (parse_size(s, &i64) < 0)
			value_error(ld, v, "bad size %s (expected a whole number of bytes, optionally with "
			            "a unit B, KiB, MiB or GiB, e.g. 64KiB)", quote(s, q, sizeof q));
		else if (range_ok(ld, k, v, (double)i64, s))
			*FIELD(base, k->off, int64_t) = i64;
		break;
	case K_ENUM: {
		char words[128];
		for (int e = 0; k->names[e]; e++)
			if (!strcmp(s, k->names[e])) {
				*FIELD(base, k->off, int) = e;
				return;
			}
		words_join(k->names, words, sizeof words);
		value_error(ld, v, "unknown value %s (expected %s)", quote(s, q, sizeof q), words);
		break;
	}
	default:
		break;
	}
}

/* A default is YAML text loaded through load_value, from nodes made on the stack:
 * "[a, b]" is a sequence, "" an empty (quoted) string, anything else a plain scalar. */
static void load_default(struct load *ld, const struct key *k, void *base)
{
	struct node items[16], *ptrs[16], top = { .kind = N_SCALAR };
	char buf[256];

	if (!k->def)
		return;
	ld->in_default = true;
	snprintf(buf, sizeof buf, "%s", k->def);
	if (buf[0] == '[') {
		char *p = buf + 1, *end = strchr(buf, ']');
		*end = '\0';
		top.kind = N_SEQ;
		top.kids = ptrs;
		while (*p && top.nkids < 16) {
			char *comma = strchr(p, ',');
			if (comma)
				*comma = '\0';
			items[top.nkids] = (struct node){ .kind = N_SCALAR, .plain = true, .str = p,
			                                  .len = strlen(p) };
			ptrs[top.nkids] = &items[top.nkids];
			top.nkids++;
			if (!comma)
				break;
			p = comma + 1;
			while (*p == ' ')
				p++;
		}
	} else {
		top.str = buf;
		top.len = strlen(buf);
		top.plain = top.len > 0;
	}
	load_value(ld, k, base, &top);
	ld->in_default = false;
}

/* Defaults for a whole block that was not written (recursively). */
static void load_block_defaults(struct load *ld, const struct block *b, void *base)
{
	for (const struct key *k = b->keys; k->name; k++) {
		size_t mark = path_push(ld, k->name);
		if (k->type == K_BLOCK)
			load_block_defaults(ld, k->sub, (char *)base + k->off);
		else
			load_default(ld, k, base);
		path_pop(ld, mark);
	}
}

/* Levenshtein distance, capped: for "did you mean" */
static int edit_distance(const char *a, const char *b)
{
	int prev[40], cur[40];
	size_t la = strlen(a), lb = strlen(b);

	if (la >= 40 || lb >= 40)
		return 99;
	for (size_t j = 0; j <= lb; j++)
		prev[j] = (int)j;
	for (size_t i = 1; i <= la; i++) {
		cur[0] = (int)i;
		for (size_t j = 1; j <= lb; j++) {
			int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
			int del = prev[j] + 1, ins = cur[j - 1] + 1;
			cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
		}
		memcpy(prev, cur, sizeof(int) * (lb + 1));
	}
	return prev[lb];
}

static void unknown_key(struct load *ld, const struct block *b, const struct node *kn)
{
	struct strbuf exp = { 0 };
	const char *best = NULL;
	int bestd = 3;
	size_t mark = path_push(ld, kn->str);

	if (!strcmp(kn->str, "<<")) {
		value_error(ld, kn, "merge keys are not supported (expected the keys written out, or an "
		            "alias *name as a whole value)");
		path_pop(ld, mark);
		return;
	}
	for (const struct key *k = b->keys; k->name; k++) {
		int d = edit_distance(kn->str, k->name);
		if (d < bestd) {
			bestd = d;
			best = k->name;
		}
		sb_printf(&exp, "%s%s", k == b->keys ? "" : ", ", k->name);
	}
	if (best)
		value_error(ld, kn, "unknown key (did you mean %s?)", best);
	else
		value_error(ld, kn, "unknown key (expected one of: %s)", exp.s);
	free(exp.s);
	path_pop(ld, mark);
}

static void load_block(struct load *ld, const struct block *b, void *base, const struct node *map)
{
	const struct node *seen[MAX_TABLE_KEYS] = { 0 }, *seenk[MAX_TABLE_KEYS] = { 0 };
	bool bad[MAX_TABLE_KEYS] = { 0 };
	char q[80];

	for (int i = 0; b->keys[i].name; i++)
		if (i + 1 >= MAX_TABLE_KEYS) {
			fprintf(stderr, "retrygate: bug: a schema table has more than %d keys\n",
			        MAX_TABLE_KEYS - 1);
			abort();
		}
	if (map->kind == N_MAP) {
		for (int i = 0; i + 1 < map->nkids; i += 2) {
			const struct node *kn = map->kids[i];
			int idx = -1;
			if (kn->kind != N_SCALAR || node_is_null(kn)) {
				type_error(ld, kn, "a key name");
				continue;
			}
			for (int k = 0; b->keys[k].name; k++)
				if (!strcmp(b->keys[k].name, kn->str))
					idx = k;
			if (idx < 0)
				unknown_key(ld, b, kn);
			else if (seen[idx]) {
				size_t mark = path_push(ld, kn->str);
				value_error(ld, kn, "duplicate key %s (first at line %d)",
				            quote(kn->str, q, sizeof q), seenk[idx]->line);
				path_pop(ld, mark);
			} else {
				seen[idx] = map->kids[i + 1];
				seenk[idx] = kn;
			}
		}
	}
	for (int i = 0; b->keys[i].name; i++) {
		const struct key *k = &b->keys[i];
		size_t mark = path_push(ld, k->name);
		int before = ld->nerrs + ld->dropped;

		if (seen[i])
			load_value(ld, k, base, seen[i]);
		else if (k->flags & KF_REQUIRED)
			value_error(ld, map, "required key is missing (expected %s%s)",
			            k->type == K_STRS ? "at least one " : "", k->expect ? k->expect :
			            key_expect(k));
		else if (k->type == K_BLOCK)
			load_block_defaults(ld, k->sub, (char *)base + k->off);
		else
			load_default(ld, k, base);
		bad[i] = ld->nerrs + ld->dropped != before;
		path_pop(ld, mark);
	}
	if (b->check) {
		ld->check_keys = b->keys;
		ld->check_bad = bad;
		b->check(ld, base, map);
		ld->check_keys = NULL;
		ld->check_bad = NULL;
	}
}

/* In a block check: did KEY load without error (given or defaulted)? */
static bool key_ok(const struct load *ld, const char *key)
{
	for (int i = 0; ld->check_keys[i].name; i++)
		if (!strcmp(ld->check_keys[i].name, key))
			return !ld->check_bad[i];
	return false;
}

/* An error about KEY of block MAP: at its value when written, else at the block. */
static void key_error(struct load *ld, const struct node *map, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void key_error(struct load *ld, const struct node *map, const char *key, const char *fmt, ...)
{
	const struct node *v = node_find(map, key);
	size_t mark = path_push(ld, key);
	va_list ap;

	if (!v)
		v = map;
	va_start(ap, fmt);
	load_verror(ld, v->line, v->col, fmt, ap);
	va_end(ap);
	path_pop(ld, mark);
}

/* ------------------------------------------------------------------ custom keys */

static void workers_parse(struct load *ld, const struct key *k, const struct node *v, void *base)
{
	int64_t n;

	if (v->kind == N_SCALAR && !strcmp(v->str, "auto")) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		*FIELD(base, k->off, int) = cpus < 1 ? 1 : cpus > k->max ? (int)k->max : (int)cpus;
		return;
	}
	if (v->kind != N_SCALAR || !v->plain || scan_int(v->str, &n) != 0) {
		type_error(ld, v, "a positive integer or \"auto\"");
		return;
	}
	if (range_ok(ld, k, v, (double)n, v->str))
		*FIELD(base, k->off, int) = (int)n;
}

static const char *const retry_on_words[] = { "connect-failure", "reset", "timeout", NULL };

static void retry_on_parse(struct load *ld, const struct key *k, const struct node *v, void *base)
{
	static const char expect[] =
	        "expected connect-failure, reset, timeout or a status code 400-599";
	struct cfg_retry *r = base;
	char q[80];

	if (v->kind != N_SEQ && !node_is_null(v)) {
		type_error(ld, v, "a sequence of conditions");
		return;
	}
	/* replaces the default; duplicates merge into the same bit */
	r->on_flags = 0;
	memset(r->on_status, 0, sizeof r->on_status);
	for (int i = 0; v->kind == N_SEQ && i < v->nkids; i++) {
		const struct node *item = v->kids[i];
		int64_t status;
		int w;

		if (item->kind != N_SCALAR || node_is_null(item)) {
			type_error(ld, item, "a condition");
			continue;
		}
		for (w = 0; retry_on_words[w]; w++)
			if (!strcmp(item->str, retry_on_words[w])) {
				r->on_flags |= 1u << w;
				break;
			}
		if (retry_on_words[w])
			continue;
		if (scan_int(item->str, &status) == 0 && status >= 400 && status <= 599)
			r->on_status[(status - 400) / 8] |= (uint8_t)(1u << ((status - 400) % 8));
		else if (scan_int(item->str, &status) == 0)
			value_error(ld, item, "status %s cannot be retried (%s)",
			            quote(item->str, q, sizeof q), expect);
		else
			value_error(ld, item, "unknown condition %s (%s)", quote(item->str, q, sizeof q),
			            expect);
	}
}

/* ------------------------------------------------------------------ block checks */

static void deadline_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_deadline *d = base;
	char a[32], b[32];

	if (!key_ok(ld, "default"))
		return;
	if (key_ok(ld, "max") && d->default_us > d->max_us) {
		format_duration(d->default_us, a, sizeof a);
		format_duration(d->max_us, b, sizeof b);
		key_error(ld, map, node_find(map, "default") ? "default" : "max",
		          "deadline.default %s is above deadline.max %s (expected default <= max)", a, b);
	}
	if (key_ok(ld, "min") && d->min_us >= d->default_us) {
		format_duration(d->min_us, a, sizeof a);
		format_duration(d->default_us, b, sizeof b);
		key_error(ld, map, node_find(map, "min") ? "min" : "default",
		          "deadline.min %s is not below deadline.default %s (expected min < default)",
		          a, b);
	}
}

static void backoff_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_retry *r = base;
	char a[32], b[32];

	if (key_ok(ld, "base") && key_ok(ld, "max") && r->backoff_base_us > r->backoff_max_us) {
		format_duration(r->backoff_base_us, a, sizeof a);
		format_duration(r->backoff_max_us, b, sizeof b);
		key_error(ld, map, node_find(map, "base") ? "base" : "max",
		          "backoff.base %s is above backoff.max %s (expected base <= max)", a, b);
	}
}

static void concurrency_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_upstream *u = base;

	if (!key_ok(ld, "max_in_flight") || !key_ok(ld, "max_retries_in_flight") ||
	    u->max_retries_in_flight <= u->max_in_flight)
		return;
	if (node_find(map, "max_retries_in_flight")) {
		size_t mark = path_push(ld, "max_retries_in_flight");
		load_warn(ld, "%d is above max_in_flight %d; %d governs", u->max_retries_in_flight,
		          u->max_in_flight, u->max_in_flight);
		path_pop(ld, mark);
	}
	u->max_retries_in_flight = u->max_in_flight;
}

static void limits_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_limits *l = base;
	char a[32], b[32];

	if (!key_ok(ld, "max_uri_bytes") || !key_ok(ld, "max_header_bytes") ||
	    l->max_uri_bytes <= l->max_header_bytes)
		return;
	if (node_find(map, "max_uri_bytes")) {
		size_t mark = path_push(ld, "max_uri_bytes");
		format_value(K_SIZE, l->max_uri_bytes, a, sizeof a);
		format_value(K_SIZE, l->max_header_bytes, b, sizeof b);
		load_warn(ld, "%s is above max_header_bytes %s; %s governs", a, b, b);
		path_pop(ld, mark);
	}
	l->max_uri_bytes = l->max_header_bytes;
}

static void idempotency_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_idempotency *id = base;
	struct store_url u;

	if (!key_ok(ld, "store") || !id->store || !store_split(id->store, &u) || !u.redis)
		return;
	id->store_host = xstrdup(u.host);
	id->store_port = u.port;
	id->store_db = u.db;
	if (u.user) {
		id->store_user = u.user_len ? percent_decode(u.user, u.user_len) : NULL;
		id->store_password = percent_decode(u.pass, u.pass_len);
	}
}

static void idempotency_release(void *base)
{
	struct cfg_idempotency *id = base;
	free(id->store_host);
	free(id->store_user);
	free(id->store_password);
}

static void upstream_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_upstream *u = base;
	u->line = map->line;
	u->col = map->col;
}

static void route_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_route *r = base;

	if (r->host && !strcmp(r->host, "*")) {
		free(r->host);
		r->host = NULL;
	}
}

/* Points the route at its upstream; all upstreams are loaded by now, whatever the key order. */
static void route_resolve(struct load *ld, struct cfg_route *r, const struct node *map)
{
	const struct config *c = ld->c;
	struct strbuf names = { 0 };
	char q[80];

	if (!r->upstream_name || (r->upstream = config_upstream(c, r->upstream_name)))
		return;
	for (int i = 0; i < c->nupstreams && i < 10; i++)
		sb_printf(&names, "%s%s", i ? ", " : "", c->upstreams[i].name ? c->upstreams[i].name : "?");
	if (c->nupstreams > 10)
		sb_puts(&names, ", ...");
	if (c->nupstreams)
		key_error(ld, map, "upstream", "upstream %s is not defined (defined: %s)",
		          quote(r->upstream_name, q, sizeof q), names.s);
	else
		key_error(ld, map, "upstream", "upstream %s is not defined (no upstreams are defined)",
		          quote(r->upstream_name, q, sizeof q));
	free(names.s);
}

static void listener_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_listener *l = base;

	/* an unnamed listener is known by its address, which is unique */
	if (!l->name && l->listen)
		l->name = xstrdup(l->listen);
}

struct bound {
	char what[32];              /* "admin.listen", "listeners[1]" */
	const char *listen;
	int line;                   /* 0: a default */
	int family, port;
	unsigned char addr[16];
};

static bool addr_is_any(const struct bound *b)
{
	static const unsigned char zero[16];
	return !memcmp(b->addr, zero, 16);
}

/* Two listeners on one port clash when the addresses are equal or either is the wildcard:
 * with SO_REUSEPORT on both, the kernel would not refuse it but split the traffic. */
static bool bound_clash(const struct bound *a, const struct bound *b)
{
	if (a->port != b->port)
		return false;
	if (addr_is_any(a) || addr_is_any(b))
		return true;
	return a->family == b->family && !memcmp(a->addr, b->addr, 16);
}

/* Routes find their upstreams; listener names and addresses are unique, and no listener
 * takes the admin address. */
static void root_check(struct load *ld, void *base, const struct node *map)
{
	struct config *c = base;
	const struct node *lseq = node_find(map, "listeners"), *an = node_find(node_find(map, "admin"),
	                                                                        "listen");
	struct bound *bs = xcalloc((size_t)c->nlisteners + 1, sizeof *bs);
	int nb = 0;
	char q[80], where[32];

	if (c->admin_listen && *c->admin_listen &&
	    listen_parse(c->admin_listen, &bs[0].family, bs[0].addr, &bs[0].port)) {
		snprintf(bs[0].what, sizeof bs[0].what, "admin.listen");
		bs[0].listen = c->admin_listen;
		bs[0].line = an ? an->line : 0;
		nb = 1;
	}
	for (int i = 0; lseq && lseq->kind == N_SEQ && i < c->nlisteners; i++) {
		struct cfg_listener *l = &c->listeners[i];
		const struct node *ln = lseq->kids[i], *vn = node_find(ln, "listen");
		struct bound *b = &bs[nb];
		size_t mark = path_push(ld, "listeners");

		path_push_index(ld, i);
		const struct node *rseq = node_find(ln, "routes");
		for (int k = 0; rseq && rseq->kind == N_SEQ && k < l->nroutes; k++) {
			size_t rmark = path_push(ld, "routes");
			path_push_index(ld, k);
			if (rseq->kids[k]->kind == N_MAP)
				route_resolve(ld, &l->routes[k], rseq->kids[k]);
			path_pop(ld, rmark);
		}
		/* a default name is the address, whose clash is reported below */
		for (int j = 0; j < i && l->name && node_find(ln, "name"); j++)
			if (c->listeners[j].name && !strcmp(c->listeners[j].name, l->name)) {
				key_error(ld, ln, "name",
				          "listener name %s is already used by listeners[%d] (expected unique "
				          "names)", quote(l->name, q, sizeof q), j);
				break;
			}
		if (l->listen && listen_parse(l->listen, &b->family, b->addr, &b->port)) {
			snprintf(b->what, sizeof b->what, "listeners[%d]", i);
			b->listen = l->listen;
			b->line = vn ? vn->line : ln->line;
			for (int j = 0; j < nb; j++) {
				if (!bound_clash(&bs[j], b))
					continue;
				if (bs[j].line)
					snprintf(where, sizeof where, "line %d", bs[j].line);
				else
					snprintf(where, sizeof where, "default");
				if (!strcmp(bs[j].listen, b->listen))
					key_error(ld, ln, "listen", "address %s is already used by %s (%s) "
					          "(expected distinct addresses)", quote(l->listen, q, sizeof q),
					          bs[j].what, where);
				else
					key_error(ld, ln, "listen", "address %s overlaps %s of %s (%s) (expected "
					          "distinct addresses)", quote(l->listen, q, sizeof q),
					          bs[j].listen, bs[j].what, where);
				break;
			}
			nb++;
		}
		path_pop(ld, mark);
	}
	free(bs);
}

/* ------------------------------------------------------------------ the tables */

#define OFF(type, field) offsetof(struct type, field)
#define TIMEOUT .min = 1, .max = DUR_MAX        /* a zero timeout fails every request */
#define WAIT    .min = 0, .max = DUR_MAX

static const char *const non_idempotent_words[] = { "require-key", "never", "always", NULL };

static void emit_secret(struct json *j, const struct key *k, const void *base);
static void emit_store(struct json *j, const struct key *k, const void *base);
static void emit_workers(struct json *j, const struct key *k, const void *base);
static void emit_retry_on(struct json *j, const struct key *k, const void *base);

static const struct key backoff_keys[] = {
	{ "base", K_DUR, OFF(cfg_retry, backoff_base_us), .def = "25ms", WAIT },
	{ "max", K_DUR, OFF(cfg_retry, backoff_max_us), .def = "250ms", WAIT },
	{ .name = NULL },
};
static const struct block backoff_block = { .keys = backoff_keys, .check = backoff_check };

static const struct key retry_after_keys[] = {
	{ "honor", K_BOOL, OFF(cfg_retry, retry_after_honor), .def = "true" },
	{ "max", K_DUR, OFF(cfg_retry, retry_after_max_us), .def = "10s", WAIT },
	{ .name = NULL },
};
static const struct block retry_after_block = { .keys = retry_after_keys };

static const struct key budget_keys[] = {
	{ "ratio", K_NUM, OFF(cfg_retry, budget_ratio), .def = "0.2", .min = 0, .max = 100 },
	{ "min_per_second", K_NUM, OFF(cfg_retry, budget_min_per_second), .def = "10", .min = 0,
	  .max = 1000000 },
	/* a bucket that cannot hold one token never allows a retry: use enabled: false */
	{ "max_tokens", K_I64, OFF(cfg_retry, budget_max_tokens), .def = "100", .min = 1,
	  .max = 1000000000 },
	{ .name = NULL },
};
static const struct block budget_block = { .keys = budget_keys };

static const struct key retry_keys[] = {
	{ "enabled", K_BOOL, OFF(cfg_retry, enabled), .def = "true" },
	{ "max_attempts", K_INT, OFF(cfg_retry, max_attempts), .def = "3", .min = 1, .max = 100 },
	{ "per_try_timeout", K_DUR, OFF(cfg_retry, per_try_timeout_us), .def = "1s", TIMEOUT },
	{ "on", K_CUSTOM, 0, .def = "[connect-failure, reset, timeout, 502, 503, 504]",
	  .parse = retry_on_parse, .emit = emit_retry_on },
	{ "backoff", K_BLOCK, 0, .sub = &backoff_block },
	{ "retry_after", K_BLOCK, 0, .sub = &retry_after_block },
	{ "budget", K_BLOCK, 0, .sub = &budget_block },
	{ "non_idempotent", K_ENUM, OFF(cfg_retry, non_idempotent), .def = "require-key",
	  .names = non_idempotent_words },
	{ "max_body", K_SIZE, OFF(cfg_retry, max_body), .def = "64KiB", .min = 0, .max = GiB },
	{ .name = NULL },
};
static const struct block retry_block = { .keys = retry_keys };

static const struct key deadline_keys[] = {
	{ "default", K_DUR, OFF(cfg_deadline, default_us), .def = "5s", TIMEOUT },
	{ "max", K_DUR, OFF(cfg_deadline, max_us), .def = "30s", TIMEOUT },
	{ "min", K_DUR, OFF(cfg_deadline, min_us), .def = "5ms", TIMEOUT },
	{ .name = NULL },
};
static const struct block deadline_block = { .keys = deadline_keys, .check = deadline_check };

static const struct key concurrency_keys[] = {
	{ "max_in_flight", K_INT, OFF(cfg_upstream, max_in_flight), .def = "256", .min = 1,
	  .max = 1000000 },
	{ "max_retries_in_flight", K_INT, OFF(cfg_upstream, max_retries_in_flight), .def = "32",
	  .min = 0, .max = 1000000 },
	{ .name = NULL },
};
static const struct block concurrency_block = { .keys = concurrency_keys, .check = concurrency_check };

static const struct key idempotency_keys[] = {
	{ "enabled", K_BOOL, OFF(cfg_idempotency, enabled), .def = "false" },
	{ "header", K_STR, OFF(cfg_idempotency, header), .def = "Idempotency-Key",
	  .check = check_token, .expect = "a header name" },
	{ "methods", K_STRS, OFF(cfg_idempotency, methods), OFF(cfg_idempotency, nmethods),
	  .def = "[POST, PATCH]", .check = check_token, .expect = "a method" },
	{ "require_key", K_BOOL, OFF(cfg_idempotency, require_key), .def = "false" },
	{ "scope_headers", K_STRS, OFF(cfg_idempotency, scope_headers),
	  OFF(cfg_idempotency, nscope_headers), .def = "[Authorization]", .check = check_token,
	  .expect = "a header name" },
	{ "ttl", K_DUR, OFF(cfg_idempotency, ttl_us), .def = "24h", TIMEOUT },
	{ "lock_timeout", K_DUR, OFF(cfg_idempotency, lock_timeout_us), .def = "30s", TIMEOUT },
	{ "max_body", K_SIZE, OFF(cfg_idempotency, max_body), .def = "1MiB", .min = 0, .max = GiB },
	{ "max_response", K_SIZE, OFF(cfg_idempotency, max_response), .def = "1MiB", .min = 0,
	  .max = GiB },
	{ "store", K_STR, OFF(cfg_idempotency, store), .def = "memory", .check = check_store,
	  .emit = emit_store, .expect = "\"memory\" or a redis:// URL" },
	{ .name = NULL },
};
static const struct block idempotency_block = { .keys = idempotency_keys, .check = idempotency_check,
                                                .release = idempotency_release };

static const struct key upstream_tls_keys[] = {
	{ "sni", K_STR, OFF(cfg_upstream, tls_sni), .check = check_sni, .expect = "a DNS name" },
	{ "ca", K_STR, OFF(cfg_upstream, tls_ca), .check = check_nonempty, .expect = "a file path" },
	{ "verify", K_BOOL, OFF(cfg_upstream, tls_verify), .def = "true" },
	{ .name = NULL },
};
static const struct block upstream_tls_block = { .keys = upstream_tls_keys };

static const struct key upstream_keys[] = {
	{ "endpoints", K_STRS, OFF(cfg_upstream, endpoints), OFF(cfg_upstream, nendpoints),
	  .flags = KF_REQUIRED | KF_NONEMPTY, .check = check_endpoint, .expect = "host:port" },
	{ "tls", K_BLOCK, 0, OFF(cfg_upstream, tls), .flags = KF_GIVEN, .sub = &upstream_tls_block },
	{ "host_rewrite", K_STR, OFF(cfg_upstream, host_rewrite), .def = "", .check = check_visible,
	  .expect = "a Host header value" },
	{ "connect_timeout", K_DUR, OFF(cfg_upstream, connect_timeout_us), .def = "250ms", TIMEOUT },
	{ "deadline", K_BLOCK, OFF(cfg_upstream, deadline), .sub = &deadline_block },
	{ "retry", K_BLOCK, OFF(cfg_upstream, retry), .sub = &retry_block },
	{ "concurrency", K_BLOCK, 0, .sub = &concurrency_block },
	{ "idempotency", K_BLOCK, OFF(cfg_upstream, idem), .sub = &idempotency_block },
	{ .name = NULL },
};
static const struct block upstream_block = { .keys = upstream_keys,
                                             .size = sizeof(struct cfg_upstream),
                                             .name_off = OFF(cfg_upstream, name),
                                             .check = upstream_check };

static const struct key limits_keys[] = {
	{ "max_header_bytes", K_SIZE, OFF(cfg_limits, max_header_bytes), .def = "32KiB", .min = 1,
	  .max = MiB },
	{ "header_timeout", K_DUR, OFF(cfg_limits, header_timeout_us), .def = "10s", TIMEOUT },
	{ "max_uri_bytes", K_SIZE, OFF(cfg_limits, max_uri_bytes), .def = "8KiB", .min = 1,
	  .max = MiB },
	{ "idle_timeout", K_DUR, OFF(cfg_limits, idle_timeout_us), .def = "60s", TIMEOUT },
	{ "max_body", K_SIZE, OFF(cfg_limits, max_body), .def = "0", .min = 0, .max = 1024 * GiB },
	{ "max_connections", K_I64, OFF(cfg_limits, max_connections), .def = "10000", .min = 1,
	  .max = 10000000 },
	{ .name = NULL },
};
static const struct block limits_block = { .keys = limits_keys, .check = limits_check };

static const struct key listener_tls_keys[] = {
	{ "cert", K_STR, OFF(cfg_listener, tls_cert), .flags = KF_REQUIRED | KF_NONEMPTY,
	  .expect = "a PEM certificate file" },
	{ "key", K_STR, OFF(cfg_listener, tls_key), .flags = KF_REQUIRED | KF_NONEMPTY,
	  .expect = "a PEM private key file" },
	{ .name = NULL },
};
static const struct block listener_tls_block = { .keys = listener_tls_keys };

static const struct key route_keys[] = {
	{ "host", K_STR, OFF(cfg_route, host), .check = check_host, .expect = "a host name" },
	{ "path_prefix", K_STR, OFF(cfg_route, path_prefix), .def = "/", .check = check_path_prefix,
	  .expect = "a path" },
	{ "upstream", K_STR, OFF(cfg_route, upstream_name), .flags = KF_REQUIRED | KF_NONEMPTY,
	  .expect = "the name of an upstream" },
	{ .name = NULL },
};
static const struct block route_block = { .keys = route_keys, .size = sizeof(struct cfg_route),
                                          .check = route_check };

static const struct key listener_keys[] = {
	{ "name", K_STR, OFF(cfg_listener, name), .check = check_name, .expect = "a name" },
	{ "listen", K_STR, OFF(cfg_listener, listen), .flags = KF_REQUIRED, .check = check_listen,
	  .expect = "IP:port such as 127.0.0.1:15001" },
	{ "tls", K_BLOCK, 0, OFF(cfg_listener, tls), .flags = KF_GIVEN, .sub = &listener_tls_block },
	{ "limits", K_BLOCK, OFF(cfg_listener, limits), .sub = &limits_block },
	{ "routes", K_LIST, OFF(cfg_listener, routes), OFF(cfg_listener, nroutes),
	  .flags = KF_REQUIRED | KF_NONEMPTY, .sub = &route_block, .expect = "at least one route" },
	{ .name = NULL },
};
static const struct block listener_block = { .keys = listener_keys,
                                             .size = sizeof(struct cfg_listener),
                                             .check = listener_check };

static const struct key admin_keys[] = {
	{ "listen", K_STR, OFF(config, admin_listen), .def = "127.0.0.1:9901",
	  .check = check_admin_listen, .expect = "IP:port, or \"\" for none" },
	{ "token", K_STR, OFF(config, admin_token), .def = "", .check = check_visible,
	  .emit = emit_secret, .expect = "a bearer token" },
	{ .name = NULL },
};
static const struct block admin_block = { .keys = admin_keys };

static const struct key root_keys[] = {
	{ "admin", K_BLOCK, 0, .sub = &admin_block },
	{ "workers", K_CUSTOM, OFF(config, workers), .def = "1", .min = 1, .max = 1024,
	  .parse = workers_parse, .emit = emit_workers },
	{ "drain_timeout", K_DUR, OFF(config, drain_timeout_us), .def = "15s", WAIT },
	{ "access_log", K_STR, OFF(config, access_log), .def = "off", .flags = KF_NONEMPTY,
	  .expect = "off, stdout or a file path" },
	{ "listeners", K_LIST, OFF(config, listeners), OFF(config, nlisteners),
	  .flags = KF_REQUIRED | KF_NONEMPTY, .sub = &listener_block,
	  .expect = "at least one listener with a route" },
	{ "upstreams", K_NAMED, OFF(config, upstreams), OFF(config, nupstreams),
	  .check = check_name, .sub = &upstream_block },
	{ .name = NULL },
};
static const struct block root_block = { .keys = root_keys, .check = root_check };

/* ------------------------------------------------------------------ free */

static void block_free(const struct block *b, void *base)
{
	for (const struct key *k = b->keys; k->name; k++) {
		switch (k->type) {
		case K_STR:
			free(*FIELD(base, k->off, char *));
			break;
		case K_STRS:
			strs_free(*FIELD(base, k->off, char **), *FIELD(base, k->off2, int));
			break;
		case K_BLOCK:
			block_free(k->sub, (char *)base + k->off);
			break;
		case K_LIST:
		case K_NAMED: {
			char *arr = *FIELD(base, k->off, char *);
			int n = *FIELD(base, k->off2, int);
			for (int i = 0; arr && i < n; i++) {
				char *elem = arr + (size_t)i * k->sub->size;
				if (k->type == K_NAMED)
					free(*FIELD(elem, k->sub->name_off, char *));
				block_free(k->sub, elem);
			}
			free(arr);
			break;
		}
		default:
			break;
		}
	}
	if (b->release)
		b->release(base);
}

static void config_free(struct config *c)
{
	block_free(&root_block, c);
	strs_free(c->warnings, c->nwarnings);
	free(c->path);
	free(c);
}

/* ------------------------------------------------------------------ load */

struct config *config_load_buffer(const char *name, const char *data, size_t len, FILE *errs)
{
	struct load ld = { .file = name };
	struct tree t = { 0 };
	struct config *c = xcalloc(1, sizeof *c);

	ld.c = c;
	atomic_init(&c->refs, 1);
	c->path = xstrdup(name);
	if (tree_parse(&ld, &t, data, len)) {
		if (!t.root || node_is_null(t.root))
			load_error(&ld, 1, 1, "the configuration is empty (expected a mapping with "
			           "listeners and upstreams)");
		else if (t.root->kind != N_MAP)
			type_error(&ld, t.root, "a mapping with listeners and upstreams at the top");
		else
			load_block(&ld, &root_block, c, t.root);
	}
	tree_free(&t);
	free(ld.path.s);
	if (ld.nerrs == 0)
		return c;
	qsort(ld.errs, (size_t)ld.nerrs, sizeof *ld.errs, msg_cmp);
	for (int i = 0; i < ld.nerrs; i++) {
		if (errs)
			fprintf(errs, "%s\n", ld.errs[i].text);
		free(ld.errs[i].text);
	}
	if (errs && ld.dropped)
		fprintf(errs, "%s: %d more errors not shown\n", name, ld.dropped);
	free(ld.errs);
	config_free(c);
	return NULL;
}

struct config *config_load(const char *path, FILE *errs)
{
	FILE *f = fopen(path, "rb");
	struct strbuf b = { 0 };
	struct config *c;
	char chunk[8192];
	size_t n;

	if (!f) {
		if (errs)
			fprintf(errs, "%s: cannot open: %s\n", path, strerror(errno));
		return NULL;
	}
	sb_putn(&b, "", 0);
	while ((n = fread(chunk, 1, sizeof chunk, f)) > 0 && b.len <= MAX_FILE_BYTES)
		sb_putn(&b, chunk, n);
	if (ferror(f) || b.len > MAX_FILE_BYTES) {
		if (errs)
			fprintf(errs, "%s: cannot read: %s\n", path,
			        ferror(f) ? strerror(errno) : "larger than 16MiB");
		fclose(f);
		free(b.s);
		return NULL;
	}
	fclose(f);
	c = config_load_buffer(path, b.s, b.len, errs);
	free(b.s);
	return c;
}

struct config *config_ref(struct config *c)
{
	atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
	return c;
}

void config_unref(struct config *c)
{
	if (!c)
		return;
	/* acq_rel: every holder's reads happen before the free */
	if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1)
		config_free(c);
}

struct cfg_upstream *config_upstream(const struct config *c, const char *name)
{
	for (int i = 0; i < c->nupstreams; i++)
		if (c->upstreams[i].name && !strcmp(c->upstreams[i].name, name))
			return &c->upstreams[i];
	return NULL;
}

/* ------------------------------------------------------------------ schema keys */

static void schema_walk(const struct block *b, struct strbuf *path,
                        void (*cb)(const char *, void *), void *arg)
{
	for (const struct key *k = b->keys; k->name; k++) {
		size_t old = path->len;
		if (old)
			sb_puts(path, ".");
		sb_puts(path, k->name);
		cb(path->s, arg);
		if (k->sub)
			schema_walk(k->sub, path, cb, arg);
		path->len = old;
		path->s[old] = '\0';
	}
}

void config_schema_keys(void (*cb)(const char *dotted_path, void *arg), void *arg)
{
	struct strbuf path = { 0 };
	sb_putn(&path, "", 0);
	schema_walk(&root_block, &path, cb, arg);
	free(path.s);
}

/* ------------------------------------------------------------------ JSON */

struct json {
	FILE *f;
	int depth;
	bool had[16];               /* the container at each depth already has an item */
};

static void json_string(struct json *j, const char *s)
{
	fputc('"', j->f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			fprintf(j->f, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", j->f);
		else if (c == '\t')
			fputs("\\t", j->f);
		else if (c < 0x20 || c == 0x7f)
			fprintf(j->f, "\\u%04x", c);
		else
			fputc(c, j->f);   /* libyaml only hands out valid UTF-8 */
	}
	fputc('"', j->f);
}

/* Starts an item of the current container: separator, newline, indent, "key": */
static void json_item(struct json *j, const char *key)
{
	if (j->had[j->depth])
		fputc(',', j->f);
	j->had[j->depth] = true;
	fprintf(j->f, "\n%*s", 2 * j->depth, "");
	if (key) {
		json_string(j, key);
		fputs(": ", j->f);
	}
}

static void json_open(struct json *j, char c)
{
	fputc(c, j->f);
	j->had[++j->depth] = false;
}

static void json_close(struct json *j, char c)
{
	bool had = j->had[j->depth--];
	if (had)
		fprintf(j->f, "\n%*s", 2 * j->depth, "");
	fputc(c, j->f);
}

static void json_strings(struct json *j, char *const *v, int n)
{
	fputc('[', j->f);
	for (int i = 0; i < n; i++) {
		if (i)
			fputs(", ", j->f);
		if (v[i])
			json_string(j, v[i]);
		else
			fputs("null", j->f);
	}
	fputc(']', j->f);
}

static void emit_secret(struct json *j, const struct key *k, const void *base)
{
	const char *s = *CFIELD(base, k->off, char *);
	json_string(j, s && *s ? "<redacted>" : "");
}

static void emit_store(struct json *j, const struct key *k, const void *base)
{
	const char *s = *CFIELD(base, k->off, char *);
	struct store_url u;
	struct strbuf b = { 0 };

	if (!s || !store_split(s, &u) || !u.pass) {
		json_string(j, s ? s : "");
		return;
	}
	/* keep everything but the password, so an operator can still see where it points */
	sb_printf(&b, "%.*s<redacted>%s", (int)(u.pass - s), s, u.pass + u.pass_len);
	json_string(j, b.s);
	free(b.s);
}

static void emit_workers(struct json *j, const struct key *k, const void *base)
{
	fprintf(j->f, "%d", *CFIELD(base, k->off, int));
}

static void emit_retry_on(struct json *j, const struct key *k, const void *base)
{
	const struct cfg_retry *r = base;
	bool first = true;

	fputc('[', j->f);
	for (int w = 0; retry_on_words[w]; w++)
		if (r->on_flags & (1u << w)) {
			fputs(first ? "" : ", ", j->f);
			json_string(j, retry_on_words[w]);
			first = false;
		}
	for (int s = 400; s <= 599; s++)
		if (cfg_retry_on_status(r, s)) {
			fprintf(j->f, "%s%d", first ? "" : ", ", s);
			first = false;
		}
	fputc(']', j->f);
}

static void json_block(struct json *j, const struct block *b, const void *base)
{
	char buf[64];

	json_open(j, '{');
	for (const struct key *k = b->keys; k->name; k++) {
		json_item(j, k->name);
		if (k->emit) {
			k->emit(j, k, base);
			continue;
		}
		switch (k->type) {
		case K_STR: {
			const char *s = *CFIELD(base, k->off, char *);
			if (s)
				json_string(j, s);
			else
				fputs("null", j->f);
			break;
		}
		case K_BOOL:
			fputs(*CFIELD(base, k->off, bool) ? "true" : "false", j->f);
			break;
		case K_INT:
			fprintf(j->f, "%d", *CFIELD(base, k->off, int));
			break;
		case K_I64:
		case K_SIZE:
			fprintf(j->f, "%lld", (long long)*CFIELD(base, k->off, int64_t));
			break;
		case K_NUM:
			fprintf(j->f, "%.15g", *CFIELD(base, k->off, double));
			break;
		case K_DUR:
			format_duration(*CFIELD(base, k->off, int64_t), buf, sizeof buf);
			json_string(j, buf);
			break;
		case K_ENUM:
			json_string(j, k->names[*CFIELD(base, k->off, int)]);
			break;
		case K_STRS:
			json_strings(j, *(char **const *)(const void *)((const char *)base + k->off),
			             *CFIELD(base, k->off2, int));
			break;
		case K_BLOCK:
			if ((k->flags & KF_GIVEN) && !*CFIELD(base, k->off2, bool))
				fputs("null", j->f);
			else
				json_block(j, k->sub, (const char *)base + k->off);
			break;
		case K_LIST:
		case K_NAMED: {
			const char *arr = *CFIELD(base, k->off, char *);
			int n = *CFIELD(base, k->off2, int);
			json_open(j, k->type == K_LIST ? '[' : '{');
			for (int i = 0; i < n; i++) {
				const char *elem = arr + (size_t)i * k->sub->size;
				json_item(j, k->type == K_NAMED ? *CFIELD(elem, k->sub->name_off, char *) : NULL);
				json_block(j, k->sub, elem);
			}
			json_close(j, k->type == K_LIST ? ']' : '}');
			break;
		}
		case K_CUSTOM:
			fputs("null", j->f);
			break;
		}
	}
	json_close(j, '}');
}

char *config_to_json(const struct config *c)
{
	char *out = NULL;
	size_t len = 0;
	struct json j = { 0 };

	j.f = open_memstream(&out, &len);
	if (!j.f) {
		fprintf(stderr, "retrygate: out of memory (open_memstream)\n");
		abort();
	}
	json_block(&j, &root_block, c);
	fputc('\n', j.f);
	fclose(j.f);
	return out;
}

/* ------------------------------------------------------------------ --check report */

static int64_t backoff_cap(const struct cfg_retry *r, int n)
{
	/* min(max, base * 2^(n-1)), without overflowing the shift */
	int64_t b = r->backoff_base_us;
	for (int i = 1; i < n && b < r->backoff_max_us; i++)
		b *= 2;
	return b < r->backoff_max_us ? b : r->backoff_max_us;
}

/* For people: "5s", "250ms", and "3.075s" rather than "3075ms" */
static const char *dur(int64_t us, char *buf)
{
	if (us > 1000000 && us % 1000000 && us % 1000 == 0) {
		int n = snprintf(buf, 32, "%lld.%03lld", (long long)(us / 1000000),
		                 (long long)(us % 1000000 / 1000));
		while (buf[n - 1] == '0')
			buf[--n] = '\0';
		snprintf(buf + n, (size_t)(32 - n), "s");
	} else
		format_duration(us, buf, 32);
	return buf;
}

/* How deadline D treats the worst case of N attempts that all time out after maximal
 * backoffs: attempt i starts at S(i) and is started only if S(i) + min <= D (SPEC §3).
 * Returns whether all of them run to their end. */
static bool report_deadline(FILE *out, const struct cfg_upstream *u, int n, const char *what,
                            int64_t d, bool quiet)
{
	const struct cfg_retry *r = &u->retry;
	int64_t start = 0;
	int full = 0, started = 0;
	char a[32];

	for (int i = 1; i <= n; i++) {
		if (i > 1)
			start += r->per_try_timeout_us + backoff_cap(r, i - 1);
		if (start + u->deadline.min_us > d)
			break;
		started = i;
		if (start + r->per_try_timeout_us <= d)
			full = i;
	}
	if (quiet && full == n)
		return true;
	if (full == n)
		fprintf(out, "fits %s %s", what, dur(d, a));
	else if (n == 1)
		fprintf(out, "%s %s cuts it short", what, dur(d, a));
	else if (started > full)
		fprintf(out, "%s %s cuts attempt %d of %d short", what, dur(d, a), started, n);
	else
		fprintf(out, "%s %s leaves room for %d of %d attempts", what, dur(d, a), full, n);
	return full == n;
}

static bool retry_on_any(const struct cfg_retry *r)
{
	for (size_t i = 0; i < sizeof r->on_status; i++)
		if (r->on_status[i])
			return true;
	return r->on_flags != 0;
}

static void report_upstream(FILE *out, const struct cfg_upstream *u)
{
	const struct cfg_retry *r = &u->retry;
	bool retries = r->enabled && r->max_attempts > 1;
	int n = retries ? r->max_attempts : 1;
	int64_t backoffs = 0;
	char a[32], b[32], c[32];

	fprintf(out, "upstream %s: %d endpoint%s (%s%s)%s\n", u->name, u->nendpoints,
	        u->nendpoints == 1 ? "" : "s", u->endpoints[0], u->nendpoints > 1 ? ", ..." : "",
	        u->tls ? ", tls" : "");
	if (!retries) {
		fprintf(out, "  attempts       1 per request (%s)\n",
		        r->enabled ? "max_attempts: 1" : "retries disabled");
		fprintf(out, "  amplification  none: 1.00x\n");
	} else {
		const char *sep = " ";
		fprintf(out, "  attempts       up to %d per request, on", n);
		for (int w = 0; retry_on_words[w]; w++)
			if (r->on_flags & (1u << w)) {
				fprintf(out, "%s%s", sep, retry_on_words[w]);
				sep = ", ";
			}
		for (int s = 400; s <= 599; s++)
			if (cfg_retry_on_status(r, s)) {
				fprintf(out, "%s%d", sep, s);
				sep = ", ";
			}
		if (!retry_on_any(r))
			fprintf(out, " nothing (retry.on is empty)");
		fprintf(out, "; POST/PATCH %s\n", r->non_idempotent == NI_ALWAYS ? "always re-sent" :
		        r->non_idempotent == NI_NEVER ? "only after connect-failure" :
		        "only with a key or after connect-failure");
		double sustained = 1 + r->budget_ratio;
		fprintf(out, "  amplification  retries <= %lld + %g x requests + %g/s; sustained "
		        "amplification <= %.2fx%s\n", (long long)r->budget_max_tokens, r->budget_ratio,
		        r->budget_min_per_second, sustained < n ? sustained : n,
		        sustained < n ? "" : " (max_attempts)");
	}
	fprintf(out, "  concurrency    %d attempts in flight, %d of them retries\n", u->max_in_flight,
	        u->max_retries_in_flight);
	for (int i = 1; i < n; i++)
		backoffs += backoff_cap(r, i);
	if (n > 1)
		fprintf(out, "  latency        worst case %d x %s + %s backoff = %s; ", n,
		        dur(r->per_try_timeout_us, a), dur(backoffs, b),
		        dur(n * r->per_try_timeout_us + backoffs, c));
	else
		fprintf(out, "  latency        worst case %s; ", dur(r->per_try_timeout_us, a));
	/* the deadline is at most deadline.max: if that cuts, say so; else show both */
	if (report_deadline(out, u, n, "deadline.default", u->deadline.default_us, true))
		fprintf(out, "fits deadline.default %s and deadline.max %s",
		        dur(u->deadline.default_us, a), dur(u->deadline.max_us, b));
	else {
		fputs("; ", out);
		report_deadline(out, u, n, "deadline.max", u->deadline.max_us, false);
	}
	fputc('\n', out);
	if (!retries)
		return;
	if (!r->retry_after_honor)
		fprintf(out, "  retry-after    ignored (honor: false): backoff applies, no holds\n");
	else {
		int64_t fit = u->deadline.default_us - u->deadline.min_us;
		fprintf(out, "  retry-after    hints up to %s are waited for", dur(r->retry_after_max_us, a));
		if (r->retry_after_max_us > fit)
			fprintf(out, "; without a deadline header only up to %s fit deadline.default",
			        dur(fit, b));
		if (r->retry_after_max_us > u->deadline.max_us - u->deadline.min_us)
			fprintf(out, "; more than deadline.max %s allows", dur(u->deadline.max_us, c));
		fputc('\n', out);
	}
}

/* Does route pattern A (earlier) match every request that B (later) matches? */
static bool route_covers(const struct cfg_route *a, const struct cfg_route *b)
{
	if (strncmp(b->path_prefix, a->path_prefix, strlen(a->path_prefix)) != 0)
		return false;
	if (!a->host)
		return true;
	if (!b->host)
		return false;
	if (!strcmp(a->host, b->host))
		return true;
	if (!strncmp(a->host, "*.", 2)) {
		size_t la = strlen(a->host) - 1, lb = strlen(b->host);   /* ".suffix" */
		const char *bb = !strncmp(b->host, "*.", 2) ? b->host + 1 : b->host;
		lb = strlen(bb);
		return lb > la && !strcmp(bb + lb - la, a->host + 1);
	}
	return false;
}

static void report_warnings(FILE *out, const struct config *c)
{
	char a[32], b[32];

	for (int i = 0; i < c->nwarnings; i++)
		fprintf(out, "warning: %s\n", c->warnings[i]);
	for (int i = 0; i < c->nlisteners; i++) {
		const struct cfg_listener *l = &c->listeners[i];
		for (int k = 1; k < l->nroutes; k++)
			for (int m = 0; m < k; m++)
				if (route_covers(&l->routes[m], &l->routes[k])) {
					fprintf(out, "warning: listeners[%d].routes[%d]: never used: routes[%d] "
					        "matches all its requests first\n", i, k, m);
					break;
				}
	}
	for (int i = 0; i < c->nupstreams; i++) {
		const struct cfg_upstream *u = &c->upstreams[i];
		const struct cfg_retry *r = &u->retry;
		bool used = false;
		const char *n = u->name;

		for (int l = 0; l < c->nlisteners && !used; l++)
			for (int k = 0; k < c->listeners[l].nroutes; k++)
				used = used || c->listeners[l].routes[k].upstream == u;
		if (!used)
			fprintf(out, "warning: upstreams.%s: no route uses it\n", n);
		if (u->retry.per_try_timeout_us > u->deadline.max_us)
			fprintf(out, "warning: upstreams.%s.retry.per_try_timeout: %s is above deadline.max "
			        "%s; the deadline always cuts it\n", n, dur(r->per_try_timeout_us, a),
			        dur(u->deadline.max_us, b));
		if (!r->enabled || r->max_attempts < 2)
			continue;
		if (r->non_idempotent == NI_ALWAYS)
			fprintf(out, "warning: upstreams.%s.retry.non_idempotent: always re-sends POST and "
			        "PATCH without an Idempotency-Key; a retry after a reset or timeout can "
			        "repeat a side effect\n", n);
		if ((int64_t)r->max_attempts * r->per_try_timeout_us > u->deadline.default_us)
			fprintf(out, "warning: upstreams.%s.retry: max_attempts %d x per_try_timeout %s "
			        "cannot fit deadline.default %s\n", n, r->max_attempts,
			        dur(r->per_try_timeout_us, a), dur(u->deadline.default_us, b));
		if (r->budget_ratio > 0.5)
			fprintf(out, "warning: upstreams.%s.retry.budget.ratio: %g lets a failing dependency "
			        "see %.2fx its traffic (0.2 is usual)\n", n, r->budget_ratio,
			        1 + r->budget_ratio);
		if (r->budget_max_tokens > 1000)
			fprintf(out, "warning: upstreams.%s.retry.budget.max_tokens: %lld allows a burst of "
			        "that many retries before the ratio applies\n", n,
			        (long long)r->budget_max_tokens);
		if (u->max_retries_in_flight == 0)
			fprintf(out, "warning: upstreams.%s.concurrency.max_retries_in_flight: 0 refuses "
			        "every retry\n", n);
		for (int s = 400; s <= 499; s++)
			if (cfg_retry_on_status(r, s) && s != 408 && s != 425 && s != 429)
				fprintf(out, "warning: upstreams.%s.retry.on: %d is a client error that a "
				        "retry will not heal; retrying it wastes capacity (4xx worth retrying: "
				        "408, 425, 429)\n", n, s);
	}
}

void config_report(const struct config *c, FILE *out)
{
	char a[32];

	fprintf(out, "%s: %d listener%s, %d upstream%s, %d worker%s, drain_timeout %s\n", c->path,
	        c->nlisteners, c->nlisteners == 1 ? "" : "s", c->nupstreams,
	        c->nupstreams == 1 ? "" : "s", c->workers, c->workers == 1 ? "" : "s",
	        dur(c->drain_timeout_us, a));
	for (int i = 0; i < c->nlisteners; i++) {
		const struct cfg_listener *l = &c->listeners[i];
		if (strcmp(l->name, l->listen))
			fprintf(out, "listener %s on %s%s\n", l->name, l->listen, l->tls ? " (tls)" : "");
		else
			fprintf(out, "listener %s%s\n", l->listen, l->tls ? " (tls)" : "");
		for (int k = 0; k < l->nroutes; k++)
			fprintf(out, "  route          host %s, path %s -> %s\n",
			        l->routes[k].host ? l->routes[k].host : "any", l->routes[k].path_prefix,
			        l->routes[k].upstream_name);
	}
	for (int i = 0; i < c->nupstreams; i++)
		report_upstream(out, &c->upstreams[i]);
	report_warnings(out, c);
	fprintf(out, "%s: ok\n", c->path);
}
