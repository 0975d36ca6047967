/*
 * saved_response: a response kept while its request is retried (SPEC §4: when no later
 * attempt produces a response, the client gets the last one any attempt produced). The head
 * is deep-copied (the attempt's parser moves on); the body is collected up to retry.max_body
 * by the attempt that is still reading it, which stays attached (paused when full) so that,
 * if this response is the one delivered, the rest streams from there.
 */
#ifndef RG_SAVED_RESPONSE_H
#define RG_SAVED_RESPONSE_H

#include <stdbool.h>

#include "http/h1_parser.h"

struct attempt;
struct evbuffer;

struct saved_response {
	bool valid;
	bool complete;                  /* the whole body is in BODY */
	struct attempt *a;              /* still collecting its body, or NULL */
	struct http_head h;
	struct http_hdr *hdrs;
	char *strings;
	struct evbuffer *body;
	struct http_hdr *trailers;       /* HTTP/2: the trailer fields that ended it, or NULL */
	int ntrailers;
	char *tstrings;
	int grpc_status;                /* its owner's note: the gRPC status it carries, -1: none */
};

/* Keep a deep copy of H, whose body attempt A goes on collecting (A is owned from now on). */
void saved_keep(struct saved_response *s, const struct http_head *h, struct attempt *a);
/* Keep a deep copy of the trailer fields T[N] that ended it (a gRPC status, SPEC §10). */
void saved_keep_trailers(struct saved_response *s, const struct http_hdr *t, int n);
/* Deep copies of N fields FROM: *OUT (the array) and *MEM (their strings, after EXTRA bytes
 * left for the caller), both the caller's to free. */
void saved_copy_fields(const struct http_hdr *from, int n, struct http_hdr **out, char **mem,
                       size_t extra);
/* Forget it: its attempt freed, memory released. Idempotent. */
void saved_clear(struct saved_response *s);

#endif
