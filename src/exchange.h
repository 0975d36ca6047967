/*
 * exchange: one client request, from its parsed head to the last byte of its response:
 * route, deadline, body (buffered for replay up to retry.max_body, else streamed), the
 * attempts and the retry loop between them (the decision itself is retry_decide()), and the
 * response relayed to the client. It reports to its session only through exchange_cbs.
 */
#ifndef RG_EXCHANGE_H
#define RG_EXCHANGE_H

#include <stdbool.h>
#include <stdint.h>

struct loop;
struct runtime;
struct cfg_listener;
struct http_head;
struct stream;
struct evbuffer;
struct exchange;

struct exchange_cbs {
	/* The response is fully queued on the client output (or the exchange gave up on the
	 * connection: CLOSE). The session frees the exchange afterwards. */
	void (*on_done)(void *arg, bool close);
	/* Request body bytes may flow again (exchange_body_room() grew). */
	void (*on_want_body)(void *arg);
	/* The upstream switched protocols (101): the 101 head is queued; from now on the client
	 * connection is a tunnel to UPSTREAM (taken). The exchange is finished. */
	void (*on_tunnel)(void *arg, struct stream *upstream);
};

struct client_info {
	uint64_t sid;
	const char *peer_ip;
	bool tls;
	const bool *draining;           /* the connection closes after this response (read when
	                                 * the head is written: a drain may begin meanwhile) */
};

struct exchange *exchange_new(struct loop *loop, struct runtime *rt, struct cfg_listener *l,
                              const struct client_info *ci, const struct http_head *req,
                              struct stream *client, const struct exchange_cbs *cbs,
                              void *arg);
/* Start: route, checks, first attempt. May call on_done before returning. */
void exchange_start(struct exchange *ex);

/* Request body bytes (decoded): the exchange drains DATA. */
void exchange_body(struct exchange *ex, struct evbuffer *data);
void exchange_body_end(struct exchange *ex);
/* How many body bytes the exchange takes now (0: stop reading the client). */
size_t exchange_body_room(const struct exchange *ex);

/* The client output drained below the low-water mark. */
void exchange_client_drained(struct exchange *ex);
/* The client went away: cancel everything. */
void exchange_abort(struct exchange *ex);
void exchange_free(struct exchange *ex);

#endif
