/*
 * stream: a byte stream over one socket, plain or TLS, with an input and an output evbuffer,
 * callbacks and watermarks in the manner of a libevent bufferevent.
 *
 * Why not a bufferevent for plain TCP: a socket bufferevent adds and removes its write event
 * around every write and asks the kernel how many bytes are readable before every read: six
 * system calls per proxied request that do no I/O. A plain stream registers its socket once,
 * edge-triggered for reading and writing; it reads until a short read, into chains sized to
 * what was read, and writes its output directly, once per callback round (after every
 * callback that appended to it has run), asking for writability only when the kernel buffer
 * was full. Memory held stays near the bytes counted, so the owners' watermarks bound it:
 * small chains moved into an output that waits are packed together.
 * TLS streams are bufferevent_openssl underneath: the same API, the library's I/O.
 *
 * Callbacks may free the stream (stream_free): memory goes through the loop's deferred-free
 * queue, once the callback stack has unwound.
 */
#ifndef RG_STREAM_H
#define RG_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <event2/bufferevent.h>     /* BEV_EVENT_* names the events below */
#include <openssl/ssl.h>

#include "net/tls.h"

struct loop;
struct evbuffer;
struct stream;

typedef void (*stream_data_fn)(struct stream *s, void *arg);
/* WHAT: BEV_EVENT_CONNECTED, or BEV_EVENT_EOF / BEV_EVENT_ERROR (| BEV_EVENT_READING/WRITING) */
typedef void (*stream_event_fn)(struct stream *s, short what, void *arg);

enum stream_tls { STREAM_PLAIN, STREAM_TLS_ACCEPT, STREAM_TLS_CONNECT };

/* FD: an accepted socket, or -1 for stream_connect(). SSL (taken) with a TLS mode, or NULL. */
struct stream *stream_new(struct loop *loop, int fd, SSL *ssl, enum stream_tls mode);
int stream_connect(struct stream *s, const struct sockaddr *sa, int salen);
void stream_free(struct stream *s);

/* READ: input grew. WRITE: output drained to the write low-water mark or below (after a
 * write). EVENT: connected, EOF, error. */
void stream_setcb(struct stream *s, stream_data_fn rd, stream_data_fn wr, stream_event_fn ev,
                  void *arg);
/* Plain streams: bytes just read are first offered to TAKE while the input is empty (so their
 * order stays); what it returns it took, the rest enters the input, and READ follows as usual.
 * TAKE must not free the stream nor change its callbacks. Spares what it takes a trip through
 * the input evbuffer. stream_setcb() clears it: set it after. */
typedef size_t (*stream_take_fn)(struct stream *s, const char *data, size_t len, void *arg);
void stream_set_take(struct stream *s, stream_take_fn take);
/* Output bytes that left so far: accepted by the kernel (plain) or by the TLS layer. Unlike
 * the output's drains, packing (which moves the waiting bytes out and back) never counts. */
uint64_t stream_written(const struct stream *s);
struct evbuffer *stream_input(struct stream *s);
struct evbuffer *stream_output(struct stream *s);

/* EV_READ on or off (output is always written) */
void stream_enable(struct stream *s, short what);
void stream_disable(struct stream *s, short what);
/* EV_READ: stop reading when input holds HIGH bytes (0: no limit). EV_WRITE: call WRITE when
 * output is at or below LOW. */
void stream_setwatermark(struct stream *s, short what, size_t low, size_t high);
/* Report BEV_EVENT_TIMEOUT|BEV_EVENT_WRITING when output waits US with no byte written (a
 * peer that stopped reading); 0: never. */
void stream_set_write_timeout(struct stream *s, int64_t us);
/* Call READ soon, from the loop, even with no new bytes (input already holds some). */
void stream_trigger_read(struct stream *s);
int stream_fd(struct stream *s);
/* TLS streams: take the most recent OpenSSL error behind an error event; 0: none (left). */
unsigned long stream_tls_error(struct stream *s);
/* Why the TLS stream S failed (tls.h), from the OpenSSL errors it holds (taken: a second call
 * finds none), with a short reason in DETAIL: the first error that says more than
 * TLSF_OTHER. TLSF_NONE: no TLS error (a plain stream, or a peer that only closed or reset). */
enum tls_failure stream_tls_failure(struct stream *s, char *detail, size_t cap);
/* The SSL of a TLS stream (ALPN, peer certificate), or NULL. */
SSL *stream_ssl(struct stream *s);

#endif
