/*
 * idempotency: naming a request (scope, fingerprint), the end-of-exchange rule, the record
 * codec, and the registry of store handles that dispatches to store_memory.c / store_redis.c.
 *
 * Hashes are SHA-256 over length-prefixed fields behind a domain tag, so the encoding of one
 * tuple is never a prefix or rearrangement of another's, and a scope can never equal a
 * fingerprint. The registry is one mutex-protected list: handles are few (stores x workers)
 * and looked up rarely enough (per request at most) that a list walk is nothing.
 */
#include "http/grpc.h"
#include "idempotency/idempotency.h"
#include "idempotency/store.h"
#include "base/util.h"

#include <event2/buffer.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

const char *idem_result_name(enum idem_result r)
{
	switch (r) {
	case IDEM_CLAIMED:     return "claimed";
	case IDEM_REPLAY:      return "replay";
	case IDEM_MISMATCH:    return "mismatch";
	case IDEM_IN_PROGRESS: return "in-progress";
	case IDEM_UNAVAILABLE: return "unavailable";
	}
	return "?";
}

/* ------------------------------------------------------------------ hashing */

static EVP_MD_CTX *sha_begin(const char *tag)
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1)
		abort();    /* out of memory, or an OpenSSL without SHA-256: nothing sane to do */
	/* the tag's NUL is hashed too: the tag is a field of its own */
	EVP_DigestUpdate(ctx, tag, strlen(tag) + 1);
	return ctx;
}

static void sha_end(EVP_MD_CTX *ctx, unsigned char out[32])
{
	unsigned int n = 32;
	if (EVP_DigestFinal_ex(ctx, out, &n) != 1 || n != 32)
		abort();
	EVP_MD_CTX_free(ctx);
}

static void sha_u64(EVP_MD_CTX *ctx, uint64_t v)
{
	unsigned char b[8];
	for (int i = 7; i >= 0; i--, v >>= 8)
		b[i] = (unsigned char)v;
	EVP_DigestUpdate(ctx, b, sizeof b);
}

static void sha_field(EVP_MD_CTX *ctx, const void *p, size_t n)
{
	sha_u64(ctx, n);
	if (n)
		EVP_DigestUpdate(ctx, p, n);
}

/* An optional field: a presence byte, then the field when present. */
static void sha_opt_field(EVP_MD_CTX *ctx, const void *p, size_t n)
{
	unsigned char present = p != NULL;
	EVP_DigestUpdate(ctx, &present, 1);
	if (p)
		sha_field(ctx, p, n);
}

void idem_scope(unsigned char out[32], const char *upstream,
                const char *const *values, const size_t *value_lens, int nvalues,
                const char *key, size_t key_len)
{
	EVP_MD_CTX *ctx = sha_begin("retrygate idempotency scope v1");
	sha_field(ctx, upstream, strlen(upstream));
	sha_u64(ctx, nvalues > 0 ? (uint64_t)nvalues : 0);
	for (int i = 0; i < nvalues; i++)
		sha_opt_field(ctx, values[i], values[i] ? value_lens[i] : 0);
	sha_field(ctx, key, key_len);
	sha_end(ctx, out);
}

static void body_digest(struct evbuffer *body, unsigned char out[32])
{
	EVP_MD_CTX *ctx = sha_begin("retrygate idempotency body v1");
	if (body) {
		int n = evbuffer_peek(body, -1, NULL, NULL, 0);
		if (n > 0) {
			struct evbuffer_iovec *v = xcalloc((size_t)n, sizeof *v);
			n = evbuffer_peek(body, -1, NULL, v, n);
			for (int i = 0; i < n; i++)
				EVP_DigestUpdate(ctx, v[i].iov_base, v[i].iov_len);
			free(v);
		}
	}
	sha_end(ctx, out);
}

void idem_fingerprint(unsigned char out[32], const char *method, size_t method_len,
                      const char *target, size_t target_len,
                      const char *ctype, size_t ctype_len, struct evbuffer *body)
{
	unsigned char bd[32];
	body_digest(body, bd);

	EVP_MD_CTX *ctx = sha_begin("retrygate idempotency fingerprint v1");
	sha_field(ctx, method, method_len);
	sha_field(ctx, target, target_len);
	sha_opt_field(ctx, ctype, ctype_len);
	EVP_DigestUpdate(ctx, bd, sizeof bd);
	sha_end(ctx, out);
}

/* ------------------------------------------------------------------ policy */

bool idem_not_executed(const struct cfg_idempotency *c, enum outcome out, int status,
                       int grpc_status)
{
	if (out == OUT_CONNECT_FAILURE)
		return true;
	return out == OUT_STATUS && cfg_idem_release_on(c, status, grpc_status);
}

enum idem_after idem_disposition(int last_status, int grpc_status, bool reached, bool refused,
                                 int64_t stored_len, int64_t max_response)
{
	/* the service said, every time, that it did not take the request: nothing to remember */
	if (refused)
		return IDEM_AFTER_RELEASE;
	/* a gRPC error such as UNAVAILABLE travels under :status 200: the code decides */
	bool definite = last_status != 200 || grpc_status < 0 || grpc_definite(grpc_status);
	if (last_status > 0 && last_status < 500 && definite)
		return stored_len >= 0 && stored_len <= max_response ? IDEM_AFTER_STORE
		                                                     : IDEM_AFTER_KEEP;
	if (last_status > 0 || reached)
		return IDEM_AFTER_EXPIRE;
	return IDEM_AFTER_RELEASE;
}

/* ------------------------------------------------------------------ the registry */

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct idem_store *reg_head;

struct idem_store *idem_store_get(const struct cfg_idempotency *c, struct event_base *base,
                                  struct evdns_base *dns, const char **err)
{
	const char *spec = c->store ? c->store : "memory";
	struct idem_store *s;

	pthread_mutex_lock(&reg_mu);
	for (s = reg_head; s; s = s->next)
		if (s->base == base && !strcmp(s->spec, spec))
			break;
	if (!s) {
		s = c->store_host ? store_redis_new(c, base, dns, err) : store_memory_new(base);
		if (s) {
			s->base = base;
			s->spec = xstrdup(spec);
			s->next = reg_head;
			reg_head = s;
		}
	}
	pthread_mutex_unlock(&reg_mu);
	return s;
}

struct idem_op *idem_claim(struct idem_store *s, const struct idem_key *key,
                           int64_t lock_timeout_us, idem_claim_fn fn, void *arg)
{
	return s->ops->claim(s, key, lock_timeout_us, fn, arg);
}

void idem_cancel(struct idem_op *op)
{
	op->s->ops->cancel(op);
}

void idem_complete(struct idem_store *s, const struct idem_key *key,
                   const struct idem_response *resp, int64_t ttl_us)
{
	s->ops->put(s, key, REC_DONE, resp, ttl_us);
}

void idem_keep_claimed(struct idem_store *s, const struct idem_key *key, int64_t ttl_us)
{
	s->ops->put(s, key, REC_KEPT, NULL, ttl_us);
}

void idem_release(struct idem_store *s, const struct idem_key *key)
{
	s->ops->release(s, key);
}

void idem_store_sweep(void)
{
	store_memory_sweep();
}

void idem_redis_set_timeout(int64_t us)
{
	store_redis_set_timeout(us);
}

void idem_memory_set_limit(size_t bytes)
{
	store_memory_set_limit(bytes);
}

void idem_memory_stats(size_t *records, size_t *bytes)
{
	store_memory_stats(records, bytes);
}

/* Unlinks the handles that MATCH (all when BASE is NULL) under the lock, frees them outside
 * it: freeing a redis handle runs hiredis callbacks, which must not find the lock held. */
static void release_matching(struct event_base *base)
{
	struct idem_store *gone = NULL, **pp;

	pthread_mutex_lock(&reg_mu);
	for (pp = &reg_head; *pp;) {
		struct idem_store *s = *pp;
		if (!base || s->base == base) {
			*pp = s->next;
			s->next = gone;
			gone = s;
		} else {
			pp = &s->next;
		}
	}
	pthread_mutex_unlock(&reg_mu);
	while (gone) {
		struct idem_store *s = gone;
		gone = s->next;
		free(s->spec);
		s->ops->free(s);
	}
}

void idem_store_release_base(struct event_base *base)
{
	if (base)
		release_matching(base);
}

void idem_store_release_all(void)
{
	release_matching(NULL);
	store_memory_shutdown();
}
