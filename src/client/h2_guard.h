/*
 * h2_guard: the connection defences of SPEC §9 that count frames, as pure bookkeeping over the
 * bytes an HTTP/2 client sends (it sees them before nghttp2 does): header blocks (HEADERS plus
 * CONTINUATION) over twice max_header_bytes, floods of SETTINGS/PING/PRIORITY/WINDOW_UPDATE or
 * empty DATA frames within 10 s, and the rapid-reset ratio over the last 1,000 closed streams.
 * No clock of its own (callers pass now), no I/O; memory is fixed.
 */
#ifndef RG_H2_GUARD_H
#define RG_H2_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define H2G_FLOOD_WINDOW_US (10 * 1000 * 1000)
#define H2G_MAX_CONTROL 10000       /* SETTINGS, PING, PRIORITY, WINDOW_UPDATE per window */
#define H2G_MAX_EMPTY_DATA 1000     /* DATA of length 0 without END_STREAM per window */
#define H2G_RESET_MIN 100           /* closed streams before the rapid-reset rule applies */
#define H2G_RESET_RING 1000         /* the last this many closed streams are looked at */

enum h2g_verdict { H2G_OK, H2G_HEADER_BLOCK, H2G_FLOOD };

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
	uint32_t control, empty_data;
	uint64_t ring[(H2G_RESET_RING + 63) / 64];  /* 1: reset by the client before its head */
	uint32_t ring_pos, ring_fill, ring_resets;
	uint64_t closed;
};

void h2_guard_init(struct h2_guard *g, size_t max_header_bytes);
/* Account N bytes the client sent. A verdict other than H2G_OK is final: end the connection. */
enum h2g_verdict h2_guard_feed(struct h2_guard *g, const uint8_t *p, size_t n, int64_t now_us);
/* A header block is open: since when (for header_timeout). */
bool h2_guard_block_open(const struct h2_guard *g, int64_t *since_us);
/* A stream closed; RESET_EARLY: the client reset it before its response head went out.
 * True: the rapid-reset rule is met (GOAWAY ENHANCE_YOUR_CALM). */
bool h2_guard_stream_closed(struct h2_guard *g, bool reset_early);

#endif
