/*
 * exchange_impl: what the files of the exchange share, and nobody else: the object, its
 * states, and the functions one part calls in another. Calls go one way, down this list (a
 * file calls only the files below it; news comes up through the callbacks it hands out):
 *
 *   exchange.c        the codec's side (exchange.h), the attempt's news, the deadline
 *   exchange_grpc.c   SPEC §10 on a gRPC call's attempts: the held head (X_HELD)
 *   exchange_hedge.c  SPEC §14: the hedge timer's firing, and the news of attempts that run
 *                     beside ex->att
 *   exchange_retry.c  the attempts and the loop between them: start (or fault wait), send,
 *                     ex_decide(), backoff
 *   exchange_fault.c  SPEC §11: the draw, the wait's length, what a fault amounts to
 *   exchange_reply.c  how it ends: what reaches the client, the accounting, the log line
 *   exchange_core.c   the state setter, timers, slots, passive health, hold hints
 *
 * Only these files include this one.
 */
#ifndef RG_EXCHANGE_IMPL_H
#define RG_EXCHANGE_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "obs/accesslog.h"
#include "obs/outage_log.h"
#include "config/config.h"
#include "policy/deadline.h"
#include "proxy/forward.h"
#include "http/h1_parser.h"
#include "proxy/reqbody.h"
#include "http/responder.h"
#include "policy/retry.h"
#include "proxy/saved_response.h"
#include "base/loop.h"

struct attempt;
struct evbuffer;
struct idem_job;
struct loop;
struct ep_state;
struct upstream_binding;
struct upstream_state;
struct ustats;

/* budget.shared: what the shared bucket's calls name (state/budget_shared.h) */
#define SHARED_CTX(ex) { (ex)->loop, (ex)->rt, (ex)->st, &(ex)->up->retry, (ex)->up->name, \
                         (ex)->us }

#define EXCHANGE_MAGIC 0xe8c4a46eu
#define CLIENT_HIGH   (256 * 1024)    /* client output above this: stop reading the upstream */

/* the exchange's timers (struct exchange's timers bits) */
#define EX_T_BACKOFF  2u
#define EX_T_FAULT    4u
#define EX_T_HEDGE    8u
#define EX_T_HFAULT   16u       /* the hedges' fault timer (struct hedging's fault_ev) */

/* The diagram is at the top of exchange.c. X_FAULT_WAIT and X_HELD are waits inside an
 * attempt: leaving either (to whatever state, X_DONE included) undoes what entering it armed,
 * in ex_set_state(), so no path that ends or cancels the exchange has to know about them. */
enum xstate {
	X_NEW,
	X_WAIT_BODY,        /* the whole body before the first attempt */
	X_CLAIM,            /* the idempotency claim (SPEC §6) */
	X_FAULT_WAIT,       /* a drawn fault's wait (SPEC §11), fault_ev armed; ex->att NULL
	                     * (hedges may run beside it) */
	X_ATTEMPT,          /* ex->att sent, its head awaited */
	X_HELD,             /* a gRPC head held (SPEC §10): ex->held; ex->att on */
	X_BACKOFF,          /* a retry's wait, backoff_ev armed */
	X_RELAY,            /* a response goes to the client */
	X_DONE,
};

struct attempt_cbs;

/* A gRPC head held while its outcome is unknown (X_HELD). Apart from the exchange: HTTP
 * requests never need it. One block from the loop's free lists: this struct, the fields, then
 * their bytes (a deep copy: the transport's head goes away). */
struct grpc_held {
	struct loop *loop;
	struct http_head h;
	struct http_hdr hdrs[];
};

/* SPEC §14: an attempt running beside ex->att, its head awaited; ex->att's own facts take
 * this shape when the two swap places (the one whose head came first becomes ex->att). A hedge
 * draws its SPEC §11 fault as any attempt does: one that sends nothing (yet) waits with a NULL
 * until fault_due_us, on the hedges' fault timer, and then takes ex->att's place, in
 * X_FAULT_WAIT, to go out or end as ex->att's fault would. */
struct hedge_try {
	struct attempt *a;
	struct ep_state *ep;            /* kept (upstream_ep_keep) */
	int64_t t0_us;
	const struct cfg_fault_rule *fault;     /* as ex->fault */
	int64_t fault_due_us;           /* its fault's wait ends then (a NULL); 0: no wait */
	enum outcome fault_cut;         /* as ex->fault_cut */
	int log_idx;                    /* its try in the access log */
	int num;                        /* its X-Retrygate-Attempt */
	bool hedge;                     /* sent as a hedge */
	bool other_conn;                /* to go over another connection (ex_send_hedge()) */
	bool slot_in_flight, slot_retry;
};

/* Allocated the first time a request's hedge timer is armed (never with hedging off). */
struct hedging {
	struct event ev;                /* the hedge timer (EX_T_HEDGE) */
	struct event fault_ev;          /* the earliest fault wait among o[] ends (EX_T_HFAULT) */
	int sent;                       /* hedges sent */
	int n;                          /* o[] in use */
	int att_log;                    /* ex->att's try in the access log */
	int att_num;                    /* ex->att's X-Retrygate-Attempt */
	struct budget_shared_op *bs_op; /* budget.shared: the next hedge's token asked of Redis,
	                                 * its retries-in-flight slot held meanwhile */
	bool att_hedge;                 /* ex->att was sent as a hedge */
	bool att_other_conn;            /* ... and goes over another connection */
	struct hedge_try o[HEDGE_MAX_EXTRA];
};

/* SPEC §11: abort's response, as if the upstream had sent it. */
struct fault_answer {
	struct http_head head;
	struct http_hdr hdrs[5];
	char nums[2][12];               /* its grpc-status and grpc-retry-pushback-ms, as text */
};

struct exchange {
	uint32_t magic;
	enum xstate state;
	struct loop *loop;
	const struct attempt_cbs *att_cbs;      /* exchange.c's: the attempts' news */
	struct runtime *rt;
	struct cfg_listener *l;
	struct client_info ci;
	char peer_ip[64];
	const struct http_head *req;
	struct responder rsp;

	struct cfg_upstream *up;
	/* the route's retry and deadline (SPEC §2: the upstream's unless the route has its own);
	 * budget, caps, holds, health, idempotency and faults are read from up */
	const struct cfg_retry *retry;
	const struct cfg_deadline *deadline;
	struct upstream_binding *ub;
	struct upstream_state *st;
	struct ustats *us;

	int64_t t0_us, deadline_us, given_us;
	bool dl_present[DL_NKINDS];
	bool req_nested, has_key, enforce_idem;
	enum method_class mclass;

	struct reqbody rb;              /* the request body: buffered for replay, or streamed */

	struct attempt *att;            /* the attempt waiting for its head */
	struct hedging *hedging;        /* SPEC §14: attempts beside it, or NULL */
	event_callback_fn hedge_cb;     /* exchange_hedge.c's timer, for exchange_retry.c to arm */
	struct attempt *relay;          /* the attempt whose response goes to the client */
	struct ep_state *att_ep;        /* kept (upstream_ep_keep), as is next_ep */
	bool slot_in_flight, slot_retry;
	struct ep_state *next_ep;
	uint64_t next_serial;           /* next_ep's identity when it was chosen */
	int attempts;
	uint64_t tried;
	enum outcome last_out;
	bool last_bad;
	struct saved_response saved;  /* the last retried response, in case no later one comes */
	enum refusal refused;
	/* budget.shared: the retry's token asked of Redis during X_BACKOFF; the attempt waits for
	 * the answer (bs_due: the backoff ended first) */
	struct budget_shared_op *bs_op;
	bool bs_due;

	/* Embedded: no allocation per request. The deadline is the loop's kind of timer (armed
	 * and stopped by every request, a link and an unlink); the others are assigned the first
	 * time they are armed (most requests never back off nor draw a fault) and, in ex_end(),
	 * deleted only if they were. */
	struct loop_timer deadline_t;
	struct event backoff_ev;
	uint8_t timers;                 /* EX_T_* bits: which of the events are assigned */
	bool head_sent, close_after;
	int resp_status;
	char reqid[FORWARD_ID_MAX];     /* the client's X-Request-Id (truncated), else ours */
	struct access_rec log;

	struct idem_job *idem;          /* SPEC §6 enforcement at this hop, or NULL */
	int last_att_status;            /* the last attempt's response status, 0: none */
	bool reached;                   /* some attempt may have reached the upstream */
	bool executed;                  /* some retried attempt may have executed (its outcome was
	                                 * not idem_not_executed()); the last one is judged at the end */
	bool resp_complete;             /* a relayed response went out whole */
	int64_t idem_body_left;         /* body bytes to relay before the response is whole (its
	                                 * Content-Length), when `idem` is set; -1: not known */

	/* SPEC §11: the fault the current attempt drew, or NULL. Faults that send nothing
	 * (connect-failure, abort, a delay) wait on fault_ev in X_FAULT_WAIT. */
	const struct cfg_fault_rule *fault;
	struct event fault_ev;
	enum outcome fault_cut;         /* OUT_TIMEOUT: the delay outlasts the per-try timeout */
	int64_t att_t0_us;              /* when the current attempt started (its delay included) */
	struct fault_answer *fault_ans; /* abort's response, made at the first abort (gray tests
	                                 * only: kept out of every request's zeroed memory) */

	/* SPEC §10: a gRPC call. A 200 head without END_STREAM names no outcome yet: it is held
	 * (X_HELD) until DATA commits the call or trailers with no DATA name its grpc-status. */
	bool grpc;
	bool idem_path;                 /* the path is one of retry.idempotent_paths (rule 4) */
	struct grpc_held *held;         /* that head, in X_HELD only (gRPC calls only: allocated) */
	int att_grpc;                   /* the current attempt's grpc-status; -1: none */
	int64_t pushback_us;            /* its grpc-retry-pushback-ms: -1 none, -2 "do not retry" */
	int client_grpc;                /* the grpc-status the client got; -1: none (yet) */
	struct http_hdr *req_trailers;  /* the client's request trailers (HTTP/2 to HTTP/2), copied */
	int nreq_trailers;
	char *req_tmem;
	const struct http_hdr *dec_trailers;    /* the trailers ex_decide() is judging, or NULL */
	int dec_ntrailers;
};

/* exchange_grpc.c: SPEC §10 on a gRPC call's attempts (called by exchange.c) */
bool ex_grpc_head(struct exchange *ex, struct attempt *a, const struct http_head *h);
void ex_grpc_commit(struct exchange *ex, struct attempt *a);
void ex_grpc_trailers(struct exchange *ex, struct attempt *a, const struct http_hdr *t, int n);
bool ex_grpc_end(struct exchange *ex, struct attempt *a, enum outcome out);
int ex_grpc_outcome(struct exchange *ex, const struct http_hdr *f, int n);

/* exchange_hedge.c: SPEC §14 (called by exchange.c) */
void ex_hedge_timer_cb(evutil_socket_t fd, short what, void *arg);
bool ex_hedge_head(struct exchange *ex, struct attempt *a, const struct http_head *h);
bool ex_hedge_end(struct exchange *ex, struct attempt *a, enum outcome out);

/* exchange_retry.c: the attempts and the retry loop */
void ex_start_first(struct exchange *ex);
struct ep_state *ex_choose_endpoint(struct exchange *ex, int64_t now, bool retry);
bool ex_may_hedge(struct exchange *ex);
int64_t ex_hedge_delay(struct exchange *ex, int64_t now);
void ex_send_hedge(struct exchange *ex, struct ep_state *ep, bool other_conn, struct hedge_try *t);
void ex_decide(struct exchange *ex, enum outcome out, const struct http_head *h, bool bad);
void ex_judge_status(struct exchange *ex, struct attempt *a, const struct http_head *h);

/* exchange_fault.c: SPEC §11 */
const struct cfg_fault_rule *ex_fault_draw(struct exchange *ex, int64_t now);
void ex_fault_arm(struct exchange *ex, int64_t now);
enum outcome ex_fault_outcome(struct exchange *ex, const struct http_head **h);

/* exchange_reply.c: the end of an exchange and what reaches the client */
bool ex_body_left_unread(const struct exchange *ex, bool ours);
void ex_end(struct exchange *ex);
void ex_log_request(struct exchange *ex, int64_t now);
void ex_count_and_log(struct exchange *ex, int64_t now);
void ex_finish(struct exchange *ex, bool complete, bool close);
void ex_finish_error(struct exchange *ex, int status, const char *reason, bool close,
                     const char *retry_after);
void ex_send_head(struct exchange *ex, const struct http_head *h, enum refusal reason);
void ex_relay_body(struct exchange *ex, struct evbuffer *data);
void ex_relay_from(struct exchange *ex, struct attempt *a, const struct http_head *h,
                   enum refusal reason);
void ex_relay_complete(struct exchange *ex);
void ex_relay_saved(struct exchange *ex, enum refusal reason);
void ex_deliver_last(struct exchange *ex);
void ex_start_tunnel(struct exchange *ex, struct attempt *a, const struct http_head *h);
void ex_relay_informational(struct exchange *ex, const struct http_head *h);
void ex_relay_trailers(struct exchange *ex, const struct http_hdr *t, int n);

/* exchange_core.c */
void ex_set_state(struct exchange *ex, enum xstate st);
/* SPEC §11: when the wait of the fault R drawn by an attempt started at T0 ends; *CUT:
 * OUT_TIMEOUT when the per-try timeout ends it, else OUT_NONE. */
int64_t ex_fault_due(const struct exchange *ex, const struct cfg_fault_rule *r, int64_t t0,
                     enum outcome *cut);
void ex_held_free(struct grpc_held *held);
void ex_timer_assign(struct exchange *ex, struct event *ev, uint8_t bit, event_callback_fn cb);
void ex_timers_stop(struct exchange *ex);
void ex_release_slots(struct exchange *ex);
/* SPEC §14: ex->att and the try T trade places, fault waits included (the state is
 * X_FAULT_WAIT after it when ex->att's fault wait goes on, else X_ATTEMPT); ex->att ended and
 * hedges run on: the last of them takes its place (true), or none runs (false); the hedges'
 * fault timer set for the earliest wait among them; the end of every hedge. */
void ex_hedge_swap(struct exchange *ex, struct hedge_try *t);
void ex_hedge_fault_rearm(struct exchange *ex);
/* ex->att's response is relayed: counted and logged as the winner when it was a hedge */
void ex_hedge_won(struct exchange *ex);
bool ex_hedge_takeover(struct exchange *ex);
void ex_hedge_drop(struct exchange *ex, int i);
void ex_hedge_cancel_all(struct exchange *ex);
void ex_report_health_as(struct exchange *ex, enum outcome out, int status, bool hinted);
void ex_report_health(struct exchange *ex, enum outcome out, const struct http_head *h);
int64_t ex_retry_after_hint(struct exchange *ex, const struct http_head *h, int64_t now);
int64_t ex_grpc_pushback_hold(struct exchange *ex, int64_t now);
/* The log of an outage (obs/outage_log.h): a failure or refusal of kind K was just counted. */
void ex_note_outage(struct exchange *ex, enum outage_kind k, int64_t now);
/* RETRYGATE_LOG=debug: an attempt's outcome (H: its head; GRPC: its grpc-status or -1), the
 * retry decision and its reason, and the wait before the retry (WAIT_US, REASON RR_NONE). */
void ex_log_decision(const struct exchange *ex, enum outcome out, const struct http_head *h,
                     int grpc, enum refusal reason, int64_t wait_us);

#endif
