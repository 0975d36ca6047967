/* Open-loop HTTP/1.1 load generator for the tail bench (tests/bench/tail.py, SPEC §14).
 *
 *   openloop PORT RATE SECONDS [DRAIN_SECONDS]
 *
 * Sends GET /x to 127.0.0.1:PORT at a fixed RATE (requests a second) for SECONDS: request i is
 * due at start + i / RATE and is sent then on an idle keep-alive connection, or on a new one
 * when none is idle; it never waits for a response before sending the next one. Its latency is
 * counted from when it was due to the last byte of its response, so a stall of the generator
 * or of a connection is not hidden (no coordinated omission). Timing: one thread, epoll and a
 * timerfd armed at absolute CLOCK_MONOTONIC times (no busy wait, no millisecond rounding).
 *
 * Prints one JSON object: the requests due, those answered (by class: 2xx, other), errors
 * (connection lost or refused), the connections opened, the latency percentiles p50, p90, p99,
 * p99.9 and max in µs (index floor(n * p) of the sorted answered latencies), how late the
 * generator itself sent (p99 and max of send time - due time, µs) and the sum of the
 * responses' X-Retrygate-Attempts (1 when absent). Requests still unanswered DRAIN_SECONDS
 * (default 5) after the last was due are counted as errors. With OPENLOOP_DUMP=FILE set, every
 * answered request's latency (µs, sorted) is written to FILE, one a line.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAXCONN 4096
#define BUFSZ   8192

static const char REQ[] = "GET /x HTTP/1.1\r\nHost: bench\r\n\r\n";

struct conn {
	int     fd;
	int     busy;       /* a request sent (or to send once connected), its answer awaited */
	int     connecting;
	int64_t due;        /* the in-flight request's due time (µs) */
	size_t  len;        /* bytes in buf */
	char    buf[BUFSZ];
};

static int ep, tfd;
static struct conn *conns[MAXCONN];
static int nconns, opened;
static int idle[MAXCONN], nidle;           /* a stack of idle connections' slots */
static uint32_t *lat, *lag;                /* µs per answered request; send lag per request */
static long nlat, nlag, ok2xx, other, errors, attempts;
static int64_t *backlog;                   /* due times waiting for a connection (MAXCONN) */
static long nback, back0;
static struct sockaddr_in addr;

static int64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void arm(int64_t at)
{
	struct itimerspec it = { .it_value = { at / 1000000, at % 1000000 * 1000 } };
	if (timerfd_settime(tfd, TFD_TIMER_ABSTIME, &it, NULL) < 0)
		die("timerfd_settime");
}

static void conn_free(int slot)
{
	struct conn *c = conns[slot];
	for (int i = 0; i < nidle; i++)
		if (idle[i] == slot) {
			idle[i] = idle[--nidle];
			break;
		}
	close(c->fd);
	free(c);
	conns[slot] = NULL;
	nconns--;
}

static void send_req(int slot, int64_t due);

/* C has no request in flight: the oldest request waiting for a connection, or idle. */
static void conn_ready(int slot)
{
	if (nback) {
		int64_t due = backlog[back0];
		back0 = (back0 + 1) % MAXCONN;
		nback--;
		send_req(slot, due);
	} else {
		idle[nidle++] = slot;
	}
}

static void conn_lost(int slot)
{
	if (conns[slot]->busy)
		errors++;
	conn_free(slot);
}

static void send_req(int slot, int64_t due)
{
	struct conn *c = conns[slot];
	c->busy = 1;
	c->due = due;
	c->len = 0;
	if (c->connecting)
		return;     /* sent once connected */
	int64_t l = now_us() - due;
	lag[nlag++] = l > 0 ? (uint32_t)l : 0;
	ssize_t n = send(c->fd, REQ, sizeof REQ - 1, MSG_NOSIGNAL);
	if (n != (ssize_t)(sizeof REQ - 1))
		conn_lost(slot);    /* a 34-byte request on an idle socket goes whole or not at all */
}

/* A new connection for a request due at DUE; queued when none can be opened now. */
static void conn_open(int64_t due)
{
	int slot = -1;
	for (int i = 0; i < MAXCONN; i++)
		if (!conns[i]) {
			slot = i;
			break;
		}
	if (slot < 0) {
		if (nback == MAXCONN) {
			errors++;
			return;
		}
		backlog[(back0 + nback++) % MAXCONN] = due;
		return;
	}
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		errors++;
		return;
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	struct conn *c = calloc(1, sizeof *c);
	if (!c)
		die("calloc");
	c->fd = fd;
	conns[slot] = c;
	nconns++;
	opened++;
	int rc = connect(fd, (struct sockaddr *)&addr, sizeof addr);
	if (rc < 0 && errno != EINPROGRESS) {
		errors++;
		close(fd);
		free(c);
		conns[slot] = NULL;
		nconns--;
		return;
	}
	c->connecting = rc < 0;
	struct epoll_event ev = { .events = EPOLLIN | (c->connecting ? EPOLLOUT : 0),
	                          .data.u32 = (uint32_t)slot };
	epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
	send_req(slot, due);
}

static void dispatch(int64_t due)
{
	if (nidle)
		send_req(idle[--nidle], due);
	else
		conn_open(due);
}

/* A complete response in c->buf? Consumes it: 1 done, 0 more to read, -1 broken. */
static int parse(struct conn *c, int *closing)
{
	char *e = memmem(c->buf, c->len, "\r\n\r\n", 4);
	if (!e)
		return c->len == BUFSZ ? -1 : 0;
	size_t head = (size_t)(e - c->buf) + 4, body = 0;
	int status = 0, att = 1;
	if (c->len < 12 || sscanf(c->buf, "HTTP/1.%*d %d", &status) != 1)
		return -1;
	*closing = 0;
	for (char *l = memchr(c->buf, '\n', head); l && l < e; l = memchr(l, '\n', (size_t)(e - l))) {
		l++;
		if (!strncasecmp(l, "content-length:", 15))
			body = strtoul(l + 15, NULL, 10);
		else if (!strncasecmp(l, "x-retrygate-attempts:", 21))
			att = atoi(l + 21);
		else if (!strncasecmp(l, "connection:", 11) && !strncasecmp(l + 11 + strspn(l + 11, " "),
		                                                          "close", 5))
			*closing = 1;
	}
	if (head + body > BUFSZ)
		return -1;
	if (c->len < head + body)
		return 0;
	int64_t l = now_us() - c->due;
	lat[nlat++] = l > 0 ? (uint32_t)l : 0;
	attempts += att;
	if (status >= 200 && status < 300)
		ok2xx++;
	else
		other++;
	c->len -= head + body;      /* nothing follows: one request in flight per connection */
	return 1;
}

static void on_conn(int slot, uint32_t events)
{
	struct conn *c = conns[slot];
	if (c->connecting && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
		int err = 0;
		socklen_t sl = sizeof err;
		getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &sl);
		if (err) {
			conn_lost(slot);
			return;
		}
		c->connecting = 0;
		struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)slot };
		epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
		if (c->busy)
			send_req(slot, c->due);
		return;
	}
	if (!(events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
		return;
	for (;;) {
		ssize_t n = recv(c->fd, c->buf + c->len, BUFSZ - c->len, 0);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
			conn_lost(slot);
			return;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		c->len += (size_t)n;
		if (!c->busy) {
			conn_lost(slot);    /* bytes nobody asked for */
			return;
		}
		int closing = 0, rc = parse(c, &closing);
		if (rc < 0) {
			conn_lost(slot);
			return;
		}
		if (rc == 1) {
			c->busy = 0;
			if (closing)
				conn_free(slot);
			else
				conn_ready(slot);
			return;
		}
	}
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static uint32_t pct(const uint32_t *v, long n, double p)
{
	if (!n)
		return 0;
	long i = (long)((double)n * p);
	return v[i < n ? i : n - 1];
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s PORT RATE SECONDS [DRAIN_SECONDS]\n", argv[0]);
		return 2;
	}
	int port = atoi(argv[1]);
	double rate = atof(argv[2]), secs = atof(argv[3]);
	double drain = argc > 4 ? atof(argv[4]) : 5;
	long total = (long)(rate * secs);
	if (port <= 0 || rate <= 0 || total <= 0) {
		fprintf(stderr, "openloop: PORT, RATE and SECONDS must be positive\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	addr.sin_family = AF_INET;
	addr.sin_port = htons((uint16_t)port);
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	lat = malloc(sizeof *lat * (size_t)total);
	lag = malloc(sizeof *lag * (size_t)total);
	backlog = malloc(sizeof *backlog * MAXCONN);
	if (!lat || !lag || !backlog)
		die("malloc");
	ep = epoll_create1(0);
	tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
	if (ep < 0 || tfd < 0)
		die("epoll/timerfd");
	struct epoll_event tev = { .events = EPOLLIN, .data.u32 = UINT32_MAX };
	epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &tev);

	int64_t start = now_us() + 10000;
	long next = 0;     /* the next request to send */
	int64_t end = 0;   /* when the drain is over */
	arm(start);
	struct epoll_event evs[256];
	for (;;) {
		int n = epoll_wait(ep, evs, 256, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("epoll_wait");
		}
		for (int i = 0; i < n; i++) {
			uint32_t slot = evs[i].data.u32;
			if (slot != UINT32_MAX) {
				if (conns[slot])
					on_conn((int)slot, evs[i].events);
				continue;
			}
			uint64_t x;
			if (read(tfd, &x, sizeof x) < 0) { /* spurious: rearmed below */ }
			int64_t now = now_us();
			while (next < total && start + (int64_t)((double)next * 1e6 / rate) <= now)
				dispatch(start + (int64_t)((double)next++ * 1e6 / rate));
			if (next < total) {
				arm(start + (int64_t)((double)next * 1e6 / rate));
			} else if (!end) {
				end = now + (int64_t)(drain * 1e6);
				arm(end);
			}
		}
		if (next == total && (nlat + errors >= total || now_us() >= end))
			break;
	}
	long unanswered = total - nlat - errors;
	errors += unanswered;
	qsort(lat, (size_t)nlat, sizeof *lat, cmp_u32);
	qsort(lag, (size_t)nlag, sizeof *lag, cmp_u32);
	const char *dump = getenv("OPENLOOP_DUMP");
	FILE *f = dump ? fopen(dump, "w") : NULL;
	for (long i = 0; f && i < nlat; i++)
		fprintf(f, "%u\n", lat[i]);
	if (f)
		fclose(f);
	printf("{\"requests\": %ld, \"answered\": %ld, \"ok2xx\": %ld, \"other\": %ld, "
	       "\"errors\": %ld, \"connections\": %d, \"p50_us\": %u, \"p90_us\": %u, "
	       "\"p99_us\": %u, \"p999_us\": %u, \"max_us\": %u, \"send_lag_p99_us\": %u, "
	       "\"send_lag_max_us\": %u, \"attempts\": %ld}\n",
	       total, nlat, ok2xx, other, errors, opened, pct(lat, nlat, 0.50), pct(lat, nlat, 0.90),
	       pct(lat, nlat, 0.99), pct(lat, nlat, 0.999), nlat ? lat[nlat - 1] : 0,
	       pct(lag, nlag, 0.99), nlag ? lag[nlag - 1] : 0, attempts);
	return 0;
}
