/*
 * test_h2_guard: the frame accounting behind the HTTP/2 connection defences (SPEC §9), fed
 * frame bytes in one piece and byte by byte: header-block size, control and empty-DATA floods
 * within the 10 s window (acknowledgements against the DATA we sent), the rapid-reset ratio
 * over the last 1,000 closed streams, and the stream states of RFC 9113 §5.1 nghttp2 forgets.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "client/h2_guard.h"

static size_t frame(uint8_t *b, uint32_t len, uint8_t type, uint8_t flags, uint32_t sid)
{
	b[0] = (uint8_t)(len >> 16); b[1] = (uint8_t)(len >> 8); b[2] = (uint8_t)len;
	b[3] = type; b[4] = flags;
	b[5] = (uint8_t)(sid >> 24); b[6] = (uint8_t)(sid >> 16); b[7] = (uint8_t)(sid >> 8);
	b[8] = (uint8_t)sid;
	memset(b + 9, 'x', len);
	return 9 + len;
}

static enum h2g_verdict feed(struct h2_guard *g, const uint8_t *b, size_t n, int64_t now, int bytewise)
{
	if (!bytewise)
		return h2_guard_feed(g, b, n, now);
	for (size_t i = 0; i < n; i++) {
		enum h2g_verdict v = h2_guard_feed(g, b + i, 1, now);
		if (v != H2G_OK)
			return v;
	}
	return H2G_OK;
}

static void start(struct h2_guard *g, size_t max_header)
{
	h2_guard_init(g, max_header);
	uint8_t preface[24] = { 0 };
	assert_int_equal(h2_guard_feed(g, preface, sizeof(preface), 0), H2G_OK);
}

static void test_header_block_limit(void **state)
{
	for (int bw = 0; bw < 2; bw++) {
		struct h2_guard g;
		uint8_t b[2000];
		start(&g, 1000);            /* limit 2000 bytes of frames */
		size_t n = frame(b, 900, 1, 0, 1);          /* HEADERS, no END_HEADERS */
		assert_int_equal(feed(&g, b, n, 0, bw), H2G_OK);
		assert_true(h2_guard_block_open(&g, NULL));
		n = frame(b, 900, 9, 0, 1);                 /* CONTINUATION */
		assert_int_equal(feed(&g, b, n, 0, bw), H2G_OK);
		n = frame(b, 900, 9, 4, 1);                 /* the third passes 2000 */
		assert_int_equal(feed(&g, b, n, 0, bw), H2G_HEADER_BLOCK);
	}
}

static void test_complete_blocks_reset_the_count(void **state)
{
	struct h2_guard g;
	uint8_t b[2000];
	start(&g, 1000);
	for (int i = 0; i < 50; i++) {
		size_t n = frame(b, 900, 1, 4 | 1, (uint32_t)(2 * i + 1));   /* END_HEADERS */
		assert_int_equal(h2_guard_feed(&g, b, n, 0), H2G_OK);
		assert_false(h2_guard_block_open(&g, NULL));
	}
}

static void test_control_flood_window(void **state)
{
	struct h2_guard g;
	uint8_t b[64];
	start(&g, 1000);
	size_t n = frame(b, 8, 6, 0, 0);                /* PING */
	for (int i = 0; i < H2G_MAX_CONTROL; i++)
		assert_int_equal(h2_guard_feed(&g, b, n, 1000), H2G_OK);
	/* a new window starts after 10 s */
	assert_int_equal(h2_guard_feed(&g, b, n, 1000 + H2G_FLOOD_WINDOW_US), H2G_OK);
	start(&g, 1000);
	n = frame(b, 0, 4, 0, 0);                       /* SETTINGS */
	for (int i = 0; i < H2G_MAX_CONTROL; i++)
		assert_int_equal(h2_guard_feed(&g, b, n, 5), H2G_OK);
	assert_int_equal(h2_guard_feed(&g, b, n, 6), H2G_FLOOD);
}

static void test_empty_data_flood(void **state)
{
	struct h2_guard g;
	uint8_t b[64];
	start(&g, 1000);
	size_t n = frame(b, 0, 0, 1, 1);                /* empty DATA with END_STREAM: fine */
	for (int i = 0; i < 3 * H2G_MAX_EMPTY_DATA; i++)
		assert_int_equal(h2_guard_feed(&g, b, n, 0), H2G_OK);
	n = frame(b, 0, 0, 0, 1);
	for (int i = 0; i < H2G_MAX_EMPTY_DATA; i++)
		assert_int_equal(h2_guard_feed(&g, b, n, 0), H2G_OK);
	assert_int_equal(h2_guard_feed(&g, b, n, 0), H2G_FLOOD);
}

static void test_rapid_reset_ratio(void **state)
{
	struct h2_guard g;
	start(&g, 1000);
	/* fewer than 100 closed streams: never */
	for (int i = 0; i < 99; i++)
		assert_false(h2_guard_stream_closed(&g, 0, true, false));
	assert_true(h2_guard_stream_closed(&g, 0, true, false));
	/* a mostly healthy connection: below half */
	start(&g, 1000);
	for (int i = 0; i < 3000; i++)
		assert_false(h2_guard_stream_closed(&g, 0, i % 3 == 0, false));
	/* the ring forgets: 1000 good ones, then resets until half of the last 1000 */
	int k = 0;
	while (!h2_guard_stream_closed(&g, 0, true, false))
		k++;
	assert_true(k >= 150 && k <= 500);
}

/* WINDOW_UPDATE and PING answer our DATA: the allowance grows with the DATA frames we sent. */
static void test_acks_judged_against_data_sent(void **state)
{
	struct h2_guard g;
	uint8_t b[64];
	start(&g, 1000);
	size_t n = frame(b, 4, 8, 0, 0);                /* WINDOW_UPDATE */
	h2_guard_data_sent(&g, 5000);
	for (int i = 0; i < H2G_MAX_CONTROL + 2 * 5000; i++)
		assert_int_equal(h2_guard_feed(&g, b, n, 1), H2G_OK);
	assert_int_equal(h2_guard_feed(&g, b, n, 1), H2G_OK);      /* up to 3 a DATA frame */
	for (int i = 0; i < 5000 - 1; i++)
		assert_int_equal(h2_guard_feed(&g, b, n, 1), H2G_OK);
	assert_int_equal(h2_guard_feed(&g, b, n, 1), H2G_FLOOD);
	/* SETTINGS are not acknowledgements: their own absolute limit */
	start(&g, 1000);
	h2_guard_data_sent(&g, 5000);
	n = frame(b, 0, 4, 0, 0);
	for (int i = 0; i < H2G_MAX_CONTROL; i++)
		assert_int_equal(h2_guard_feed(&g, b, n, 1), H2G_OK);
	assert_int_equal(h2_guard_feed(&g, b, n, 1), H2G_FLOOD);
	n = frame(b, 4, 8, 0, 0);
	/* without DATA of ours, the absolute limit */
	start(&g, 1000);
	n = frame(b, 4, 8, 0, 0);
	for (int i = 0; i < H2G_MAX_CONTROL; i++)
		assert_int_equal(h2_guard_feed(&g, b, n, 1), H2G_OK);
	assert_int_equal(h2_guard_feed(&g, b, n, 1), H2G_FLOOD);
	/* the DATA counted is the window's: a new window starts from nothing */
	start(&g, 1000);
	h2_guard_data_sent(&g, 5000);
	assert_int_equal(h2_guard_feed(&g, b, n, 1 + H2G_FLOOD_WINDOW_US), H2G_OK);
	for (int i = 1; i < H2G_MAX_CONTROL; i++)
		assert_int_equal(h2_guard_feed(&g, b, n, 2 + H2G_FLOOD_WINDOW_US), H2G_OK);
	assert_int_equal(h2_guard_feed(&g, b, n, 2 + H2G_FLOOD_WINDOW_US), H2G_FLOOD);
}

static enum h2g_verdict on(struct h2_guard *g, uint8_t type, uint8_t flags, uint32_t sid)
{
	uint8_t b[64];
	return h2_guard_feed(g, b, frame(b, type == 2 ? 5 : 1, type, flags, sid), 0);
}

/* RFC 9113 §5.1, §5.1.1, §6.1, §6.3 over the ids the guard remembers. */
static void test_stream_states(void **state)
{
	struct h2_guard g;
	uint32_t sid;
	start(&g, 1000);
	assert_int_equal(on(&g, 2, 0, 0), H2G_PROTOCOL);            /* PRIORITY on stream 0 */
	start(&g, 1000);
	assert_int_equal(on(&g, 2, 0, 3), H2G_OK);                  /* PRIORITY on a stream */
	assert_int_equal(on(&g, 1, 5, 5), H2G_OK);                  /* HEADERS opens 5 */
	assert_int_equal(on(&g, 0, 1, 5), H2G_OK);                  /* DATA on an open stream */
	assert_int_equal(on(&g, 1, 5, 5), H2G_OK);                  /* trailers: nghttp2's */
	assert_false(h2_guard_take_reset(&g, &sid));
	/* 1 and 3 were skipped: implicitly closed */
	assert_int_equal(on(&g, 0, 1, 3), H2G_OK);                  /* DATA: a stream error */
	assert_true(h2_guard_take_reset(&g, &sid));
	assert_int_equal(sid, 3);
	assert_false(h2_guard_take_reset(&g, &sid));
	assert_int_equal(on(&g, 1, 5, 1), H2G_PROTOCOL);            /* HEADERS: unexpected id */
	/* closed at both ends */
	start(&g, 1000);
	assert_int_equal(on(&g, 1, 5, 1), H2G_OK);
	assert_false(h2_guard_stream_closed(&g, 1, false, false));
	assert_int_equal(on(&g, 0, 1, 1), H2G_OK);
	assert_int_equal(on(&g, 0, 1, 1), H2G_OK);                  /* owed once */
	assert_true(h2_guard_take_reset(&g, &sid));
	assert_int_equal(sid, 1);
	assert_false(h2_guard_take_reset(&g, &sid));
	assert_int_equal(on(&g, 1, 5, 1), H2G_STREAM_CLOSED);
	/* reset by us: whatever was in flight is left alone */
	start(&g, 1000);
	assert_int_equal(on(&g, 1, 4, 1), H2G_OK);
	assert_false(h2_guard_stream_closed(&g, 1, false, true));
	assert_int_equal(on(&g, 0, 0, 1), H2G_OK);
	assert_int_equal(on(&g, 1, 5, 1), H2G_OK);
	assert_false(h2_guard_take_reset(&g, &sid));
	/* even ids and idle streams are nghttp2's; too many stream errors at once end it all */
	assert_int_equal(on(&g, 1, 5, 2), H2G_OK);
	assert_int_equal(on(&g, 0, 1, 99), H2G_OK);
	start(&g, 1000);
	assert_int_equal(on(&g, 1, 5, 2 * H2G_MAX_RESETS + 3), H2G_OK);
	for (uint32_t i = 0; i < H2G_MAX_RESETS; i++)
		assert_int_equal(on(&g, 0, 1, 2 * i + 1), H2G_OK);
	assert_int_equal(on(&g, 0, 1, 2 * H2G_MAX_RESETS + 1), H2G_STREAM_CLOSED);
}

/* Only the last H2G_STREAM_WINDOW ids are remembered: older ones are left to nghttp2, and a
 * jump far ahead forgets what was before it. */
static void test_stream_window(void **state)
{
	struct h2_guard g;
	uint32_t sid;
	start(&g, 1000);
	for (uint32_t id = 1; id < 6 * H2G_STREAM_WINDOW; id += 2) {
		assert_int_equal(on(&g, 1, 5, id), H2G_OK);
		assert_false(h2_guard_stream_closed(&g, id, false, false));
	}
	uint32_t top = 6 * H2G_STREAM_WINDOW - 1;
	assert_int_equal(on(&g, 1, 5, top - 2 * (H2G_STREAM_WINDOW - 1)), H2G_STREAM_CLOSED);
	start(&g, 1000);
	for (uint32_t id = 1; id < 6 * H2G_STREAM_WINDOW; id += 2)
		assert_int_equal(on(&g, 1, 5, id), H2G_OK);
	assert_int_equal(on(&g, 1, 5, top - 2 * H2G_STREAM_WINDOW), H2G_OK);     /* too old */
	/* a jump: every id below the new one within the window is unused */
	assert_int_equal(on(&g, 1, 5, top + 10 * H2G_STREAM_WINDOW), H2G_OK);
	assert_int_equal(on(&g, 0, 1, top + 10 * H2G_STREAM_WINDOW - 2), H2G_OK);
	assert_true(h2_guard_take_reset(&g, &sid));
	assert_int_equal(on(&g, 1, 5, top + 10 * H2G_STREAM_WINDOW - 4), H2G_PROTOCOL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_header_block_limit),
		cmocka_unit_test(test_complete_blocks_reset_the_count),
		cmocka_unit_test(test_control_flood_window),
		cmocka_unit_test(test_empty_data_flood),
		cmocka_unit_test(test_rapid_reset_ratio),
		cmocka_unit_test(test_acks_judged_against_data_sent),
		cmocka_unit_test(test_stream_states),
		cmocka_unit_test(test_stream_window),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
