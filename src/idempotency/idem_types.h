/*
 * idem_types: the values the idempotency facade (idempotency.h) and its backends (store.h)
 * both speak — a request's key, a stored response, a claim's result and its callback — with
 * no functions, so the backends need not include the facade that creates them.
 */
#ifndef RG_IDEM_TYPES_H
#define RG_IDEM_TYPES_H

#include <stddef.h>
#include <stdint.h>

/* the default of idem_redis_set_timeout() */
#define IDEM_REDIS_TIMEOUT_US       1000000
/* the memory store's default cap: records, stored responses and table overhead */
#define IDEM_MEMORY_DEFAULT_LIMIT   ((size_t)256 << 20)

struct idem_key {
	unsigned char scope[32];    /* idem_scope() */
	unsigned char fp[32];       /* idem_fingerprint() */
};

/* A response as relayed to the client: status, the header lines exactly as sent
 * ("Name: value\r\n" each, without framing headers or the blank line), the body, and the
 * trailer fields that followed it (HTTP/2, gRPC's grpc-status: the same line format; none for
 * most responses). A view: the store copies what it keeps; what it hands out is valid only
 * during the callback. */
struct idem_response {
	int status;                 /* 100-599 */
	const char *headers;
	size_t headers_len;
	const char *body;
	size_t body_len;
	const char *trailers;       /* NULL or "" with trailers_len 0: none */
	size_t trailers_len;
};

enum idem_result {
	IDEM_CLAIMED,       /* this request owns the key: forward it */
	IDEM_REPLAY,        /* same request already done: answer the stored response */
	IDEM_MISMATCH,      /* the key belongs to a different request: 422 */
	IDEM_IN_PROGRESS,   /* the same request is running, or its outcome was not storable: 409 */
	IDEM_UNAVAILABLE,   /* the store could not answer: 503, forward nothing */
};

/* The result of a claim. STORED is set for IDEM_REPLAY only and valid only during the call.
 * Called from the event loop, never from inside idem_claim(). */
typedef void (*idem_claim_fn)(void *arg, enum idem_result r, const struct idem_response *stored);

#endif
