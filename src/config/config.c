/*
 * config: the loader engine and the public API of config.h. config_load() hands the text to
 * config_yaml.c for a tree, then walks it with the tables of config_schema.c: each key is
 * loaded by its type, or from its default (YAML text loaded by the same code), and a level's
 * `check` runs after its keys. Every error is collected (config_diag.c) with its mark and key
 * path, sorted by position and printed at the end; a config with any error is freed, never
 * returned.
 *
 * The top of the config files: calls go down from here (config_impl.h lists the order), and
 * nothing below calls back but through the tables' function pointers.
 */
#include "config/config.h"
#include "config/config_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILE_BYTES  (16 << 20)
#define MAX_TABLE_KEYS  24

/* ------------------------------------------------------------------ loading values */

static void load_block(struct load *ld, const struct block *b, void *base, const struct node *map);

/* A KF_OVER block that was written: loaded once the whole file has (load_overs) */
struct over {
	const struct key *k;
	void *parent;
	const struct node *v;
	char *path;                 /* the key path of its messages */
};

/* The text of a scalar value, or NULL after reporting that V is not one. */
static const char *scalar_text(struct load *ld, const struct node *v, const char *expected)
{
	if (v->kind != N_SCALAR || node_is_null(v)) {
		type_error(ld, v, expected);
		return NULL;
	}
	return v->str;
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

/* SLOT holds a value written ${NAME} (V): remember it for /config's redaction. */
static void note_secret(struct load *ld, const struct node *v, char **slot)
{
	struct config *c = ld->c;

	if (!v->secret)
		return;
	c->secrets = xrealloc(c->secrets, (size_t)(c->nsecrets + 1) * sizeof *c->secrets);
	c->secrets[c->nsecrets++] = slot;
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
	note_secret(ld, v, FIELD(base, k->off, char *));
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
	if (k->max && n > k->max) {
		/* at the first one past the bound, which is where the list has to be cut */
		value_error(ld, v->kids[k->max], "%d entries are too many (expected at most %lld)", n,
		            (long long)k->max);
		return;
	}
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
		note_secret(ld, item, &(*list)[i]);
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
		            cfg_quote(names[i].name, q, sizeof q), first->line);
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
		if (k->flags & KF_OVER) {
			if (ld->novers == ld->capovers) {
				ld->capovers = ld->capovers ? 2 * ld->capovers : 8;
				ld->overs = xrealloc(ld->overs, (size_t)ld->capovers * sizeof *ld->overs);
			}
			ld->overs[ld->novers++] = (struct over){ k, base, v,
			                                           xstrdup(ld->path.s ? ld->path.s : "") };
			return;
		}
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
			value_error(ld, v, "%s is too large", cfg_quote(s, q, sizeof q));
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
			            "or h, e.g. 250ms; a bare number is milliseconds)", cfg_quote(s, q, sizeof q));
		else if (range_ok(ld, k, v, (double)i64, s))
			*FIELD(base, k->off, int64_t) = i64;
		break;
	case K_SIZE:
		if (parse_size(s, &i64) < 0)
			value_error(ld, v, "bad size %s (expected a whole number of bytes, optionally with "
			            "a unit B, KiB, MiB or GiB, e.g. 64KiB)", cfg_quote(s, q, sizeof q));
		else if (range_ok(ld, k, v, (double)i64, s))
			*FIELD(base, k->off, int64_t) = i64;
		break;
	case K_ENUM: {
		const char *near;
		char words[128];
		for (int e = 0; k->names[e]; e++)
			if (!strcmp(s, k->names[e])) {
				*FIELD(base, k->off, int) = e;
				return;
			}
		if ((near = closest_word(s, k->names))) {
			value_error(ld, v, "unknown value %s (did you mean \"%s\"?)",
			            cfg_quote(s, q, sizeof q), near);
			break;
		}
		words_join(k->names, words, sizeof words);
		value_error(ld, v, "unknown value %s (expected %s)", cfg_quote(s, q, sizeof q), words);
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

static void unknown_key(struct load *ld, const struct block *b, const struct node *kn)
{
	struct strbuf exp = { 0 };
	const char *names[MAX_TABLE_KEYS], *best;
	int n = 0;
	size_t mark = path_push(ld, kn->str);

	if (!strcmp(kn->str, "<<")) {
		value_error(ld, kn, "merge keys are not supported (expected the keys written out, or an "
		            "alias *name as a whole value)");
		path_pop(ld, mark);
		return;
	}
	for (const struct key *k = b->keys; k->name; k++) {
		names[n++] = k->name;
		sb_printf(&exp, "%s%s", k == b->keys ? "" : ", ", k->name);
	}
	names[n] = NULL;
	if ((best = closest_word(kn->str, names)))
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
				            cfg_quote(kn->str, q, sizeof q), seenk[idx]->line);
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
		else if (ld->over || (k->flags & KF_OVER))
			;       /* an override keeps what it inherited; an override not written is none */
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

/* The KF_OVER blocks, in the order written, now that everything they inherit from is loaded
 * and checked. */
static void load_overs(struct load *ld)
{
	for (int i = 0; i < ld->novers; i++) {
		const struct over *o = &ld->overs[i];
		path_pop(ld, 0);
		sb_puts(&ld->path, o->path);
		if (o->k->inherit(ld, o->k, o->parent, o->v)) {
			ld->over = true;
			load_block(ld, o->k->sub, (char *)o->parent + o->k->off, o->v);
			ld->over = false;
		}
		free(o->path);
	}
	path_pop(ld, 0);
	free(ld->overs);
	ld->overs = NULL;
	ld->novers = ld->capovers = 0;
}

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
	block_free(&cfg_root_block, c);
	strs_free(c->warnings, c->nwarnings);
	free(c->secrets);
	free(c->path);
	free(c);
}

/* ------------------------------------------------------------------ load */

static struct config *load_buffer(const char *name, const char *data, size_t len, FILE *errs,
                                  bool check_files)
{
	struct load ld = { .file = name, .check_files = check_files };
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
		else {
			load_block(&ld, &cfg_root_block, c, t.root);
			load_overs(&ld);
		}
	}
	tree_free(&t);
	free(ld.path.s);
	if (ld.nerrs == 0)
		return c;
	load_report(&ld, errs);
	config_free(c);
	return NULL;
}

struct config *config_load_buffer(const char *name, const char *data, size_t len, FILE *errs)
{
	return load_buffer(name, data, len, errs, false);
}

static struct config *load_file(const char *path, FILE *errs, bool check_files)
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
	c = load_buffer(path, b.s, b.len, errs, check_files);
	free(b.s);
	return c;
}

struct config *config_load(const char *path, FILE *errs)
{
	return load_file(path, errs, false);
}

struct config *config_load_check(const char *path, FILE *errs)
{
	return load_file(path, errs, true);
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

/* GET /config: the JSON of C, walked by the same tables that loaded it */
char *config_to_json(const struct config *c)
{
	return json_render(&cfg_root_block, c, c->secrets, c->nsecrets);
}
