/*
 * exchange: one request, from its parsed head to the last byte of its response (see
 * exchange.h). This file is the top of the exchange: the codec's side, the attempt's news
 * (the attempt_cbs it hands out), the deadline. The states (enum xstate, exchange_impl.h):
 *
 *   X_NEW --buffered body--> X_WAIT_BODY --body end--+
 *     |                           |                  v
 *     +--no body, streamed body---|-------------> (X_CLAIM) --claimed--> start an attempt
 *                                 +--outgrew retry.max_body (streams on)--> start an attempt
 *
 *   start an attempt --fault drawn--> X_FAULT_WAIT --delay over--> X_ATTEMPT
 *          |                              +--abort--> ex_judge_status()
 *          +--------> X_ATTEMPT           +--connect-failure, cut delay--> ex_decide()
 *
 *   X_ATTEMPT --gRPC 200 head, no END_STREAM--> X_HELD --first message--> X_RELAY
 *       |                                          |
 *       |                                          +--trailers, end--> ex_decide()
 *       +--head--> ex_judge_status() --relay--> X_RELAY
 *       +--retried status, failure-------------------------------------------------> ex_decide()
 *
 *   ex_decide() --retry--> X_BACKOFF --backoff timer--> start an attempt
 *        +--no retry--> X_RELAY (a response: relayed, or the one kept) or X_DONE (one of ours)
 *
 *   and from anywhere: X_DONE, only by ex_end() (ex_finish(): the responder's end() reported
 *   once; ex_start_tunnel(); exchange_abort(); exchange_expire()). The deadline ends every state but X_RELAY.
 *
 * SPEC §14 hedges run beside ex->att in X_ATTEMPT, or in X_FAULT_WAIT while it waits out a
 * delay (exchange_hedge.c): the first head of any of them makes its attempt ex->att, so the
 * diagram reads the same; entering X_RELAY or X_DONE cancels the others, and a retryable end
 * hands ex->att to one still running (or still in its fault's wait: X_FAULT_WAIT again). A
 * hedge draws its own fault: when its wait ends it takes ex->att's place in X_FAULT_WAIT.
 *
 * X_FAULT_WAIT and X_HELD are waits inside one attempt (a drawn fault's delay; a gRPC head
 * whose outcome the next frame decides). Leaving either, to whatever state, undoes it in
 * ex_set_state(): so the deadline, the client going away or a too-large body never look at
 * them, they only change the state.
 *
 * Calls go down (exchange_impl.h lists the order): this file calls exchange_grpc.c,
 * exchange_retry.c, exchange_reply.c and exchange_core.c, and none of them calls back into it
 * except through the attempt_cbs in ex->att_cbs. The decision is retry_decide(), every
 * response it makes is respond.c's, the client's wire format is the responder's, the
 * idempotency claim is an idem_job.
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>

#include "obs/accesslog.h"
#include "proxy/admit.h"
#include "upstream/attempt.h"
#include "base/clock.h"
#include "config/config.h"
#include "policy/deadline.h"
#include "proxy/exchange.h"
#include "proxy/exchange_impl.h"
#include "policy/faults.h"
#include "proxy/forward.h"
#include "http/grpc.h"
#include "http/h1_parser.h"
#include "proxy/idem_job.h"
#include "base/log.h"
#include "base/loop.h"
#include "obs/reconcile.h"
#include "proxy/reqbody.h"
#include "http/respond.h"
#include "policy/retry.h"
#include "proxy/saved_response.h"
#include "obs/stats.h"
#include "state/runtime.h"
#include "state/upstream.h"
#include "base/util.h"

static void exchange_go(struct exchange *ex);

static const struct attempt_cbs attempt_callbacks;

/* ------------------------------------------------------------------ attempt callbacks */

static void att_head(void *arg, struct attempt *a, const struct http_head *h)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state == X_DONE || (a != ex->att && !ex_hedge_head(ex, a, h)))
		return;
	if (h->status >= 100 && h->status < 200 && h->status != 101) {
		ex_relay_informational(ex, h);
		return;
	}
	if (h->status == 101 && ex->req->upgrade) {
		ex_start_tunnel(ex, a, h);
		return;
	}
	if (ex->fault && ex->fault->kind == FAULT_LOST_RESPONSE) {
		/* SPEC §11: the upstream processed it; its response is thrown away and the connection
		 * closed (ex_decide() frees the attempt, which never pools it): a reset */
		STAT_INC(ex->us->outcomes[OUT_RESET]);
		access_set_outcome(&ex->log, outcome_name(OUT_RESET));
		ex->reached = true;
		ex_decide(ex, OUT_RESET, NULL, false);
		return;
	}
	if (h->status == 101) {
		/* an unsolicited 101: an invalid response */
		STAT_INC(ex->us->outcomes[OUT_RESET]);
		access_set_outcome(&ex->log, "bad-response");
		ex_decide(ex, OUT_RESET, NULL, true);
		return;
	}
	STAT_INC(ex->us->responses[h->status / 100]);
	/* SPEC §14: a first attempt's head latency, for a p95/p99 hedge delay (kept only where
	 * one is configured: it costs an atomic add on a line all workers share) */
	if ((ex->retry->hedge_pct || ex->up->retry.hedge_pct) && ex->log.cur == 0) {
		int64_t now = clock_now_us();
		latency_hist_add(&ex->st->head_lat, now, now - ex->att_t0_us);
	}
	if (!ex->grpc || h->status != 200)
		ex_report_health(ex, OUT_STATUS, h);  /* a gRPC 200 reports once its outcome is known */
	access_set_status(&ex->log, h->status);
	ex->last_out = OUT_STATUS;      /* the last attempt answered (a reset before is history) */
	ex->last_att_status = h->status;
	ex->reached = true;
	if (ex->grpc && h->status == 200 && ex_grpc_head(ex, a, h))
		return;
	ex_judge_status(ex, a, h);
}

static void att_body(void *arg, struct attempt *a, struct evbuffer *data)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state == X_HELD && a == ex->att && evbuffer_get_length(data) > 0)
		ex_grpc_commit(ex, a);
	if (ex->state != X_DONE && a == ex->saved.a) {
		size_t have = evbuffer_get_length(ex->saved.body);
		size_t cap = (size_t)ex->retry->max_body;
		size_t n = evbuffer_get_length(data);
		if (have + n > cap) {
			/* Too big to keep in memory: keep what fits, leave the rest unread on its
			 * paused connection. If no later attempt answers, it streams from there. */
			evbuffer_remove_buffer(data, ex->saved.body, cap > have ? cap - have : 0);
			attempt_pause(a);
			return;
		}
		loop_buf_hold(ex->saved.body, data);
		return;
	}
	if (ex->state != X_RELAY || a != ex->relay) {
		evbuffer_drain(data, evbuffer_get_length(data));
		return;
	}
	ex_relay_body(ex, data);
	if (ex->rsp.queued(ex->rsp.arg) > CLIENT_HIGH)
		attempt_pause(a);
}

static void att_trailers(void *arg, struct attempt *a, const struct http_hdr *t, int n)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state == X_DONE)
		return;
	if (ex->state == X_HELD && a == ex->att) {
		ex_grpc_trailers(ex, a, t, n);
		return;
	}
	if (a == ex->saved.a) {
		saved_keep_trailers(&ex->saved, t, n);
		return;
	}
	if (ex->state == X_RELAY && a == ex->relay) {
		if (ex->grpc)
			ex_grpc_outcome(ex, t, n);  /* a committed call's final status, for the count */
		ex_relay_trailers(ex, t, n);
	}
}

static void att_drain(void *arg, struct attempt *a)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state != X_DONE && (ex->rb.mode == BODY_STREAM || ex->rb.mode == BODY_TEE) &&
	    !ex->rb.done)
		ex->rsp.want_body(ex->rsp.arg);
}

static void att_end(void *arg, struct attempt *a, enum outcome out, bool bad, const char *detail)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state == X_DONE)
		return;
	if (a == ex->saved.a) {
		ex->saved.a = NULL;
		if (out == OUT_NONE)
			ex->saved.complete = true;
		else
			saved_clear(&ex->saved);
		attempt_free(a);
		return;
	}
	if (a == ex->relay) {
		ex->relay = NULL;
		attempt_free(a);
		if (out == OUT_NONE) {
			ex_relay_complete(ex);
		} else {
			slog(LOG_WARN, ex->ci.sid, "upstream %s: %s: response cut short", ex->up->name, detail);
			/* a committed gRPC call cut before its status: it may not have finished, a
			 * reset for its outcome (SPEC §10); an HTTP response's status already said */
			if (ex->grpc && ex->client_grpc < 0)
				ex->last_out = OUT_RESET;
			ex_finish(ex, false, true);    /* never pad or complete a truncated body */
		}
		return;
	}
	if (a != ex->att && !ex_hedge_end(ex, a, bad ? OUT_RESET : out))
		return;
	if (ex->state == X_HELD && ex_grpc_end(ex, a, out))
		return;
	if (out != OUT_CONNECT_FAILURE)
		ex->reached = true;
	STAT_INC(ex->us->outcomes[bad ? OUT_RESET : out]);
	ex_report_health(ex, bad ? OUT_RESET : out, NULL);
	access_set_outcome(&ex->log, bad ? "bad-response" : outcome_name(out));
	slog(LOG_DEBUG, ex->ci.sid, "upstream %s attempt %d to %s: %s (%s)", ex->up->name, ex->attempts,
	     attempt_peer(a), bad ? "bad-response" : outcome_name(out), detail ? detail : "");
	ex_decide(ex, bad ? OUT_RESET : out, NULL, bad);
}

static const struct attempt_cbs attempt_callbacks = {
	.on_head = att_head,
	.on_body = att_body,
	.on_trailers = att_trailers,
	.on_drain = att_drain,
	.on_end = att_end,
};

/* ------------------------------------------------------------------ deadline */

static void deadline_cb(void *arg)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state == X_DONE || ex->state == X_RELAY)
		return;     /* a response whose head arrived in time is not cut off */
	if (reqbody_left_unread(&ex->rb, true))
		ex->close_after = true;
	if (ex->att) {
		/* SPEC §4: cut before any byte was written it is a connect-failure, else a timeout */
		enum outcome o = attempt_wrote_any(ex->att) ? OUT_TIMEOUT : OUT_CONNECT_FAILURE;
		STAT_INC(ex->us->outcomes[o]);
		ex->last_out = o;
		access_set_outcome(&ex->log, outcome_name(o));
		attempt_free(ex->att);
		ex->att = NULL;
	} else if (ex->state == X_FAULT_WAIT) {
		/* a fault's attempt: a delay cut is a timeout (SPEC §11), the rest sent nothing */
		enum outcome o = ex->fault->kind == FAULT_DELAY ? OUT_TIMEOUT : OUT_CONNECT_FAILURE;
		STAT_INC(ex->us->outcomes[o]);
		ex->last_out = o;
		access_set_outcome(&ex->log, outcome_name(o));
	}
	/* what follows leaves the state: a held head or a fault wait ends there */
	ex_release_slots(ex);
	if (ex->saved.valid) {
		ex->refused = RR_DEADLINE;
		STAT_INC(ex->us->refused[RR_DEADLINE]);
		ex_relay_saved(ex, RR_DEADLINE);
		return;
	}
	ex_finish_error(ex, 504, "deadline-exceeded", false, NULL);
}

/* ------------------------------------------------------------------ the codec's side */

/* Every request zeroes one: past 2 KiB glibc's memset turns to `rep stosb` (an instruction per
 * byte under callgrind, slower to start on the CPU). Rarely used parts are allocated apart
 * (held gRPC heads, hedges, fault answers). */
_Static_assert(sizeof(struct exchange) <= 2048, "struct exchange outgrew 2 KiB");

struct exchange *exchange_new(struct loop *loop, struct runtime *rt, struct cfg_listener *l,
                              const struct client_info *ci, const struct http_head *req,
                              const struct responder *rsp)
{
	struct exchange *ex = loop_obj_get(loop, LOOP_EXCHANGE, sizeof(*ex));
	atomic_fetch_add(&g_gstats[loop->id].exchanges_active, 1);
	ex->magic = EXCHANGE_MAGIC;
	ex->loop = loop;
	ex->att_cbs = &attempt_callbacks;
	ex->hedge_cb = ex_hedge_timer_cb;
	ex->rt = runtime_ref(rt);
	ex->l = l;
	ex->ci = *ci;
	size_t plen = strlen(ci->peer_ip ? ci->peer_ip : "");
	if (plen >= sizeof(ex->peer_ip))
		plen = sizeof(ex->peer_ip) - 1;
	memcpy(ex->peer_ip, ci->peer_ip ? ci->peer_ip : "", plen);
	ex->ci.peer_ip = ex->peer_ip;
	ex->req = req;
	ex->rsp = *rsp;
	ex->t0_us = clock_now_us();
	ex->att_grpc = ex->client_grpc = -1;
	ex->pushback_us = -1;
	reqbody_init(&ex->rb, loop_buf_get(loop), req->chunked || req->content_length > 0, BODY_NONE);
	forward_request_id(req, ex->reqid, &loop->rng);
	access_begin(&ex->log, ci->sid, ex->peer_ip, req, ex->reqid);
	return ex;
}

void exchange_start(struct exchange *ex)
{
	const struct http_head *r = ex->req;
	struct admission ad;
	admit_request(ex->l, r, &ad);
	if (ad.route) {
		ex->up = ad.route->upstream;
		ex->retry = ad.route->retry;
		ex->deadline = ad.route->deadline;
		ex->ub = runtime_upstream(ex->rt, ex->up);
		ex->st = ex->ub->st;
		ex->us = &ex->st->stats[ex->loop->id];
		access_set_route(&ex->log, ad.route, ex->up->name);
	}
	ex->given_us = ad.budget_us;
	ex->deadline_us = ex->t0_us + ad.budget_us;
	ex->log.deadline_given_us = ad.budget_us;
	memcpy(ex->dl_present, ad.dl_present, sizeof(ex->dl_present));
	ex->req_nested = ad.nested;
	ex->mclass = ad.mclass;
	ex->has_key = ad.key != NULL;
	if (ex->has_key)
		access_set_key(&ex->log, ad.key, ad.keylen);
	ex->enforce_idem = ad.idem;
	ex->grpc = ad.grpc;
	ex->idem_path = ad.idempotent_path;
	ex->rb.mode = ex->rb.present ? ad.bmode : BODY_NONE;
	/* SPEC §10: a gRPC call's messages go upstream as they come (a streaming peer may wait
	 * for answers before it sends more), kept for replay while they fit retry.max_body;
	 * enforcement here needs the whole body for its fingerprint, so it still buffers */
	if (ex->grpc && ex->rb.mode == BODY_BUFFER && !ex->enforce_idem)
		ex->rb.mode = BODY_TEE;
	if (ad.status) {
		if (ad.too_late)
			STAT_INC(ex->us->rejected[REJ_DEADLINE]);
		ex_finish_error(ex, ad.status, ad.reason, ad.close, NULL);
		return;
	}
	loop_timer_add(ex->loop, &ex->deadline_t, ex->given_us, deadline_cb, ex);

	if (ex->rb.mode == BODY_BUFFER) {
		/* we want the whole body before the first attempt: say so ourselves */
		if (r->expect_continue) {
			struct resp_head cont = { .status = 100, .content_length = -1 };
			ex->rsp.informational(ex->rsp.arg, &cont);
		}
		ex_set_state(ex, X_WAIT_BODY);
		return;
	}
	exchange_go(ex);
}

/* The claim's answer (from the event loop, never inside the claim call). */
static void idem_claimed_cb(void *arg, enum idem_result r, const struct idem_response *stored)
{
	struct exchange *ex = arg;
	MAGIC_CHECK(ex, EXCHANGE_MAGIC);
	if (ex->state != X_CLAIM)
		return;
	switch (r) {
	case IDEM_CLAIMED:
		ex_start_first(ex);
		return;
	case IDEM_REPLAY: {
		STAT_INC(ex->us->idem[IS_REPLAYED]);
		struct idem_replay m;
		idem_replay(&m, stored);
		respond_request_id(&m.head, m.fields, (int)(sizeof(m.fields) / sizeof(m.fields[0])),
		                   ex->reqid);
		ex->resp_status = stored->status;
		if (ex->grpc) {
			/* the stored call's status, as its client reads it (SPEC §10's count) */
			int c = grpc_status_field(m.trailers, m.ntrailers);
			ex->client_grpc = c >= 0 ? c : grpc_status_field(m.head.hdrs, m.head.nhdrs);
			ex->resp_complete = true;
		}
		ex->log.reason = "idempotency-replayed";
		ex->head_sent = true;
		idem_replay_send(&ex->rsp, &m, stored->body);
		ex_finish(ex, true, false);
		return;
	}
	case IDEM_MISMATCH:
		STAT_INC(ex->us->idem[IS_MISMATCH]);
		ex_finish_error(ex, 422, "idempotency-key-mismatch", false, NULL);
		return;
	case IDEM_IN_PROGRESS:
		STAT_INC(ex->us->idem[IS_CONFLICT]);
		ex_finish_error(ex, 409, "idempotency-in-progress", false, NULL);
		return;
	case IDEM_UNAVAILABLE:
		ex_finish_error(ex, 503, "idempotency-store-unavailable", false, NULL);
		return;
	}
}

/* The request may go: claim its key first when this hop enforces idempotency. */
static void exchange_go(struct exchange *ex)
{
	const struct cfg_idempotency *ic = &ex->up->idem;
	if (!ex->enforce_idem) {
		ex_start_first(ex);
		return;
	}
	const char *err = NULL;
	ex_set_state(ex, X_CLAIM);
	ex->idem = idem_job_claim(ex->loop, ic, ex->up->name, ex->req, ex->rb.buf, idem_claimed_cb, ex,
	                          &err);
	if (!ex->idem) {
		slog(LOG_ERROR, ex->ci.sid, "idempotency store %s: %s", ic->store, err ? err : "unavailable");
		ex_finish_error(ex, 503, "idempotency-store-unavailable", false, NULL);
	}
}

static struct attempt *streaming_attempt(const struct exchange *ex)
{
	return ex->att ? ex->att : ex->relay;
}

void exchange_body(struct exchange *ex, struct evbuffer *data)
{
	if (ex->state == X_DONE) {
		ex->rb.len += (int64_t)evbuffer_get_length(data);
		ex->log.body_bytes = ex->rb.len;
		evbuffer_drain(data, evbuffer_get_length(data));
		return;
	}
	int64_t keep = ex->enforce_idem ? ex->up->idem.max_body : ex->retry->max_body;
	enum reqbody_event e = reqbody_take(&ex->rb, data, ex->l->limits.max_body, keep,
	                                    ex->enforce_idem, streaming_attempt(ex));
	ex->log.body_bytes = ex->rb.len;
	if (e == RB_OUTGREW) {
		ex_start_first(ex);
	} else if (e == RB_OVER_LIMIT && ex->head_sent) {
		ex_finish(ex, false, true);
	} else if (e == RB_OVER_LIMIT) {
		attempt_free(ex->att);
		ex->att = NULL;
		ex_finish_error(ex, 413, "body-too-large", true, NULL);
	}
}

void exchange_trailers(struct exchange *ex, const struct http_hdr *t, int n)
{
	/* SPEC §9: trailers cross only between HTTP/2 peers; an HTTP/1 upstream gets none (§8).
	 * Kept for every attempt; the one streaming now gets them before the body ends. */
	if (ex->state == X_DONE || n <= 0 || ex->req_trailers || !ex->up ||
	    ex->up->protocol != UP_H2)
		return;
	saved_copy_fields(t, n, &ex->req_trailers, &ex->req_tmem, 0);
	ex->nreq_trailers = n;
	struct attempt *a = streaming_attempt(ex);
	if (a && (ex->rb.mode == BODY_STREAM || ex->rb.mode == BODY_TEE))
		attempt_send_trailers(a, ex->req_trailers, n);
}

void exchange_body_end(struct exchange *ex)
{
	if (ex->state == X_DONE) {
		ex->rb.done = true;
		return;
	}
	reqbody_end(&ex->rb, streaming_attempt(ex));
	if (ex->rb.mode == BODY_BUFFER && ex->state == X_WAIT_BODY)
		exchange_go(ex);
}

size_t exchange_body_room(const struct exchange *ex)
{
	if (ex->state == X_DONE)
		return 64 * 1024;       /* discard what is left, the connection closes after */
	return reqbody_room(&ex->rb, streaming_attempt(ex));
}

void exchange_client_drained(struct exchange *ex)
{
	if (ex->state == X_RELAY && ex->relay)
		attempt_resume(ex->relay);
}

void exchange_abort(struct exchange *ex)
{
	if (ex->state == X_DONE)
		return;
	if (ex->us && (ex->att || ex->relay || ex->state == X_BACKOFF))
		STAT_INC(ex->us->client_aborts);
	ex->log.client_abort = true;
	if (!ex->head_sent)
		ex->resp_status = 499;  /* nginx's "client closed request", for the log only */
	ex_end(ex);
	ex_log_request(ex, clock_now_us());
}

void exchange_expire(struct exchange *ex)
{
	if (ex->state == X_DONE)
		return;
	/* the attempt awaiting its head may have executed: no answer within the time there was
	 * is a timeout, which for a non-idempotent request leaves the outcome unknown, recorded
	 * for reconciliation (ex_count_and_log) as any other timeout */
	if (ex->att && (ex->state == X_ATTEMPT || ex->state == X_HELD) &&
	    attempt_wrote_any(ex->att)) {
		ex->last_out = OUT_TIMEOUT;
		ex->reached = true;
		STAT_INC(ex->us->outcomes[OUT_TIMEOUT]);
		access_set_outcome(&ex->log, outcome_name(OUT_TIMEOUT));
	}
	ex_finish(ex, false, true);
}

static void exchange_free_cb(void *p)
{
	struct exchange *ex = p;
	ex->magic = 0;
	loop_obj_put(ex->loop, LOOP_EXCHANGE, ex);
}

void exchange_free(struct exchange *ex)
{
	if (!ex)
		return;
	if (ex->state != X_DONE)
		exchange_abort(ex);
	/* its timers were stopped by ex_end(), which ran (X_DONE is terminal and only ex_end()
	 * sets it, and nothing arms a timer without leaving a state first) */
	loop_buf_put(ex->loop, ex->rb.buf);
	free(ex->req_trailers);
	free(ex->req_tmem);
	free(ex->hedging);
	free(ex->fault_ans);
	idem_job_free(ex->idem);
	upstream_ep_keep(&ex->att_ep, NULL);
	upstream_ep_keep(&ex->next_ep, NULL);
	runtime_unref(ex->rt);
	atomic_fetch_sub(&g_gstats[ex->loop->id].exchanges_active, 1);
	loop_defer_free(ex->loop, exchange_free_cb, ex);
}
