/*
 * config_impl: what the config files share and nobody else may use. They include config.h and
 * this header, which includes no config header itself, so that no include loop can form.
 * Calls go one way, down this list (a file calls only files below it; the loader reaches the
 * tables' checks, parsers and emitters through the function pointers in the tables):
 *
 *   config.c          the loader engine and the public API of config.h
 *   config_report.c   the --check report
 *   config_schema.c   the tables, the checks across keys, the lookups by name
 *   config_json.c     the /config JSON: the walk of the tables and the keys' own emitters
 *   config_files.c    the --check file checks
 *   config_values.c   checks of single values, the retry.on words
 *   config_yaml.c     the YAML text as a tree
 *   config_diag.c     a load's messages, values in them, the tree queries
 */
#ifndef RG_CONFIG_IMPL_H
#define RG_CONFIG_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/util.h"

#define KiB             1024LL
#define MiB             (1024LL * KiB)
#define GiB             (1024LL * MiB)
#define HOST_MAX        256         /* a host name or address, with its NUL */

struct config;
struct json;
struct key;
struct load;

/* ------------------------------------------------------------------ the YAML tree (config_yaml.c) */

enum node_kind { N_SCALAR, N_SEQ, N_MAP };

struct node {
	enum node_kind kind;
	bool plain;                 /* untagged plain scalar: may be null, a boolean, a number */
	bool secret;                /* the whole value came from ${NAME}: /config redacts it */
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

/* Builds T from DATA (LEN bytes). On a syntax or structure error, reports it through LD and
 * returns false (the tree may be partial and is still the caller's to free with tree_free). */
bool tree_parse(struct load *ld, struct tree *t, const char *data, size_t len);
void tree_free(struct tree *t);

/* config_diag.c: the tree's queries */
/* an untagged plain null: "", "~", "null", "Null", "NULL" */
bool node_is_null(const struct node *n);
/* "a mapping", "a sequence", "nothing" or "a scalar", for messages */
const char *node_kind_name(const struct node *n);
/* The value of KEY in mapping MAP, or NULL (also when MAP is NULL or not a mapping). */
const struct node *node_find(const struct node *map, const char *key);

/* ------------------------------------------------------------------ the tables' types */

enum key_type {
	K_STR,      /* char *; `check` validates (and may normalize) */
	K_BOOL,     /* bool: true | false */
	K_INT,      /* int in [min, max] */
	K_I64,      /* int64_t in [min, max] */
	K_NUM,      /* double in [min, max], plain decimal */
	K_DUR,      /* int64_t microseconds in [min, max] */
	K_SIZE,     /* int64_t bytes in [min, max] */
	K_ENUM,     /* int, the index of the word in `names` */
	K_STRS,     /* char ** at off, int count at off2; `check` validates each; at most `max`
	             * items when max is set */
	K_BLOCK,    /* a nested mapping filling `sub` at base + off; KF_GIVEN: bool at off2;
	             * KF_OVER: see there */
	K_LIST,     /* sequence of mappings: array at off, int count at off2, elements `sub` */
	K_NAMED,    /* mapping of name -> mapping: as K_LIST, names checked by `check` */
	K_CUSTOM,   /* `parse` and `emit` do it */
};

#define KF_REQUIRED 0x1u        /* no default: missing is an error */
#define KF_NONEMPTY 0x2u        /* strings not "", sequences/mappings with an element */
#define KF_GIVEN    0x4u        /* K_BLOCK: off2 is a bool set when the block is written */
/* K_BLOCK: an override (a route's retry over its upstream's). Not written: nothing is loaded,
 * no default. Written: once the whole file has loaded (so that it may inherit from anything),
 * `inherit` fills the block from what it overrides, then the written keys are loaded over
 * that, key by key; keys not written keep the inherited values. The block's checks run on the
 * result. */
#define KF_OVER     0x8u
/* K_STR: left out of the JSON dump while "" (an optional feature, off: the dump of a config
 * that does not use it stays what it was) */
#define KF_QUIET_EMPTY 0x10u

/* A string check: NULL when S is acceptable (it may rewrite S in place, e.g. lower-case it),
 * else "what is wrong (what was expected)", written into BUF or static. */
typedef const char *(*check_fn)(char *s, char *buf, size_t cap);
typedef void (*parse_fn)(struct load *ld, const struct key *k, const struct node *v, void *base);
typedef void (*emit_fn)(struct json *j, const struct key *k, const void *base);
/* KF_OVER: fill the block at PARENT + k->off from what it overrides, and report what the
 * written mapping V may not hold there; false: nothing to inherit from (already reported),
 * the block is not loaded. */
typedef bool (*inherit_fn)(struct load *ld, const struct key *k, void *parent,
                           const struct node *v);

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
	int64_t min, max;           /* numbers, durations, sizes; K_STRS: max items (0: any) */
	check_fn check;
	const char *const *names;   /* K_ENUM */
	const struct block *sub;
	parse_fn parse;             /* K_CUSTOM */
	inherit_fn inherit;         /* KF_OVER */
	emit_fn emit;               /* overrides the JSON of the type (redaction, K_CUSTOM) */
	const char *expect;         /* what a value looks like, for messages */
};

#define FIELD(p, off, type) ((type *)(void *)((char *)(p) + (off)))
#define CFIELD(p, off, type) ((const type *)(const void *)((const char *)(p) + (off)))

/* ------------------------------------------------------------------ a load (config.c, config_diag.c) */

struct msg;
struct over;

struct load {
	const char *file;
	struct config *c;
	struct msg *errs;
	int nerrs, caperrs, dropped;
	struct strbuf path;         /* "listeners[0].routes[1].upstream" while inside it */
	bool in_default;            /* loading a table default: an error is a bug in the tables */
	bool check_files;           /* --check: the files the config names are read too */
	/* during a block's check: which of its keys failed to load, so that cross-key rules
	 * do not pile a second, confusing error onto the first */
	const struct key *check_keys;
	const bool *check_bad;
	/* KF_OVER blocks written, loaded at the end; `over` while one is loaded */
	struct over *overs;
	int novers, capovers;
	bool over;
};

/* config_diag.c. Every message is "FILE:LINE:COL: path: what"; load_report() sorts and prints
 * them at the end. */
void load_error(struct load *ld, int line, int col, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* at the mark of node V */
void value_error(struct load *ld, const struct node *v, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* "expected EXPECTED, got ..." at V, with a hint for quoted booleans and numbers */
void type_error(struct load *ld, const struct node *v, const char *expected);
/* An adjustment, not an error: "path: what", kept in config->warnings. */
void load_warn(struct load *ld, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append ".name" / "[i]" to the message path; each returns the length path_pop restores. */
size_t path_push(struct load *ld, const char *name);
size_t path_push_index(struct load *ld, int i);
void path_pop(struct load *ld, size_t old);

/* A user's value inside a message: quoted, escaped, shortened to CAP; never a raw control
 * byte. Returns BUF. */
const char *cfg_quote(const char *s, char *buf, size_t cap);
/* -?[0-9]+ ; 0 ok, -1 not an integer, -2 out of int64 */
int scan_int(const char *s, int64_t *v);
/* A number of type T for people: durations as "250ms", sizes as "64KiB". */
void format_value(enum key_type t, int64_t v, char *buf, size_t cap);
/* V (as written: TEXT) against [k->min, k->max]; reports and returns false when outside. */
bool range_ok(struct load *ld, const struct key *k, const struct node *v, double val,
              const char *text);
/* For "did you mean": the word of the NULL-terminated WORDS within two edits of S (the
 * first of the nearest), or NULL. */
const char *closest_word(const char *s, const char *const *words);
/* In a block check: did KEY load without error (given or defaulted)? */
bool key_ok(const struct load *ld, const char *key);
/* An error about KEY of block MAP: at its value when written, else at the block. */
void key_error(struct load *ld, const struct node *map, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* The errors of LD, sorted by position, to ERRS (NULL: nowhere), then freed. */
void load_report(struct load *ld, FILE *errs);

/* ------------------------------------------------------------------ the schema (config_schema.c) */

/* the root of the tables: struct config */
extern const struct block cfg_root_block;
/* faults.rules.kind words, in enum fault_kind order */
extern const char *const cfg_fault_kind_words[];

/* idempotency.store split into its parts (nothing allocated) */
struct store_url {
	bool redis;
	char host[HOST_MAX];
	int port, db;
	const char *user, *pass;    /* into the URL, still percent-encoded */
	size_t user_len, pass_len;
};

/* config_values.c: checks of single values, named by the schema tables */
/* retry.on words, in the order of their RETRY_ON_* bits */
extern const char *const cfg_retry_on_words[];
/* the keys with a grammar of their own (the tables' parse functions): workers (a count or
 * "auto"), retry.on, idempotency.release_on, faults.rules[].grpc_status, retry.hedge.after
 * (a duration, 0ms: off, or p95 / p99) */
void workers_parse(struct load *ld, const struct key *k, const struct node *v, void *base);
void retry_on_parse(struct load *ld, const struct key *k, const struct node *v, void *base);
void release_on_parse(struct load *ld, const struct key *k, const struct node *v, void *base);
void fault_grpc_status_parse(struct load *ld, const struct key *k, const struct node *v,
                             void *base);
void hedge_after_parse(struct load *ld, const struct key *k, const struct node *v, void *base);
const char *check_idempotent_path(char *s, char *buf, size_t cap);
const char *check_delta_seconds(char *s, char *buf, size_t cap);
const char *check_reconcile_redis(char *s, char *buf, size_t cap);
const char *check_nonempty(char *s, char *buf, size_t cap);
const char *check_visible(char *s, char *buf, size_t cap);
const char *check_name(char *s, char *buf, size_t cap);
const char *check_token(char *s, char *buf, size_t cap);
const char *check_listen(char *s, char *buf, size_t cap);
const char *check_admin_listen(char *s, char *buf, size_t cap);
const char *check_endpoint(char *s, char *buf, size_t cap);
const char *check_host(char *s, char *buf, size_t cap);
const char *check_path_prefix(char *s, char *buf, size_t cap);
const char *check_sni(char *s, char *buf, size_t cap);
const char *check_probe_path(char *s, char *buf, size_t cap);
const char *check_grpc_service(char *s, char *buf, size_t cap);
const char *check_resolver(char *s, char *buf, size_t cap);
const char *check_store(char *s, char *buf, size_t cap);
bool listen_parse(const char *s, int *family, unsigned char addr[16], int *port);
/* "memory" | "redis://[user:password@]host[:port][/db]": true and *U filled when S is one. */
bool store_split(const char *s, struct store_url *u);
/* A redis:// URL's parts, decoded (user and password percent-decoded, taken); false if none. */
bool redis_url_decode(const char *url, char **host, int *port, int *db, char **user,
                             char **pass);

/* ------------------------------------------------------------------ files (config_files.c) */

enum pem_kind { PEM_CERT, PEM_KEY, PEM_CA };

/* With ld->check_files, and when KEY of block MAP loaded: PATH (its value) is a readable PEM
 * file of KIND / the access log PATH can be created or appended to. Else nothing. */
void files_check_pem(struct load *ld, const struct node *map, const char *key, const char *path,
                     enum pem_kind kind);
void files_check_log(struct load *ld, const struct node *map, const char *key, const char *path);

/* ------------------------------------------------------------------ JSON (config_json.c) */

/* The JSON of the block ROOT describes at BASE, pretty-printed, ending with a newline;
 * malloc'ed. The string fields at the NSECRETS addresses SECRETS show as "<redacted>". */
char *json_render(const struct block *root, const void *base, char ***secrets, int nsecrets);
/* the `emit` of keys whose JSON is not their type's: redacted or K_CUSTOM */
void emit_secret(struct json *j, const struct key *k, const void *base);
void emit_store(struct json *j, const struct key *k, const void *base);
void emit_workers(struct json *j, const struct key *k, const void *base);
void emit_retry_on(struct json *j, const struct key *k, const void *base);
void emit_hedge_after(struct json *j, const struct key *k, const void *base);
void emit_release_on(struct json *j, const struct key *k, const void *base);
/* faults.rules[].grpc_status: the code's name, or null; an int key whose -1 means "not set":
 * null */
void emit_grpc_status(struct json *j, const struct key *k, const void *base);
void emit_optional_int(struct json *j, const struct key *k, const void *base);

#endif
