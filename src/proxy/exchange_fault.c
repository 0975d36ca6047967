/*
 * exchange_fault: SPEC §11 faults applied to an exchange's attempts (see exchange_impl.h). The
 * draw and the rules are faults.c's (pure); here a drawn fault becomes the outcome the retry
 * rules then judge like the real thing: connect-failure and abort without sending anything,
 * a delay before the send (cut by the per-try timeout: a timeout), lost-response after it.
 * Calls go down only (exchange_core.c at most): what follows the fault's outcome is the
 * caller's, exchange_retry.c.
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "base/clock.h"
#include "proxy/exchange_impl.h"
#include "policy/faults.h"
#include "base/loop.h"
#include "http/h1_write.h"
#include "http/respond.h"
#include "obs/stats.h"
#include "state/upstream.h"
#include "base/util.h"

/* SPEC §11: the attempt's one draw, when this upstream's faults are on. An experiment past
 * stop.after injects nothing more, before the watcher has switched it off. */
const struct cfg_fault_rule *ex_fault_draw(struct exchange *ex, int64_t now)
{
	const struct cfg_faults *f = &ex->up->faults;
	if (f->nrules == 0 || ex->req->upgrade ||
	    !atomic_load_explicit(&ex->st->faults_on, memory_order_relaxed))
		return NULL;
	int64_t since = atomic_load_explicit(&ex->st->faults_since_us, memory_order_relaxed);
	if (f->stop_after_us > 0 && now - since >= f->stop_after_us)
		return NULL;
	return faults_pick(f, ex->req->method, ex->req->path, ex->req->path_len,
	                   rand_next(&ex->loop->rng));
}

/* Arm fault_ev (X_FAULT_WAIT) for a fault that sends nothing: when it fires, the attempt goes
 * out (a delay) or ex_fault_outcome() names its outcome. A delay the per-try timeout cuts is a
 * timeout (SPEC §11); one the deadline cuts ends in the exchange's deadline callback. */
void ex_fault_arm(struct exchange *ex, int64_t now)
{
	int64_t due = ex_fault_due(ex, ex->fault, now, &ex->fault_cut);
	struct timeval tv = clock_tv(due - now);
	evtimer_add(&ex->fault_ev, &tv);
}

static void fault_hdr(struct fault_answer *fa, int *n, const char *name, const char *value)
{
	fa->hdrs[(*n)++] = (struct http_hdr){ .name = name, .nlen = (uint32_t)strlen(name),
	                                      .value = value, .vlen = (uint32_t)strlen(value) };
}

/* abort: the response the upstream did not send (no body). A gRPC call hit by a rule with
 * grpc_status gets that code Trailers-Only, as a gRPC server reports an error (SPEC §11). */
static const struct http_head *fault_response(struct exchange *ex)
{
	const struct cfg_fault_rule *r = ex->fault;
	if (!ex->fault_ans)
		ex->fault_ans = xmalloc(sizeof(*ex->fault_ans));
	struct fault_answer *fa = ex->fault_ans;
	struct http_head *h = &fa->head;
	bool grpc = ex->grpc && r->grpc_status >= 0;
	memset(h, 0, sizeof(*h));
	int n = 0;
	fault_hdr(fa, &n, "X-Retrygate-Fault", "abort");
	if (grpc) {
		fa->nums[0][h1_fmt_int(fa->nums[0], r->grpc_status)] = '\0';
		fault_hdr(fa, &n, "content-type", "application/grpc");
		fault_hdr(fa, &n, "grpc-status", fa->nums[0]);
		fault_hdr(fa, &n, "grpc-message", "fault injected (abort)");
		if (r->pushback_ms >= 0) {
			fa->nums[1][h1_fmt_int(fa->nums[1], r->pushback_ms)] = '\0';
			fault_hdr(fa, &n, "grpc-retry-pushback-ms", fa->nums[1]);
		}
	} else if (r->retry_after && *r->retry_after) {
		fault_hdr(fa, &n, "Retry-After", r->retry_after);
	}
	h->status = grpc ? 200 : r->status;
	h->reason = respond_status_text(h->status);
	h->reason_len = strlen(h->reason);
	h->version = 11;
	h->hdrs = fa->hdrs;
	h->nhdrs = n;
	h->content_length = grpc ? -1 : 0;
	h->end_stream = grpc;
	h->keep_alive = true;
	return h;
}

/* The fault wait is over: what the fault amounts to. OUT_NONE: the attempt goes out now (a
 * delay within the per-try timeout); OUT_STATUS: abort's response, in *H; else the outcome of
 * an attempt that sent nothing. Counted and logged here as the real thing would be. */
enum outcome ex_fault_outcome(struct exchange *ex, const struct http_head **h)
{
	enum outcome out = OUT_CONNECT_FAILURE;
	switch (ex->fault->kind) {
	case FAULT_DELAY:
		if (ex->fault_cut == OUT_NONE)
			return OUT_NONE;
		out = ex->fault_cut;
		break;
	case FAULT_ABORT:
		*h = fault_response(ex);
		STAT_INC(ex->us->responses[(*h)->status / 100]);
		access_set_status(&ex->log, (*h)->status);
		ex->last_out = OUT_STATUS;
		ex->last_att_status = (*h)->status;
		if ((*h)->end_stream) {
			/* the attempt's grpc-status, as ex_grpc_outcome() takes a server's */
			ex->att_grpc = ex->fault->grpc_status;
			ex->pushback_us = ex->fault->pushback_ms >= 0
			                  ? (int64_t)ex->fault->pushback_ms * 1000 : -1;
			STAT_INC(ex->us->grpc_responses[ex->att_grpc]);
			access_set_grpc_status(&ex->log, ex->att_grpc);
		}
		return OUT_STATUS;
	default:
		break;
	}
	STAT_INC(ex->us->outcomes[out]);
	access_set_outcome(&ex->log, outcome_name(out));
	return out;
}
