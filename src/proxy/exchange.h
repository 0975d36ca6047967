/*
 * exchange: one client request, from its parsed head to the last byte of its response:
 * route, deadline, body (buffered for replay up to retry.max_body, else streamed), the
 * attempts and the retry loop between them (the decision itself is retry_decide()), and the
 * response relayed to the client. It answers its client only through the responder it was
 * handed (responder.h), whatever the client's protocol.
 */
#ifndef RG_EXCHANGE_H
#define RG_EXCHANGE_H

#include <stdbool.h>
#include <stdint.h>

#include "http/responder.h"

struct loop;
struct runtime;
struct cfg_listener;
struct http_head;
struct http_hdr;
struct evbuffer;
struct exchange;

/* REQ stays owned by the codec and valid until exchange_free. RSP is how the exchange answers
 * (copied). */
struct exchange *exchange_new(struct loop *loop, struct runtime *rt, struct cfg_listener *l,
                              const struct client_info *ci, const struct http_head *req,
                              const struct responder *rsp);
/* Start: route, checks, first attempt. May call the responder's end() before returning. */
void exchange_start(struct exchange *ex);

/* Request body bytes (decoded): the exchange drains DATA. */
void exchange_body(struct exchange *ex, struct evbuffer *data);
/* The request's trailer fields (an HTTP/2 client), before exchange_body_end(); copied. */
void exchange_trailers(struct exchange *ex, const struct http_hdr *t, int n);
void exchange_body_end(struct exchange *ex);
/* How many body bytes the exchange takes now (0: stop reading the client). */
size_t exchange_body_room(const struct exchange *ex);

/* The client took queued response bytes: below the high-water mark again. */
void exchange_client_drained(struct exchange *ex);
/* The client went away: cancel everything. */
void exchange_abort(struct exchange *ex);
/* retrygate stops before the exchange ended (drain_timeout ran out): it ends now, its
 * response cut (the responder's end(), not complete); a request that may have reached the
 * upstream and has no answer yet is an unknown outcome (SPEC §12). */
void exchange_expire(struct exchange *ex);
void exchange_free(struct exchange *ex);

#endif
