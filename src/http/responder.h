/*
 * responder: how an exchange answers its client, whatever the client's protocol. The client
 * codec (today the HTTP/1 session; an HTTP/2 stream next) implements it and hands it to the
 * exchange; the exchange never writes wire bytes itself. The codec owns the framing
 * (Content-Length, chunked, close-delimited, DATA frames), the connection-level fields and the
 * close decision; the exchange owns which end-to-end fields go out.
 *
 * Order of calls: any number of informational(), then head() or tunnel(); after head(), body()
 * any number of times, then at most one trailers(); then end() exactly once (also with no head: the exchange was aborted).
 * After end() the exchange is finished and the codec frees it.
 */
#ifndef RG_RESPONDER_H
#define RG_RESPONDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct http_hdr;
struct stream;

/* Who the client is, as the codec tells the exchange. */
struct client_info {
	uint64_t sid;
	const char *peer_ip;
	bool tls;
};

struct resp_head {
	int status;
	const char *reason;             /* HTTP/1 reason phrase; NULL: the standard one */
	size_t reason_len;
	const struct http_hdr *hdrs;    /* end-to-end fields in order (entries marked hop: skipped) */
	int nhdrs;
	int64_t content_length;         /* -1: not known (the body is streamed) */
	bool close;                     /* the connection must not carry another request (the
	                                 * request body was not read whole, or it was refused) */
	bool end_stream;                /* HTTP/2: the head ends the stream (gRPC Trailers-Only):
	                                 * no body and no trailers follow; HTTP/1 ignores it */
};

#define RESPONDER_FULL SIZE_MAX

struct responder {
	/* A 1xx other than 101: 100 and 103 reach HTTP/1.1 clients; dropped where not allowed. */
	void (*informational)(void *arg, const struct resp_head *h);
	/* The final head. */
	void (*head)(void *arg, const struct resp_head *h);
	/* Body bytes: all of DATA is taken (drained). */
	void (*body)(void *arg, struct evbuffer *data);
	/* Trailer fields after the body, before end(): relayed only where both the client's and
	 * the upstream's protocol carry them (HTTP/2, SPEC §9); HTTP/1 drops them (§8). */
	void (*trailers)(void *arg, const struct http_hdr *t, int n);
	/* The end. COMPLETE: the response went out whole (false: cut short, or never started —
	 * the client must not take a truncated body as complete). CLOSE: do not reuse the
	 * connection. The exchange is finished; the codec frees it afterwards. */
	void (*end)(void *arg, bool complete, bool close);
	/* Response bytes queued for the client, not yet written: above the exchange's high-water
	 * mark it stops reading the upstream until client_drained. RESPONDER_FULL: the codec's
	 * budget for the whole connection (or process) is spent, whatever this one queued; it
	 * calls client_drained when there is room again. */
	size_t (*queued)(void *arg);
	/* Streamed request body: the exchange has room again (exchange_body_room grew). */
	void (*want_body)(void *arg);
	/* 101 to an Upgrade request: write head H, then the connection is a tunnel to UPSTREAM
	 * (taken). The exchange is finished (no end() follows). */
	void (*tunnel)(void *arg, const struct resp_head *h, struct stream *upstream);
	void *arg;
};

#endif
