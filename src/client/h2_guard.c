/*
 * h2_guard: frame accounting for the HTTP/2 connection defences (see h2_guard.h). A small
 * scanner follows frame boundaries (9-byte header, then the payload) without buffering the
 * payload; it never validates what nghttp2 validates, it only counts.
 */
#include <string.h>

#include "client/h2_guard.h"

#define PREFACE_LEN 24
enum { F_DATA = 0, F_HEADERS = 1, F_PRIORITY = 2, F_SETTINGS = 4, F_PUSH_PROMISE = 5, F_PING = 6,
       F_WINDOW_UPDATE = 8, F_CONTINUATION = 9 };
#define FL_END_STREAM 0x1
#define FL_END_HEADERS 0x4

void h2_guard_init(struct h2_guard *g, size_t max_header_bytes)
{
	memset(g, 0, sizeof(*g));
	g->preface_left = PREFACE_LEN;
	g->block_limit = 2 * (uint64_t)max_header_bytes;
}

static enum h2g_verdict count_control(struct h2_guard *g, bool empty_data, int64_t now)
{
	if (now - g->win_start_us >= H2G_FLOOD_WINDOW_US) {
		g->win_start_us = now;
		g->control = g->empty_data = 0;
	}
	if (empty_data)
		return ++g->empty_data > H2G_MAX_EMPTY_DATA ? H2G_FLOOD : H2G_OK;
	return ++g->control > H2G_MAX_CONTROL ? H2G_FLOOD : H2G_OK;
}

/* A whole frame header was read. */
static enum h2g_verdict frame_begin(struct h2_guard *g, int64_t now)
{
	uint32_t len = ((uint32_t)g->hd[0] << 16) | ((uint32_t)g->hd[1] << 8) | g->hd[2];
	uint8_t type = g->hd[3], flags = g->hd[4];
	g->payload_left = len;
	g->cur_type = type;
	if (type == F_HEADERS || type == F_CONTINUATION || type == F_PUSH_PROMISE) {
		if (!g->in_block)
			g->block_start_us = now;
		g->in_block = !(flags & FL_END_HEADERS);
		g->block_bytes += 9 + (uint64_t)len;
		if (g->block_bytes > g->block_limit)
			return H2G_HEADER_BLOCK;
		if (!g->in_block)
			g->block_bytes = 0;
		return H2G_OK;
	}
	switch (type) {
	case F_SETTINGS: case F_PING: case F_PRIORITY: case F_WINDOW_UPDATE:
		return count_control(g, false, now);
	case F_DATA:
		return len == 0 && !(flags & FL_END_STREAM) ? count_control(g, true, now) : H2G_OK;
	default:
		return H2G_OK;
	}
}

enum h2g_verdict h2_guard_feed(struct h2_guard *g, const uint8_t *p, size_t n, int64_t now_us)
{
	while (n > 0) {
		if (g->preface_left > 0) {
			size_t k = n < g->preface_left ? n : g->preface_left;
			g->preface_left -= k;
			p += k;
			n -= k;
			continue;
		}
		if (g->payload_left > 0) {
			size_t k = n < g->payload_left ? n : g->payload_left;
			g->payload_left -= (uint32_t)k;
			p += k;
			n -= k;
			continue;
		}
		g->hd[g->hd_have++] = *p++;
		n--;
		if (g->hd_have == sizeof(g->hd)) {
			g->hd_have = 0;
			enum h2g_verdict v = frame_begin(g, now_us);
			if (v != H2G_OK)
				return v;
		}
	}
	return H2G_OK;
}

bool h2_guard_block_open(const struct h2_guard *g, int64_t *since_us)
{
	if (since_us)
		*since_us = g->block_start_us;
	/* a HEADERS frame whose payload is still arriving is an open block too */
	bool hdr_frame = g->cur_type == F_HEADERS || g->cur_type == F_CONTINUATION;
	return g->in_block || (g->payload_left > 0 && hdr_frame);
}

bool h2_guard_stream_closed(struct h2_guard *g, bool reset_early)
{
	uint32_t i = g->ring_pos, w = i / 64;
	uint64_t bit = 1ull << (i % 64);
	if (g->ring_fill == H2G_RESET_RING) {
		if (g->ring[w] & bit)
			g->ring_resets--;
	} else {
		g->ring_fill++;
	}
	if (reset_early) {
		g->ring[w] |= bit;
		g->ring_resets++;
	} else {
		g->ring[w] &= ~bit;
	}
	g->ring_pos = (i + 1) % H2G_RESET_RING;
	g->closed++;
	return g->closed >= H2G_RESET_MIN && 2 * (uint64_t)g->ring_resets >= g->ring_fill;
}
