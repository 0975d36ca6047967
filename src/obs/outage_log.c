/*
 * outage_log: the rate-limited WARN lines of an upstream in trouble (outage_log.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "obs/outage_log.h"

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

bool outage_due(struct outage_log *o, enum outage_kind k, int64_t now_us)
{
	return log_every(&o->last_us[k], now_us, OUTAGE_LOG_PERIOD_US);
}

/* "name N" to P for each listed value whose figure moved since the last line (NOW[i] - WAS[i]),
 * which then becomes NOW; the total moved. */
static uint64_t put_moved(char **p, char *end, const char *const *names, const int *index,
                          int n, const uint64_t *now, uint64_t *was)
{
	uint64_t total = 0;
	for (int i = 0; i < n; i++) {
		uint64_t d = now[index[i]] - was[index[i]];
		was[index[i]] = now[index[i]];
		if (!d)
			continue;
		total += d;
		if (*p < end)
			*p += snprintf(*p, (size_t)(end - *p), "%s%s %" PRIu64, total == d ? "" : ", ",
			               names[i], d);
	}
	return total;
}

#define X_NAME(i, v) v,
#define X_INDEX(i, v) i,
static const char *const out_names[] = { OUTCOME_VALUES(X_NAME) "5xx", "grpc-error" };
static const int out_index[] = { OUTCOME_VALUES(X_INDEX) OUTAGE_5XX, OUTAGE_GRPC };
static const char *const refused_names[] = { REFUSED_VALUES(X_NAME) };
static const int refused_index[] = { REFUSED_VALUES(X_INDEX) };
static const char *const rejected_names[] = { REJECTED_VALUES(X_NAME) };
static const int rejected_index[] = { REJECTED_VALUES(X_INDEX) };
#undef X_NAME
#undef X_INDEX
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

void outage_write(struct outage_log *o, enum outage_kind k, const struct outage_subject *u,
                  int64_t now_us)
{
	uint64_t fail[OUTAGE_NFAIL] = { 0 }, refused[RR_NREASONS] = { 0 }, rejected[NREJ] = { 0 };
	for (int w = 0; w < g_nworkers; w++) {
		const struct ustats *p = &u->per_worker[w];
		for (int i = OUT_CONNECT_FAILURE; i < OUT_STATUS; i++)
			fail[i] += LOAD(p->outcomes[i]);
		fail[OUTAGE_5XX] += LOAD(p->responses[5]);
		for (int i = 1; i < GRPC_NCODES; i++)
			if (outage_grpc_failure(i))
				fail[OUTAGE_GRPC] += LOAD(p->grpc_responses[i]);
		for (int i = 0; i < RR_NREASONS; i++)
			refused[i] += LOAD(p->refused[i]);
		for (int i = 0; i < NREJ; i++)
			rejected[i] += LOAD(p->rejected[i]);
	}
	char since[48], what[400], *p = what, *end = what + sizeof(what);
	if (o->since_us[k])
		snprintf(since, sizeof(since), "in the last %.1f s",
		         (double)(now_us - o->since_us[k]) / 1e6);
	else
		snprintf(since, sizeof(since), "since start");
	o->since_us[k] = now_us;
	what[0] = 0;
	if (k == OUTAGE_FAILURES) {
		uint64_t n = put_moved(&p, end, out_names, out_index, NELEM(out_names), fail, o->fail);
		if (n)
			log_warn("upstream %s: %" PRIu64 " attempts failed %s (%s); retry budget %.1f of %.0f "
			         "tokens left", u->name, n, since, what, u->tokens, u->max_tokens);
	} else {
		uint64_t n = put_moved(&p, end, refused_names, refused_index, NELEM(refused_names),
		                       refused, o->refused);
		char rej[160], *q = rej;
		rej[0] = 0;
		uint64_t m = put_moved(&q, rej + sizeof(rej), rejected_names, rejected_index,
		                       NELEM(rejected_names), rejected, o->rejected);
		if (n || m)
			log_warn("upstream %s: %" PRIu64 " retries refused (%s) and %" PRIu64 " requests "
			         "rejected (%s) %s; retry budget %.1f of %.0f tokens left", u->name, n,
			         n ? what : "none", m, m ? rej : "none", since, u->tokens, u->max_tokens);
	}
	/* the next line's winner reads the figures kept above after this store */
	atomic_store_explicit(&o->last_us[k], now_us ? now_us : 1, memory_order_release);
}
