/*
 * h2_guard: the connection defences of SPEC §9 that count frames, as pure bookkeeping over the
 * bytes an HTTP/2 client sends (it sees them before nghttp2 does): header blocks (HEADERS plus
 * CONTINUATION) over twice max_header_bytes, floods of SETTINGS/PING/PRIORITY/WINDOW_UPDATE or
 * empty DATA frames within 10 s (WINDOW_UPDATE and PING judged against the DATA frames we
 * sent: a client acknowledging every one is not a flood), and the rapid-reset ratio over the
 * last 1,000 closed streams. And the stream states nghttp2 cannot tell apart once it forgot a
 * stream (RFC 9113 §5.1, §5.1.1, §6.1, §6.3), over the last H2G_STREAM_WINDOW client stream
 * ids: a HEADERS frame on a lower id the client never opened, or PRIORITY on stream 0, is a
 * connection error PROTOCOL_ERROR; HEADERS on a stream closed at both ends a connection error
 * STREAM_CLOSED; DATA on such a stream (or on a lower id never opened) a stream error
 * STREAM_CLOSED, which the caller takes with h2_guard_take_reset(); anything on a stream we
 * reset ourselves is left alone (§5.1: the client may have sent it before our RST_STREAM
 * arrived), and so is anything on an id older than the window (nghttp2 then ignores it).
 * No clock of its own (callers pass now), no I/O; memory is fixed.
 */
#ifndef RG_H2_GUARD_H
#define RG_H2_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define H2G_FLOOD_WINDOW_US (10 * 1000 * 1000)
#define H2G_MAX_CONTROL 10000       /* SETTINGS and PRIORITY per window; WINDOW_UPDATE and
                                     * PING, plus 3 for each DATA frame we sent */
#define H2G_MAX_EMPTY_DATA 1000     /* DATA of length 0 without END_STREAM per window */
#define H2G_RESET_MIN 100           /* closed streams before the rapid-reset rule applies */
#define H2G_RESET_RING 1000         /* the last this many closed streams are looked at */
#define H2G_STREAM_WINDOW 1024      /* client stream ids whose state is remembered */
#define H2G_MAX_RESETS 16           /* stream errors waiting for h2_guard_take_reset() */

enum h2g_verdict {
	H2G_OK,
	H2G_HEADER_BLOCK,               /* GOAWAY ENHANCE_YOUR_CALM */
	H2G_FLOOD,                      /* GOAWAY ENHANCE_YOUR_CALM */
	H2G_PROTOCOL,                   /* GOAWAY PROTOCOL_ERROR: unexpected stream id, PRIORITY
	                                 * on stream 0 */
	H2G_STREAM_CLOSED,              /* GOAWAY STREAM_CLOSED: HEADERS on a closed stream, or
	                                 * more stream errors than H2G_MAX_RESETS at once */
};

struct h2_guard {
	size_t preface_left;            /* client preface bytes still to skip */
	uint8_t hd[9];                  /* the frame header being read */
	uint8_t hd_have;
	uint32_t payload_left;          /* of the current frame */
	uint8_t cur_type;
	bool in_block;                  /* a header block is open (no END_HEADERS yet) */
	uint64_t block_bytes;
	uint64_t block_limit;
	int64_t block_start_us;
	int64_t win_start_us;
	uint32_t control, empty_data;   /* SETTINGS and PRIORITY; empty DATA */
	uint32_t acks;                  /* WINDOW_UPDATE and PING */
	uint32_t data_sent;             /* DATA frames we sent in this window */
	uint32_t cur_sid;
	uint32_t max_sid;               /* the highest client stream id opened by HEADERS */
	uint8_t sstate[H2G_STREAM_WINDOW / 4];  /* 2 bits per odd id in (max_sid - 2W, max_sid] */
	uint32_t resets[H2G_MAX_RESETS];    /* streams owed RST_STREAM STREAM_CLOSED */
	uint32_t nresets;
	uint64_t ring[(H2G_RESET_RING + 63) / 64];  /* 1: reset by the client before its head */
	uint32_t ring_pos, ring_fill, ring_resets;
	uint64_t closed;
};

void h2_guard_init(struct h2_guard *g, size_t max_header_bytes);
/* Account N bytes the client sent. A verdict other than H2G_OK is final: end the connection. */
enum h2g_verdict h2_guard_feed(struct h2_guard *g, const uint8_t *p, size_t n, int64_t now_us);
/* A header block is open: since when (for header_timeout). */
bool h2_guard_block_open(const struct h2_guard *g, int64_t *since_us);
/* Stream SID closed; RESET_EARLY: the client reset it before its response head went out;
 * BY_US: we ended it with RST_STREAM (frames may still arrive for it: they are left alone).
 * True: the rapid-reset rule is met (GOAWAY ENHANCE_YOUR_CALM). */
bool h2_guard_stream_closed(struct h2_guard *g, uint32_t sid, bool reset_early, bool by_us);
/* A stream error found by h2_guard_feed(): true with *SID owed RST_STREAM STREAM_CLOSED. */
bool h2_guard_take_reset(struct h2_guard *g, uint32_t *sid);
/* We sent N DATA frames: each lets the client answer with WINDOW_UPDATEs and PINGs. */
void h2_guard_data_sent(struct h2_guard *g, uint32_t n);

#endif
