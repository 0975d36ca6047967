/*
 * exchange_impl: what the four files of the exchange share, and nobody else: the object, its
 * states, and the functions one part calls in another. exchange.c is the state machine (intake,
 * attempts, the retry decision, backoff, deadline, the attempt's news); exchange_reply.c is how
 * it ends (what reaches the client, relayed or made here, the accounting and the log line);
 * exchange_fault.c applies SPEC §11 faults to its attempts, exchange_grpc.c SPEC §10 to a gRPC
 * call's. Only these four include this file.
 */
#ifndef RG_EXCHANGE_IMPL_H
#define RG_EXCHANGE_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/event_struct.h>

#include "obs/accesslog.h"
#include "config/config.h"
#include "http/deadline.h"
#include "http/forward.h"
#include "http/h1_parser.h"
#include "proxy/reqbody.h"
#include "http/responder.h"
#include "policy/retry.h"
#include "proxy/saved_response.h"

struct attempt;
struct evbuffer;
struct idem_job;
struct loop;
struct ep_state;
struct upstream_binding;
struct upstream_state;
struct ustats;

#define EXCHANGE_MAGIC 0xe8c4a46eu
#define CLIENT_HIGH   (256 * 1024)    /* client output above this: stop reading the upstream */

/* the exchange's timers (struct exchange's timers bits) */
#define EX_T_DEADLINE 1u
#define EX_T_BACKOFF  2u
#define EX_T_FAULT    4u

enum xstate { X_NEW, X_WAIT_BODY, X_CLAIM, X_ATTEMPT, X_BACKOFF, X_RELAY, X_DONE };

/* A gRPC head held while its outcome is unknown (exchange_grpc.c), with the per-try timer
 * that still runs meanwhile. Apart from the exchange: HTTP requests never need it. */
struct grpc_held {
	struct saved_response head;     /* deep copy: the transport's goes away */
	struct event ev;
};

struct exchange {
	uint32_t magic;
	enum xstate state;
	struct loop *loop;
	struct runtime *rt;
	struct cfg_listener *l;
	struct client_info ci;
	char peer_ip[64];
	const struct http_head *req;
	struct responder rsp;

	struct cfg_upstream *up;
	struct upstream_binding *ub;
	struct upstream_state *st;
	struct ustats *us;

	int64_t t0_us, deadline_us, given_us;
	bool dl_present[DL_NKINDS];
	bool req_nested, has_key, enforce_idem;
	enum method_class mclass;

	struct reqbody rb;              /* the request body: buffered for replay, or streamed */

	struct attempt *att;            /* the attempt waiting for its head */
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

	/* Embedded: no allocation per request. Each is assigned the first time it is armed (most
	 * requests never back off nor draw a fault) and, in ex_end(), deleted only if it was: an
	 * event_del() costs a lock round even on an idle event, and this runs for every request. */
	struct event deadline_ev, backoff_ev;
	uint8_t timers;                 /* EX_T_* bits: which of the three events are assigned */
	bool head_sent, close_after;
	int resp_status;
	char reqid[FORWARD_ID_MAX];     /* the client's X-Request-Id (truncated), else ours */
	struct access_rec log;

	struct idem_job *idem;          /* SPEC §6 enforcement at this hop, or NULL */
	int last_att_status;            /* the last attempt's response status, 0: none */
	bool reached;                   /* some attempt may have reached the upstream */
	bool resp_complete;             /* a relayed response went out whole */

	/* SPEC §11: the fault the current attempt drew, or NULL. Faults that send nothing
	 * (connect-failure, abort, a delay) run on fault_ev while ex->att is NULL. */
	const struct cfg_fault_rule *fault;
	struct event fault_ev;
	bool fault_pending;             /* fault_ev stands for the current attempt */
	enum outcome fault_cut;         /* OUT_TIMEOUT: the delay outlasts the per-try timeout */
	int64_t att_t0_us;              /* when the current attempt started (its delay included) */
	struct http_head fault_head;    /* abort's response, as if the upstream had sent it */
	struct http_hdr fault_hdrs[2];

	/* SPEC §10: a gRPC call. A 200 head without END_STREAM names no outcome yet: it is held
	 * (grpc_wait) until DATA commits the call or trailers with no DATA name its grpc-status. */
	bool grpc;
	bool idem_path;                 /* the path is one of retry.idempotent_paths (rule 4) */
	bool grpc_wait;
	struct grpc_held *held;         /* that head, while held (gRPC calls only: allocated) */
	int att_grpc;                   /* the current attempt's grpc-status; -1: none */
	int64_t pushback_us;            /* its grpc-retry-pushback-ms: -1 none, -2 "do not retry" */
	int client_grpc;                /* the grpc-status the client got; -1: none (yet) */
	struct http_hdr *req_trailers;  /* the client's request trailers (HTTP/2 to HTTP/2), copied */
	int nreq_trailers;
	char *req_tmem;
	const struct http_hdr *dec_trailers;    /* the trailers ex_decide() is judging, or NULL */
	int dec_ntrailers;
};

/* exchange.c */
void ex_set_state(struct exchange *ex, enum xstate st);
void ex_decide(struct exchange *ex, enum outcome out, const struct http_head *h, bool bad);
void ex_send_attempt(struct exchange *ex, struct ep_state *ep);
void ex_timers_stop(struct exchange *ex);
int64_t ex_retry_after_hint(struct exchange *ex, const struct http_head *h, int64_t now);

/* exchange_reply.c: the end of an exchange and what reaches the client */
void ex_release_slots(struct exchange *ex);
bool ex_body_left_unread(const struct exchange *ex, bool ours);
void ex_end(struct exchange *ex);
void ex_log_request(struct exchange *ex, int64_t now);
void ex_count_end(struct exchange *ex, int64_t now);
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

/* exchange.c: passive health (SPEC §13) of the attempt's endpoint */
void ex_report_health_as(struct exchange *ex, enum outcome out, int status, bool hinted);
void ex_report_health(struct exchange *ex, enum outcome out, const struct http_head *h);

/* exchange_grpc.c: SPEC §10 on a gRPC call's attempts */
bool ex_grpc_head(struct exchange *ex, struct attempt *a, const struct http_head *h);
void ex_grpc_commit(struct exchange *ex, struct attempt *a);
void ex_grpc_trailers(struct exchange *ex, struct attempt *a, const struct http_hdr *t, int n);
bool ex_grpc_end(struct exchange *ex, struct attempt *a, enum outcome out);
int ex_grpc_outcome(struct exchange *ex, const struct http_hdr *f, int n);
int64_t ex_grpc_pushback_hold(struct exchange *ex, int64_t now);
void ex_grpc_unhold(struct exchange *ex);
void ex_grpc_hold_cb(evutil_socket_t fd, short what, void *arg);

/* exchange_fault.c */
const struct cfg_fault_rule *ex_fault_draw(struct exchange *ex, int64_t now);
void ex_fault_arm(struct exchange *ex, int64_t now);
void ex_fault_cb(evutil_socket_t fd, short what, void *arg);

#endif
