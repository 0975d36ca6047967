/*
 * config_json: GET /config, the effective configuration as JSON, rendered from the schema
 * tables so that every key appears under its YAML name with its loaded (or default) value.
 * Secrets never leave: admin.token and every value written ${NAME} become "<redacted>", and
 * a redis store URL keeps all but its password. Output is pretty-printed, two spaces an indent, and ends with a newline.
 * The tables name the emitters here and config.c hands over the root, so this file calls down
 * only (config_values.c) and never names the schema.
 */
#include "config/config.h"
#include "config/config_impl.h"
#include "http/grpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct json {
	FILE *f;
	int depth;
	bool had[16];               /* the container at each depth already has an item */
	char ***secrets;            /* the string fields whose value came from ${NAME} */
	int nsecrets;
};

static bool is_secret(const struct json *j, const void *slot)
{
	for (int i = 0; i < j->nsecrets; i++)
		if ((const void *)j->secrets[i] == slot)
			return true;
	return false;
}

static void json_string(struct json *j, const char *s)
{
	size_t n = strlen(s), cap = 6 * n + 1;
	char *buf = xmalloc(cap);

	json_escape(buf, cap, s, n);
	fprintf(j->f, "\"%s\"", buf);
	free(buf);
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
		if (is_secret(j, &v[i]))
			json_string(j, "<redacted>");
		else if (v[i])
			json_string(j, v[i]);
		else
			fputs("null", j->f);
	}
	fputc(']', j->f);
}

void emit_secret(struct json *j, const struct key *k, const void *base)
{
	const char *s = *CFIELD(base, k->off, char *);
	json_string(j, s && *s ? "<redacted>" : "");
}

void emit_store(struct json *j, const struct key *k, const void *base)
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

void emit_workers(struct json *j, const struct key *k, const void *base)
{
	fprintf(j->f, "%d", *CFIELD(base, k->off, int));
}

/* The statuses (400-599) and gRPC codes of a list of answers, after FIRST items. */
static void emit_answers(struct json *j, const uint8_t status_bits[200 / 8], uint32_t grpc_bits,
                         bool first)
{
	for (int s = 400; s <= 599; s++)
		if ((status_bits[(s - 400) / 8] >> ((s - 400) % 8)) & 1) {
			fprintf(j->f, "%s%d", first ? "" : ", ", s);
			first = false;
		}
	for (int c = 1; c < GRPC_NCODES; c++)
		if ((grpc_bits >> c) & 1u) {
			fputs(first ? "" : ", ", j->f);
			json_string(j, grpc_status_name(c));
			first = false;
		}
}

void emit_retry_on(struct json *j, const struct key *k, const void *base)
{
	const struct cfg_retry *r = base;
	bool first = true;

	fputc('[', j->f);
	for (int w = 0; cfg_retry_on_words[w]; w++)
		if (r->on_flags & (1u << w)) {
			fputs(first ? "" : ", ", j->f);
			json_string(j, cfg_retry_on_words[w]);
			first = false;
		}
	emit_answers(j, r->on_status, r->on_grpc, first);
	fputc(']', j->f);
}

void emit_hedge_after(struct json *j, const struct key *k, const void *base)
{
	const struct cfg_retry *r = base;
	char b[32];

	if (r->hedge_pct)
		snprintf(b, sizeof b, "p%d", r->hedge_pct);
	else
		format_duration(r->hedge_after_us, b, sizeof b);
	json_string(j, b);
}

void emit_release_on(struct json *j, const struct key *k, const void *base)
{
	const struct cfg_idempotency *id = base;

	fputc('[', j->f);
	emit_answers(j, id->release_status, id->release_grpc, true);
	fputc(']', j->f);
}

void emit_grpc_status(struct json *j, const struct key *k, const void *base)
{
	int c = *CFIELD(base, k->off, int);
	if (c < 0)
		fputs("null", j->f);
	else
		json_string(j, grpc_status_name(c));
}

void emit_optional_int(struct json *j, const struct key *k, const void *base)
{
	int v = *CFIELD(base, k->off, int);
	if (v < 0)
		fputs("null", j->f);
	else
		fprintf(j->f, "%d", v);
}

static void json_block(struct json *j, const struct block *b, const void *base)
{
	char buf[64];

	json_open(j, '{');
	for (const struct key *k = b->keys; k->name; k++) {
		if ((k->flags & KF_QUIET_EMPTY) && k->type == K_STR) {
			const char *s = *CFIELD(base, k->off, char *);
			if (!s || !*s)
				continue;
		}
		json_item(j, k->name);
		if (k->type == K_STR && is_secret(j, CFIELD(base, k->off, char *))) {
			json_string(j, "<redacted>");
			continue;
		}
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

char *json_render(const struct block *root, const void *base, char ***secrets, int nsecrets)
{
	char *out = NULL;
	size_t len = 0;
	struct json j = { .secrets = secrets, .nsecrets = nsecrets };

	j.f = open_memstream(&out, &len);
	if (!j.f) {
		fprintf(stderr, "retrygate: out of memory (open_memstream)\n");
		abort();
	}
	json_block(&j, root, base);
	fputc('\n', j.f);
	fclose(j.f);
	return out;
}
