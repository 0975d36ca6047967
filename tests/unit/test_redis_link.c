/*
 * test_redis_link: what the Redis link promises its owners, without a Redis: every command's
 * callback runs exactly once and never inside the call that sent it (link down, connection
 * given up, link freed); the owner hears "down" before the callbacks of the commands lost; a
 * server that accepts and never answers is given up after the reply timeout; a host name
 * without a DNS base is refused. (test_idempotency runs it against a real redis.)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "base/clock.h"
#include "net/redis_link.h"

#define MS 1000LL

struct owner {
	int downs, replies, null_replies;
	int downs_at_first_reply;   /* -1 until a reply came */
};

static void on_down(void *arg, struct redis_link *l)
{
	((struct owner *)arg)->downs++;
}

static const struct redis_link_ops ops = { .down = on_down };

static void on_reply(void *arg, void *cmd, struct redisReply *reply)
{
	struct owner *o = arg;
	if (o->downs_at_first_reply < 0)
		o->downs_at_first_reply = o->downs;
	o->replies++;
	o->null_replies += !reply;
}

/* A listening socket on 127.0.0.1 that never accepts (the kernel completes the handshake);
 * closed at once, its port refuses. */
static int listener(int *port, bool keep)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t n = sizeof a;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(listen(fd, 8), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &n), 0);
	*port = ntohs(a.sin_port);
	if (!keep) {
		close(fd);
		return -1;
	}
	return fd;
}

static struct redis_link_cfg cfg(int port, int64_t reply_timeout_us)
{
	return (struct redis_link_cfg){
		.host = "127.0.0.1", .port = port, .who = "test", .down_note = "waiting",
		.connect_timeout_us = 1000 * MS, .reply_timeout_us = reply_timeout_us,
		.backoff_min_us = 10 * MS, .backoff_max_us = 20 * MS,
	};
}

static void run_until(struct event_base *base, const int *what, int want, int64_t max_us)
{
	int64_t end = clock_now_us() + max_us;
	while (*what < want && clock_now_us() < end)
		event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
}

static void send_ping(struct redis_link *l)
{
	const char *argv[] = { "PING" };
	size_t lens[] = { 4 };
	redis_link_command(l, 1, argv, lens, on_reply, NULL);
}

static void test_refused(void **state)
{
	struct event_base *base = event_base_new();
	struct owner o = { .downs_at_first_reply = -1 };
	int port;
	listener(&port, false);
	struct redis_link_cfg c = cfg(port, 0);
	c.backoff_min_us = c.backoff_max_us = 200 * MS;    /* DOWN for 100 ms at least */
	struct redis_link *l = redis_link_new(base, NULL, &c, &ops, &o, NULL);

	assert_non_null(l);
	run_until(base, &o.downs, 1, 2000 * MS);
	assert_int_equal(o.downs, 1);
	assert_int_equal(redis_link_state(l), REDIS_LINK_DOWN);
	send_ping(l);
	assert_int_equal(o.replies, 0);     /* never from inside the call */
	run_until(base, &o.replies, 1, 50 * MS);
	assert_int_equal(o.replies, 1);
	assert_int_equal(o.null_replies, 1);
	/* it keeps retrying, each failure heard once */
	int before = o.downs;
	run_until(base, &o.downs, before + 2, 2000 * MS);
	assert_true(o.downs >= before + 2);
	redis_link_free(l);
	event_base_free(base);
}

static void test_silent_server_given_up(void **state)
{
	struct event_base *base = event_base_new();
	struct owner o = { .downs_at_first_reply = -1 };
	int port, fd = listener(&port, true);
	struct redis_link_cfg c = cfg(port, 200 * MS);
	struct redis_link *l = redis_link_new(base, NULL, &c, &ops, &o, NULL);

	assert_int_equal(redis_link_state(l), REDIS_LINK_CONNECTING);
	int64_t t0 = clock_now_us();
	send_ping(l);
	run_until(base, &o.replies, 1, 3000 * MS);
	assert_int_equal(o.replies, 1);
	assert_int_equal(o.null_replies, 1);
	assert_int_equal(o.downs_at_first_reply, 1);    /* down first, then the lost command */
	assert_true(clock_now_us() - t0 >= 190 * MS);
	assert_int_equal(redis_link_state(l), REDIS_LINK_DOWN);
	redis_link_free(l);
	close(fd);
	event_base_free(base);
}

static void test_free_calls_back_once(void **state)
{
	struct event_base *base = event_base_new();
	struct owner o = { .downs_at_first_reply = -1 };
	int port, fd = listener(&port, true);
	struct redis_link_cfg c = cfg(port, 0);
	struct redis_link *l = redis_link_new(base, NULL, &c, &ops, &o, NULL);

	send_ping(l);
	send_ping(l);
	run_until(base, &o.replies, 1, 100 * MS);       /* connected meanwhile, no answer */
	assert_int_equal(o.replies, 0);
	redis_link_free(l);
	assert_int_equal(o.replies, 2);
	assert_int_equal(o.null_replies, 2);
	assert_int_equal(o.downs, 0);                   /* freeing is no outage */
	event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(o.replies, 2);
	close(fd);
	event_base_free(base);
}

static void test_name_needs_dns(void **state)
{
	struct event_base *base = event_base_new();
	struct owner o = { .downs_at_first_reply = -1 };
	struct redis_link_cfg c = cfg(6379, 0);
	const char *err = NULL;

	c.host = "redis.example";
	assert_null(redis_link_new(base, NULL, &c, &ops, &o, &err));
	assert_non_null(err);
	assert_true(redis_link_host_is_ip("::1") && redis_link_host_is_ip("10.0.0.1"));
	assert_false(redis_link_host_is_ip("localhost"));
	event_base_free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_silent_server_given_up),
		cmocka_unit_test(test_free_calls_back_once),
		cmocka_unit_test(test_name_needs_dns),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
