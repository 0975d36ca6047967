/*
 * h2_guard: frame accounting for the HTTP/2 connection defences (see h2_guard.h). A small
 * scanner follows frame boundaries (9-byte header, then the payload) without buffering the
 * payload; it never validates what nghttp2 validates: it counts, and it remembers the
 * states of recent client stream ids that nghttp2 forgets.
 */
#include <string.h>

#include "client/h2_guard.h"

#define PREFACE_LEN 24
enum { F_DATA = 0, F_HEADERS = 1, F_PRIORITY = 2, F_SETTINGS = 4, F_PUSH_PROMISE = 5, F_PING = 6,
       F_WINDOW_UPDATE = 8, F_CONTINUATION = 9 };
#define FL_END_STREAM 0x1
#define FL_END_HEADERS 0x4

/* What the guard remembers of a client stream id (2 bits). UNUSED: below max_sid and never
 * opened, so implicitly closed (RFC 9113 §5.1.1). */
enum { S_UNUSED = 0, S_OPEN = 1, S_CLOSED = 2, S_RESET_BY_US = 3 };

void h2_guard_init(struct h2_guard *g, size_t max_header_bytes)
{
	memset(g, 0, sizeof(*g));
	g->preface_left = PREFACE_LEN;
	g->block_limit = 2 * (uint64_t)max_header_bytes;
}

static void window_roll(struct h2_guard *g, int64_t now)
{
	if (now - g->win_start_us >= H2G_FLOOD_WINDOW_US) {
		g->win_start_us = now;
		g->control = g->acks = g->empty_data = g->data_sent = 0;
	}
}

/* ACKS: a WINDOW_UPDATE or PING, which a conforming client sends in answer to our DATA (a
 * stream and a connection update, and a BDP ping, for each frame at most). */
static enum h2g_verdict count_control(struct h2_guard *g, bool empty_data, bool acks, int64_t now)
{
	window_roll(g, now);
	if (empty_data)
		return ++g->empty_data > H2G_MAX_EMPTY_DATA ? H2G_FLOOD : H2G_OK;
	if (acks)
		return ++g->acks > H2G_MAX_CONTROL + 3 * (uint64_t)g->data_sent ? H2G_FLOOD : H2G_OK;
	return ++g->control > H2G_MAX_CONTROL ? H2G_FLOOD : H2G_OK;
}

void h2_guard_data_sent(struct h2_guard *g, uint32_t n)
{
	g->data_sent = g->data_sent > UINT32_MAX - n ? UINT32_MAX : g->data_sent + n;
}

/* Whether odd client id SID lies in the remembered window. */
static bool sid_known(const struct h2_guard *g, uint32_t sid)
{
	return (sid & 1) && sid <= g->max_sid && g->max_sid - sid < 2 * H2G_STREAM_WINDOW;
}

static unsigned sid_get(const struct h2_guard *g, uint32_t sid)
{
	uint32_t i = (sid >> 1) % H2G_STREAM_WINDOW;
	return (g->sstate[i / 4] >> (2 * (i % 4))) & 3u;
}

static void sid_set(struct h2_guard *g, uint32_t sid, unsigned st)
{
	uint32_t i = (sid >> 1) % H2G_STREAM_WINDOW;
	g->sstate[i / 4] = (uint8_t)((g->sstate[i / 4] & ~(3u << (2 * (i % 4)))) |
	                             (st << (2 * (i % 4))));
}

/* HEADERS opened client stream SID above every earlier one: the ids skipped become unused. */
static void sid_open(struct h2_guard *g, uint32_t sid)
{
	uint32_t from = g->max_sid + 2;
	if (g->max_sid == 0 || sid - g->max_sid >= 2 * H2G_STREAM_WINDOW)
		from = sid >= 2 * H2G_STREAM_WINDOW ? sid - 2 * H2G_STREAM_WINDOW + 2 : 1;
	for (uint32_t x = from; x < sid; x += 2)
		sid_set(g, x, S_UNUSED);
	sid_set(g, sid, S_OPEN);
	g->max_sid = sid;
}

static enum h2g_verdict owe_reset(struct h2_guard *g, uint32_t sid)
{
	for (uint32_t i = 0; i < g->nresets; i++)
		if (g->resets[i] == sid)
			return H2G_OK;
	if (g->nresets == H2G_MAX_RESETS)
		return H2G_STREAM_CLOSED;
	g->resets[g->nresets++] = sid;
	return H2G_OK;
}

/* A HEADERS or DATA frame on client stream SID (odd): RFC 9113 §5.1, §5.1.1, §6.1. */
static enum h2g_verdict stream_frame(struct h2_guard *g, uint8_t type, uint32_t sid)
{
	if (!(sid & 1))
		return H2G_OK;                  /* nghttp2's to refuse */
	if (sid > g->max_sid) {
		if (type == F_HEADERS)
			sid_open(g, sid);
		return H2G_OK;                  /* DATA on an idle stream: nghttp2's */
	}
	if (!sid_known(g, sid))
		return H2G_OK;
	switch (sid_get(g, sid)) {
	case S_UNUSED:
		return type == F_HEADERS ? H2G_PROTOCOL : owe_reset(g, sid);
	case S_CLOSED:
		return type == F_HEADERS ? H2G_STREAM_CLOSED : owe_reset(g, sid);
	default:
		return H2G_OK;
	}
}

bool h2_guard_take_reset(struct h2_guard *g, uint32_t *sid)
{
	if (g->nresets == 0)
		return false;
	*sid = g->resets[0];
	memmove(g->resets, g->resets + 1, --g->nresets * sizeof(g->resets[0]));
	return true;
}

/* A whole frame header was read. */
static enum h2g_verdict frame_begin(struct h2_guard *g, int64_t now)
{
	uint32_t len = ((uint32_t)g->hd[0] << 16) | ((uint32_t)g->hd[1] << 8) | g->hd[2];
	uint8_t type = g->hd[3], flags = g->hd[4];
	uint32_t sid = (((uint32_t)g->hd[5] & 0x7f) << 24) | ((uint32_t)g->hd[6] << 16) |
	               ((uint32_t)g->hd[7] << 8) | g->hd[8];
	g->payload_left = len;
	g->cur_type = type;
	g->cur_sid = sid;
	if (type == F_HEADERS || type == F_CONTINUATION || type == F_PUSH_PROMISE) {
		if (type == F_HEADERS && !g->in_block) {
			enum h2g_verdict v = stream_frame(g, type, sid);
			if (v != H2G_OK)
				return v;
		}
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
	case F_PRIORITY:
		if (sid == 0)                   /* §6.3: a connection error, advertised or not */
			return H2G_PROTOCOL;
		return count_control(g, false, false, now);
	case F_SETTINGS:
		return count_control(g, false, false, now);
	case F_PING: case F_WINDOW_UPDATE:
		return count_control(g, false, true, now);
	case F_DATA: {
		enum h2g_verdict v = stream_frame(g, type, sid);
		if (v != H2G_OK)
			return v;
		return len == 0 && !(flags & FL_END_STREAM) ? count_control(g, true, false, now)
		                                            : H2G_OK;
	}
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
		if (g->hd_have == 0 && n >= sizeof(g->hd)) {
			/* a whole frame header in this piece (nearly always): one copy */
			memcpy(g->hd, p, sizeof(g->hd));
			g->hd_have = sizeof(g->hd);
			p += sizeof(g->hd);
			n -= sizeof(g->hd);
		} else {
			g->hd[g->hd_have++] = *p++;
			n--;
		}
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

bool h2_guard_stream_closed(struct h2_guard *g, uint32_t sid, bool reset_early, bool by_us)
{
	if (sid_known(g, sid))
		sid_set(g, sid, by_us ? S_RESET_BY_US : S_CLOSED);
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
