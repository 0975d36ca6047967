/*
 * exchange_grpc: SPEC §10 applied to a gRPC call's attempts (see exchange_impl.h). A 200 head
 * names no outcome yet: Trailers-Only names it at once; any other head is held until the
 * first message commits the call (gRFC A6: relayed, never retried) or trailers that follow
 * with no message name its grpc-status, which is then judged like an HTTP status by the same
 * ex_decide(). grpc-retry-pushback-ms is the Retry-After of such an outcome. The per-try
 * timeout bounds the wait for the head only: a held head waits on until the deadline.
 *
 * The held head is the state X_HELD: entered here, left by whatever comes first (a message,
 * trailers, the attempt's end, the deadline, the client going away), and
 * leaving it frees the head (ex_set_state()); the paths here that relay or keep the head take
 * it out of the exchange first. Called by exchange.c; calls go down only, to exchange_retry.c
 * (ex_decide()), exchange_reply.c and exchange_core.c.
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>

#include "upstream/attempt.h"
#include "base/clock.h"
#include "config/config.h"
#include "proxy/exchange_impl.h"
#include "http/grpc.h"
#include "base/loop.h"
#include "obs/stats.h"
#include "state/endpoint.h"
#include "base/util.h"

/* A gRPC status for passive health: the server-side failures count as a 5xx would (as Envoy
 * maps them: UNAVAILABLE 503, INTERNAL/UNKNOWN/DATA_LOSS 500, DEADLINE_EXCEEDED 504), and a
 * pushback is a Retry-After. Everything else is the service answering. */
static void report_health_grpc(struct exchange *ex, int code)
{
	bool failed = code == GRPC_UNAVAILABLE || code == GRPC_INTERNAL || code == GRPC_UNKNOWN ||
	              code == GRPC_DATA_LOSS || code == GRPC_DEADLINE_EXCEEDED;
	bool hinted = failed && ex->pushback_us >= 0 && ex->retry->retry_after_honor;
	ex_report_health_as(ex, OUT_STATUS, failed ? 503 : 200, hinted);
	if (failed && !hinted)
		upstream_ep_failure_grpc(ex->att_ep, code);    /* /stats: its name, not "503" */
}

/* The grpc-status (and grpc-retry-pushback-ms) among an attempt's response fields F[N]:
 * counted and logged per attempt. Returns the code, or -1 when there is none. */
int ex_grpc_outcome(struct exchange *ex, const struct http_hdr *f, int n)
{
	int code = -1;
	int64_t pb = -1;
	for (int i = 0; i < n; i++) {
		enum grpc_field k = grpc_field_kind(f[i].name, f[i].nlen);
		if (k == GRPC_F_STATUS) {
			code = grpc_status_parse(f[i].value, f[i].vlen);
		} else if (k == GRPC_F_PUSHBACK) {
			int64_t us;
			pb = grpc_pushback_parse(f[i].value, f[i].vlen, &us) ? us : -2;
		}
	}
	if (code < 0)
		return -1;
	ex->att_grpc = code;
	ex->pushback_us = pb;
	STAT_INC(ex->us->grpc_responses[code]);
	access_set_grpc_status(&ex->log, code);
	if (ex->state == X_ATTEMPT || ex->state == X_HELD)
		report_health_grpc(ex, code);   /* a committed call reported when it committed */
	return code;
}

/* The gRPC attempt A's outcome is its grpc-status (ex->att_grpc): from Trailers-Only head H,
 * or from trailers T[N] that followed held head H with no DATA. Retry, or relay it whole. */
static void grpc_decide(struct exchange *ex, struct attempt *a, const struct http_head *h,
                        const struct http_hdr *t, int n)
{
	ex->dec_trailers = n > 0 ? t : NULL;
	ex->dec_ntrailers = n;
	ex_judge_status(ex, a, h);
	ex->dec_trailers = NULL;
	ex->dec_ntrailers = 0;
}

/* A gRPC call's 200 head without END_STREAM: held until DATA or trailers say what it is. The
 * per-try timeout bounded the wait for this head only (SPEC §10; the transport's head timer
 * stopped when it came): from here the call runs until its deadline, which the server was
 * told in grpc-timeout and enforces itself. */
static void grpc_hold(struct exchange *ex, const struct http_head *h)
{
	/* every call of a gRPC row passes here: one block, not a saved response's four
	 * allocations and a body buffer it never uses */
	size_t bytes = h->reason_len + 1;
	for (int i = 0; i < h->nhdrs; i++)
		bytes += h->hdrs[i].nlen + h->hdrs[i].vlen + 2;
	size_t arr = (size_t)h->nhdrs * sizeof(struct http_hdr);
	struct grpc_held *held = loop_blk_alloc(ex->loop, sizeof(*held) + arr + bytes);
	if (!held)
		abort();        /* out of memory: xmalloc's policy */
	held->loop = ex->loop;
	held->h = *h;
	held->h.hdrs = held->hdrs;
	char *p = (char *)held->hdrs + arr;
	if (h->reason_len > 0)
		memcpy(p, h->reason, h->reason_len);
	p[h->reason_len] = 0;
	held->h.reason = p;
	p += h->reason_len + 1;
	for (int i = 0; i < h->nhdrs; i++) {
		const struct http_hdr *f = &h->hdrs[i];
		held->hdrs[i] = *f;
		memcpy(p, f->name, f->nlen);
		p[f->nlen] = 0;
		held->hdrs[i].name = p;
		p += f->nlen + 1;
		memcpy(p, f->value, f->vlen);
		p[f->vlen] = 0;
		held->hdrs[i].value = p;
		p += f->vlen + 1;
	}
	ex->held = held;
	ex_set_state(ex, X_HELD);
}

/* The held head, out of the exchange for a path that relays or keeps it (leaving X_HELD then
 * frees nothing under it); the caller frees it with ex_held_free(). */
static struct grpc_held *held_take(struct exchange *ex)
{
	struct grpc_held *held = ex->held;
	ex->held = NULL;
	return held;
}

/* A gRPC call's 200 head H from attempt A. True when it was taken here: held, or its
 * Trailers-Only status decided; false: no grpc-status, an HTTP outcome after all. */
bool ex_grpc_head(struct exchange *ex, struct attempt *a, const struct http_head *h)
{
	if (!h->end_stream) {
		grpc_hold(ex, h);
		return true;
	}
	if (ex_grpc_outcome(ex, h->hdrs, h->nhdrs) >= 0) {
		grpc_decide(ex, a, h, NULL, 0);
		return true;
	}
	ex_report_health(ex, OUT_STATUS, h);
	return false;
}

/* The first response message of the held attempt A commits the call. */
void ex_grpc_commit(struct exchange *ex, struct attempt *a)
{
	ex_report_health_as(ex, OUT_STATUS, 200, false);
	struct grpc_held *held = held_take(ex);
	ex_relay_from(ex, a, &held->h, RR_NONE);
	ex_held_free(held);
}

/* Trailers T[N] right after the held head (linkerd2#7701): their status is the outcome. */
void ex_grpc_trailers(struct exchange *ex, struct attempt *a, const struct http_hdr *t, int n)
{
	bool named = ex_grpc_outcome(ex, t, n) >= 0;
	struct grpc_held *held = held_take(ex);
	if (named) {
		grpc_decide(ex, a, &held->h, t, n);
	} else {
		ex_report_health_as(ex, OUT_STATUS, 200, false);
		ex_relay_from(ex, a, &held->h, RR_NONE);
		ex_relay_trailers(ex, t, n);
	}
	ex_held_free(held);
}

/* The held attempt A ended with OUT. True when taken here: headers then an empty end (no
 * message, no status: relayed, the client judges it). A cut is a reset for the caller, whose
 * decision leaves X_HELD. */
bool ex_grpc_end(struct exchange *ex, struct attempt *a, enum outcome out)
{
	if (out != OUT_NONE)
		return false;
	struct grpc_held *held = held_take(ex);
	ex_relay_from(ex, a, &held->h, RR_NONE);
	ex_held_free(held);
	ex->relay = NULL;
	attempt_free(a);
	ex_relay_complete(ex);
	return true;
}
