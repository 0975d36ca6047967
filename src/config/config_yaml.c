/*
 * config_yaml: the YAML text as a tree of nodes (struct node, config_impl.h), built from
 * libyaml's events. Every node keeps the 1-based line and column of its mark; an alias is a
 * second reference to its anchored node, never to an ancestor, so the tree has no cycles.
 * Depth, anchors and the alias-expanded size are bounded; errors go to the loader's list.
 * A value (never a key) written ${NAME} is the environment variable NAME, and so is ${NAME} in
 * the user:password part of a redis:// URL (percent-encoded there); an unset one is an error
 * at the value.
 * Called by config.c; calls go down only, to config_diag.c (which also holds the queries of
 * the finished tree).
 */
#include "config/config.h"
#include "config/config_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#define MAX_DEPTH       64          /* YAML nesting; the schema itself is 7 deep */
#define MAX_WEIGHT      200000      /* nodes with aliases expanded ("billion laughs" bound) */
#define MAX_ANCHORS     1000


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

void tree_free(struct tree *t)
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
	} else if (p->problem_mark.index < len && data[p->problem_mark.index] == '\t') {
		/* libyaml's words for it: "found character that cannot start any token" */
		load_error(ld, line, col, "YAML: a tab character (YAML forbids tabs for indentation: "
		           "indent with spaces)");
	} else if (p->context)
		load_error(ld, line, col, "YAML: %s (%s at line %d column %d)", what, p->context,
		           (int)p->context_mark.line + 1, (int)p->context_mark.column + 1);
	else
		load_error(ld, line, col, "YAML: %s", what);
}

/* NAME of "${NAME}" at P (letters, digits, '_', not starting with a digit): its length, with
 * *LEN the length of the whole reference; 0 when P holds none. */
static size_t env_ref(const char *p, size_t *len)
{
	size_t n = 0;

	if (p[0] != '$' || p[1] != '{' || (p[2] >= '0' && p[2] <= '9'))
		return 0;
	while ((p[2 + n] >= 'a' && p[2 + n] <= 'z') || (p[2 + n] >= 'A' && p[2 + n] <= 'Z') ||
	       (p[2 + n] >= '0' && p[2 + n] <= '9') || p[2 + n] == '_')
		n++;
	if (n == 0 || p[2 + n] != '}')
		return 0;
	*len = n + 3;
	return n;
}

/* The value of the variable named by the reference at REF, or NULL after reporting it unset. */
static const char *env_value(struct load *ld, const struct node *n, const char *ref, size_t nlen)
{
	char name[256];
	const char *v;

	snprintf(name, sizeof name, "%.*s", (int)nlen, ref + 2);
	if ((v = getenv(name)))
		return v;
	load_error(ld, n->line, n->col, "environment variable %s is not set (the value is ${%s})",
	           name, name);
	return NULL;
}

static void node_set_str(struct node *n, char *s)
{
	free(n->str);
	n->str = s;
	n->len = strlen(s);
	n->plain = false;           /* a string, never read as null, a boolean or a number */
}

/* ${NAME} in scalar value N: the whole value, or inside a redis:// URL's user:password.
 * False after reporting an unset variable. */
static bool env_expand(struct load *ld, struct node *n)
{
	size_t len, nlen = env_ref(n->str, &len);
	const char *v;

	if (nlen && len == n->len) {
		if (!(v = env_value(ld, n, n->str, nlen)))
			return false;
		node_set_str(n, xstrdup(v));
		n->secret = true;
		return true;
	}
	if (strncmp(n->str, "redis://", 8) != 0 || !strstr(n->str, "${"))
		return true;
	const char *user = n->str + 8, *at = strchr(user, '@'), *slash = strchr(user, '/');
	if (!at || (slash && slash < at))
		return true;
	struct strbuf b = { 0 };
	bool ok = true;
	sb_putn(&b, n->str, 8);
	for (const char *p = user; p < at;) {
		if (!(nlen = env_ref(p, &len)) || p + len > at) {
			sb_putn(&b, p++, 1);
			continue;
		}
		if (!(v = env_value(ld, n, p, nlen)))
			ok = false;
		for (; v && *v; v++) {
			unsigned char c = (unsigned char)*v;
			if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			    strchr("-._~", c))
				sb_putn(&b, v, 1);
			else
				sb_printf(&b, "%%%02X", c);
		}
		p += len;
	}
	sb_puts(&b, at);
	if (ok)
		node_set_str(n, b.s);
	else
		free(b.s);
	return ok;
}

static struct node *tree_find_anchor(struct tree *t, const char *name)
{
	for (int i = t->nanchors - 1; i >= 0; i--)
		if (strcmp(t->anchors[i].name, name) == 0)
			return t->anchors[i].node;
	return NULL;
}

bool tree_parse(struct load *ld, struct tree *t, const char *data, size_t len)
{
	yaml_parser_t p;
	yaml_event_t ev;
	struct node *stack[MAX_DEPTH];
	int depth = 0, docs = 0;
	bool ok = true, done = false, env_ok = true;

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
			} else if (!(depth && stack[depth - 1]->kind == N_MAP &&
			             stack[depth - 1]->nkids % 2 == 0)) {
				/* a value or an item, not a key: every unset variable is reported */
				env_ok = env_expand(ld, n) && env_ok;
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
				cfg_quote(name, q, sizeof q);
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
	ok = ok && env_ok;
	if (ok && t->root && t->root->weight > MAX_WEIGHT) {
		load_error(ld, t->root->line, t->root->col,
		           "the document expands to more than %d nodes through its aliases", MAX_WEIGHT);
		ok = false;
	}
	return ok;
}
