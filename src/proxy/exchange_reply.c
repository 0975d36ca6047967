/*
 * exchange_reply: how an exchange ends (see exchange_impl.h): the response that reaches the
 * client — an upstream's, relayed with this hop's markers, or one retrygate makes (SPEC §5) —,
 * the 1xx and 101 heads, and once per request the accounting, the reconciliation record of an
 * unknown outcome (§12) and the access-log line. Called by every other part of the exchange;
 * calls go down only, to exchange_core.c (the state, the timers, the slots).
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "upstream/attempt.h"
#include "base/clock.h"
#include "proxy/exchange_impl.h"
#include "http/grpc.h"
#include "idempotency/idempotency.h"
#include "proxy/idem_job.h"
#include "base/loop.h"
#include "obs/reconcile.h"
#include "http/respond.h"
#include "obs/stats.h"
#include "state/budget_shared.h"
#include "state/upstream.h"
#include "base/util.h"

/* ------------------------------------------------------------------ helpers */

/* The one close rule of the exchange: the connection cannot carry another request when the
 * request body was not read whole — unless it is still streaming to the upstream whose
 * response this is (OURS: retrygate answers itself, so nothing will read the rest). */
bool ex_body_left_unread(const struct exchange *ex, bool ours)
{
	return reqbody_left_unread(&ex->rb, ours);
}

static const char *own_refusal(const struct exchange *ex)
{
	return ex->refused != RR_NONE && ex->refused != RR_NOT_LISTED ? refusal_name(ex->refused)
	                                                              : NULL;
}

/* ------------------------------------------------------------------ finishing */

/* SPEC §6: the claim's outcome, stored, kept or released; once (a settled job owns no
 * claim). IN_FLIGHT: an attempt cut in flight may have executed. */
static void idem_settle(struct exchange *ex, bool in_flight, bool complete)
{
	if (!ex->idem)
		return;
	/* SPEC §10: a gRPC response is stored by its grpc-status; none at all reads as UNKNOWN */
	int gs = !ex->grpc ? -1 : ex->att_grpc >= 0 ? ex->att_grpc : GRPC_UNKNOWN;
	/* SPEC §6: released at once when no attempt can have executed (the earlier ones were
	 * judged as they were retried) */
	bool refused = !ex->executed && !in_flight && ex->attempts > 0 &&
	               idem_not_executed(&ex->up->idem, ex->last_out, ex->last_att_status, gs);
	if (idem_job_settle(ex->idem, ex->last_att_status, gs, ex->reached || in_flight, refused,
	                    complete))
		STAT_INC(ex->us->idem[IS_STORED]);
}

/* The relayed response is whole once what is being handed to the client has gone: its
 * outcome is settled before those last bytes, so that the store has it (a Redis store: on
 * the wire) before the client can repeat the key at another replica (SPEC §6: the stored
 * response, not 409). */
static void idem_settle_before_end(struct exchange *ex)
{
	ex->idem_body_left = -1;
	idem_settle(ex, ex->att && attempt_wrote_any(ex->att), true);
}

/* Stop everything the exchange runs: timers, attempts, slots, the kept response, the claim
 * (a fault wait or a held gRPC head ends with the state). Used once, by ex_finish(),
 * ex_start_tunnel() or exchange_abort(). */
void ex_end(struct exchange *ex)
{
	/* an attempt cut in flight (the client went away) may have executed */
	bool in_flight = ex->att && attempt_wrote_any(ex->att);
	ex_set_state(ex, X_DONE);
	ex_release_slots(ex);
	ex_timers_stop(ex);
	if (ex->bs_op) {
		budget_shared_cancel(ex->bs_op);
		ex->bs_op = NULL;
	}
	attempt_free(ex->att);
	attempt_free(ex->relay);
	ex->att = ex->relay = NULL;
	saved_clear(&ex->saved);
	idem_settle(ex, in_flight, ex->resp_complete);
}

/* The facts the outcome is decided on (access_unknown_cause()), for the count and the line. */
static void log_facts(struct exchange *ex, int64_t now)
{
	ex->log.status = ex->resp_status;
	ex->log.attempts = ex->attempts;
	ex->log.refused = ex->refused;
	/* rule 4's idempotent paths are idempotent whatever the method (SPEC §10) */
	ex->log.non_idempotent = ex->mclass == MC_OTHER && !ex->idem_path;
	ex->log.last_out = ex->last_out;
	if (ex->grpc) {
		ex->log.grpc_status = grpc_client_code(ex->client_grpc, ex->resp_status,
		                                       ex->resp_complete);
		/* retrygate's own answers and replays name a reason: not the upstream's word */
		ex->log.grpc_answered = ex->client_grpc >= 0 && !ex->log.reason;
		/* a code of release_on says the call did not run: failed, not unknown (SPEC §6) */
		ex->log.not_executed = ex->log.grpc_answered &&
		                       idem_not_executed(&ex->up->idem, OUT_STATUS, 200,
		                                         ex->log.grpc_status);
	}
	ex->log.duration_us = now - ex->t0_us;
	ex->log.deadline_left_us = ex->deadline_us ? ex->deadline_us - now : 0;
}

/* The access-log line: once per request, however it ended. */
void ex_log_request(struct exchange *ex, int64_t now)
{
	log_facts(ex, now);
	accesslog_write(&ex->log);
}

/* SPEC §12: the unknown outcome goes to the reconciliation queue, once (ex_count_and_log runs
 * once), with CAUSE as its last_outcome. */
static void record_unknown(struct exchange *ex, const char *cause)
{
	struct reconcile_rec r = {
		.id = ex->reqid,
		.upstream = ex->up->name,
		.method = ex->req->method,
		.path = ex->req->path,
		.path_len = ex->req->path_len,
		.key = ex->log.key,
		.key_len = ex->log.keylen,
		.attempts = ex->attempts,
		.last_outcome = cause,
		.endpoint = ex->att_ep ? ex->att_ep->name : "",
	};
	reconcile_record(&r);
	STAT_INC(ex->us->reconcile_recorded);
}

/* The counts, and the access-log line, of a request that ended: the facts once for both. */
void ex_count_and_log(struct exchange *ex, int64_t now)
{
	int c = ex->resp_status / 100;
	if (c >= 1 && c <= 5)
		STAT_INC(g_gstats[ex->loop->id].requests[c]);
	if (ex->us && ex->attempts > 0)
		stats_observe_duration(ex->us, now - ex->t0_us);
	/* a gRPC error travels in a 200: its status says whether the call failed (SPEC §11's
	 * success rate counts it as a 5xx) */
	bool failed = ex->resp_status >= 500 || (ex->client_grpc >= 0 && !grpc_definite(ex->client_grpc));
	if (ex->us && ex->resp_status > 0)
		stats_window_response(ex->us, now, failed);
	log_facts(ex, now);
	if (ex->grpc)   /* what the client read, a 200 or not (SPEC §10) */
		STAT_INC(g_gstats[ex->loop->id].grpc_status[ex->log.grpc_status]);
	const char *cause = access_unknown_cause(&ex->log);
	if (ex->us && cause) {
		STAT_INC(ex->us->unknown_outcomes);
		record_unknown(ex, cause);
	}
	accesslog_write(&ex->log);
}

/* COMPLETE: the response went out whole; CLOSE: the connection must not be reused. */
void ex_finish(struct exchange *ex, bool complete, bool close)
{
	if (ex->state == X_DONE)
		return;
	ex_end(ex);
	ex_count_and_log(ex, clock_now_us());
	ex->rsp.end(ex->rsp.arg, complete, close || ex->close_after);
}

void ex_finish_error(struct exchange *ex, int status, const char *reason, bool close,
                         const char *retry_after)
{
	struct made_response m;
	bool cl = close || ex->close_after || ex_body_left_unread(ex, true);
	if (ex->grpc) {
		/* SPEC §10: a gRPC client gets a gRPC error (Trailers-Only), never a bare HTTP one */
		respond_grpc_error(&m, reason, ex->up ? ex->up->name : "", ex->attempts, own_refusal(ex));
		m.head.close = cl;
		int pb;
		ex->client_grpc = grpc_status_for_reason(reason, &pb);
		status = 200;
	} else {
		respond_error(&m, status, reason, ex->up ? ex->up->name : "", ex->attempts,
		              own_refusal(ex), retry_after, cl);
	}
	respond_request_id(&m.head, m.fields, (int)(sizeof(m.fields) / sizeof(m.fields[0])), ex->reqid);
	ex->resp_status = status;
	ex->log.reason = reason;
	ex->head_sent = true;
	ex->close_after = m.head.close;
	respond_send(&ex->rsp, &m.head, m.body, m.body_len);
	ex_finish(ex, true, false);
}

/* ------------------------------------------------------------------ response to the client */

void ex_send_head(struct exchange *ex, const struct http_head *h, enum refusal reason)
{
	const char *refused = reason != RR_NONE && reason != RR_NOT_LISTED ? refusal_name(reason) : NULL;
	if (ex_body_left_unread(ex, false))
		ex->close_after = true;
	struct relayed_head rh;
	respond_relayed(&rh, h, ex->attempts, refused, ex->close_after, false);
	respond_request_id(&rh.head, rh.fields, (int)(sizeof(rh.fields) / sizeof(rh.fields[0])), ex->reqid);
	if (h->end_stream && ex->grpc)
		ex->client_grpc = ex->att_grpc;
	idem_job_record_head(ex->idem, &rh.head);
	if (ex->idem) {
		ex->idem_body_left = h->content_length;
		if (h->end_stream || h->content_length == 0)
			idem_settle_before_end(ex);
	}
	ex->head_sent = true;
	ex->resp_status = h->status;
	ex->log.ok_response = true;
	ex->rsp.head(ex->rsp.arg, &rh.head);
}

void ex_relay_body(struct exchange *ex, struct evbuffer *data)
{
	size_t n = evbuffer_get_length(data);
	if (n == 0)
		return;
	idem_job_record_body(ex->idem, data);
	if (ex->idem && ex->idem_body_left > 0 && (ex->idem_body_left -= (int64_t)n) <= 0)
		idem_settle_before_end(ex);
	ex->rsp.body(ex->rsp.arg, data);
}

/* The response of attempt A goes to the client. */
void ex_relay_from(struct exchange *ex, struct attempt *a, const struct http_head *h,
                       enum refusal reason)
{
	ex_set_state(ex, X_RELAY);
	ex->relay = a;
	if (ex->att == a)
		ex->att = NULL;
	ex_send_head(ex, h, reason);
}

/* Trailer fields after the body (HTTP/2 to HTTP/2; the HTTP/1 codec drops them). */
void ex_relay_trailers(struct exchange *ex, const struct http_hdr *t, int n)
{
	if (ex->grpc)
		ex->client_grpc = ex->att_grpc;
	idem_job_record_trailers(ex->idem, t, n);
	if (ex->idem)
		idem_settle_before_end(ex);
	ex->rsp.trailers(ex->rsp.arg, t, n);
}

void ex_relay_complete(struct exchange *ex)
{
	ex->resp_complete = true;
	ex_finish(ex, true, false);
}

void ex_relay_saved(struct exchange *ex, enum refusal reason)
{
	struct saved_response *s = &ex->saved;
	if (s->complete && s->ntrailers == 0)
		s->h.content_length = (int64_t)evbuffer_get_length(s->body);
	if (ex->grpc)
		ex->att_grpc = s->grpc_status;      /* the status the client gets is the kept one's */
	ex_set_state(ex, X_RELAY);
	ex_send_head(ex, &s->h, reason);
	ex_relay_body(ex, s->body);
	if (s->complete) {
		if (s->ntrailers > 0)
			ex_relay_trailers(ex, s->trailers, s->ntrailers);
		ex_relay_complete(ex);
		return;
	}
	/* its attempt is still collecting (or paused, full): from now on it streams to the client */
	ex->relay = s->a;
	s->a = NULL;
	s->valid = false;
	attempt_resume(ex->relay);
}

void ex_deliver_last(struct exchange *ex)
{
	if (ex->saved.valid) {
		ex_relay_saved(ex, ex->refused);
		return;
	}
	switch (ex->last_out) {
	case OUT_CONNECT_FAILURE:
		ex_finish_error(ex, 502, "connect-failure", false, NULL);
		break;
	case OUT_TIMEOUT:
		ex_finish_error(ex, 504, "timeout", false, NULL);
		break;
	default:
		ex_finish_error(ex, 502, ex->last_bad ? "bad-response" : "reset", false, NULL);
		break;
	}
}

/* ------------------------------------------------------------------ 1xx and 101 */

/* 101 to an Upgrade request: relay the head, hand the raw connection to the codec. */
void ex_start_tunnel(struct exchange *ex, struct attempt *a, const struct http_head *h)
{
	STAT_INC(ex->us->responses[1]);
	access_set_status(&ex->log, 101);
	struct relayed_head rh;
	respond_relayed(&rh, h, ex->attempts, NULL, false, true);
	respond_request_id(&rh.head, rh.fields, (int)(sizeof(rh.fields) / sizeof(rh.fields[0])), ex->reqid);
	struct stream *ubev = attempt_take_stream(a);
	ex->att = NULL;
	attempt_free(a);
	ex->resp_status = 101;
	ex->last_out = OUT_STATUS;
	ex->log.ok_response = true;
	ex->head_sent = true;
	ex_end(ex);
	ex_count_and_log(ex, clock_now_us());
	ex->rsp.tunnel(ex->rsp.arg, &rh.head, ubev);
}

/* 1xx: 100 only for a client that asked (and that we did not answer ourselves), 103 always;
 * the codec drops them where its protocol does not allow them. */
void ex_relay_informational(struct exchange *ex, const struct http_head *h)
{
	if (ex->head_sent)
		return;
	bool asked = h->status == 100 && ex->req->expect_continue && ex->rb.mode == BODY_STREAM;
	if (!asked && h->status != 103)
		return;
	struct resp_head rh = {
		.status = h->status, .reason = h->reason, .reason_len = h->reason_len,
		.hdrs = h->hdrs, .nhdrs = h->status == 103 ? h->nhdrs : 0, .content_length = -1,
	};
	ex->rsp.informational(ex->rsp.arg, &rh);
}

