/*
 * config_diag: the bottom of the config files (see config_impl.h): what a load says about its
 * text. Errors are collected with their mark and key path (sorted by position and printed at
 * the end, at most MAX_ERRORS of them), warnings kept in the config; a user's value appears in
 * them quoted, a number formatted for people, an unknown word with its "did you mean". The
 * queries of the YAML tree that messages and checks share are here too (config_yaml.c builds
 * the tree). Every other config file calls down into this one; it calls none of them.
 */
#include "config/config.h"
#include "config/config_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ERRORS      200         /* past this the rest are counted, not printed */

const char *cfg_quote(const char *s, char *buf, size_t cap)
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

/* ------------------------------------------------------------------ messages */

struct msg {
	int line, col, seq;
	char *text;
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

void load_error(struct load *ld, int line, int col, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	load_verror(ld, line, col, fmt, ap);
	va_end(ap);
}

void load_warn(struct load *ld, const char *fmt, ...)
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

/* "name" at the top */
size_t path_push(struct load *ld, const char *name)
{
	size_t old = ld->path.len;
	if (old)
		sb_putn(&ld->path, ".", 1);
	sb_puts(&ld->path, name);
	return old;
}

size_t path_push_index(struct load *ld, int i)
{
	size_t old = ld->path.len;
	sb_printf(&ld->path, "[%d]", i);
	return old;
}

void path_pop(struct load *ld, size_t old)
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

void value_error(struct load *ld, const struct node *v, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	load_verror(ld, v->line, v->col, fmt, ap);
	va_end(ap);
}

void type_error(struct load *ld, const struct node *v, const char *expected)
{
	char q[80];

	if (v->kind == N_SCALAR && !v->plain && !strncmp(expected, "true", 4))
		value_error(ld, v, "expected %s, got the string %s (write it without quotes)", expected,
		            cfg_quote(v->str, q, sizeof q));
	else if (v->kind == N_SCALAR && !v->plain && !strncmp(expected, "an integer", 10))
		value_error(ld, v, "expected %s, got the string %s (write a number without quotes)",
		            expected, cfg_quote(v->str, q, sizeof q));
	else if (v->kind == N_SCALAR && !node_is_null(v))
		value_error(ld, v, "expected %s, got %s", expected, cfg_quote(v->str, q, sizeof q));
	else
		value_error(ld, v, "expected %s, got %s", expected, node_kind_name(v));
}

/* The errors of LD, sorted by position, to ERRS (NULL: nowhere), then freed. */
void load_report(struct load *ld, FILE *errs)
{
	qsort(ld->errs, (size_t)ld->nerrs, sizeof *ld->errs, msg_cmp);
	for (int i = 0; i < ld->nerrs; i++) {
		if (errs)
			fprintf(errs, "%s\n", ld->errs[i].text);
		free(ld->errs[i].text);
	}
	if (errs && ld->dropped)
		fprintf(errs, "%s: %d more errors not shown\n", ld->file, ld->dropped);
	free(ld->errs);
	ld->errs = NULL;
	ld->nerrs = 0;
}

/* ------------------------------------------------------------------ in a block's check */

bool key_ok(const struct load *ld, const char *key)
{
	for (int i = 0; ld->check_keys[i].name; i++)
		if (!strcmp(ld->check_keys[i].name, key))
			return !ld->check_bad[i];
	return false;
}

void key_error(struct load *ld, const struct node *map, const char *key, const char *fmt, ...)
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

/* ------------------------------------------------------------------ values */

int scan_int(const char *s, int64_t *v)
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

void format_value(enum key_type t, int64_t v, char *buf, size_t cap)
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

bool range_ok(struct load *ld, const struct key *k, const struct node *v, double val,
                     const char *text)
{
	char lo[32], hi[32], q[80];

	if (val >= (double)k->min && val <= (double)k->max)
		return true;
	format_value(k->type, k->min, lo, sizeof lo);
	format_value(k->type, k->max, hi, sizeof hi);
	cfg_quote(text, q, sizeof q);
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

const char *closest_word(const char *s, const char *const *words)
{
	const char *best = NULL;
	int bestd = 3;

	for (int i = 0; words[i]; i++) {
		int d = edit_distance(s, words[i]);
		if (d < bestd) {
			bestd = d;
			best = words[i];
		}
	}
	return best;
}

/* ------------------------------------------------------------------ the tree */

bool node_is_null(const struct node *n)
{
	return n->kind == N_SCALAR && n->plain &&
	       (n->len == 0 || !strcmp(n->str, "~") || !strcmp(n->str, "null") ||
	        !strcmp(n->str, "Null") || !strcmp(n->str, "NULL"));
}

const char *node_kind_name(const struct node *n)
{
	if (n->kind == N_MAP)
		return "a mapping";
	if (n->kind == N_SEQ)
		return "a sequence";
	return node_is_null(n) ? "nothing" : "a scalar";
}

const struct node *node_find(const struct node *map, const char *key)
{
	if (!map || map->kind != N_MAP)
		return NULL;
	for (int i = 0; i + 1 < map->nkids; i += 2)
		if (map->kids[i]->kind == N_SCALAR && !strcmp(map->kids[i]->str, key))
			return map->kids[i + 1];
	return NULL;
}

