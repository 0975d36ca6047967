/*
 * listener: accept loop with a process-wide connection cap per listener name.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#include "base/clock.h"
#include "config/config.h"
#include "net/listener.h"
#include "base/log.h"
#include "base/util.h"
#include "base/loop.h"

#define PAUSE_POLL_US   (20 * 1000)
#define EMFILE_PAUSE_US (100 * 1000)
#define MAX_PARKED      16

/* per listener name, shared by the workers */
struct lcount {
	char *name;
	_Atomic int64_t conns;
	struct lcount *next;
};

static pthread_mutex_t lc_lock = PTHREAD_MUTEX_INITIALIZER;
static struct lcount *lc_head;

static struct lcount *lcount_get(const char *name)
{
	pthread_mutex_lock(&lc_lock);
	struct lcount *c;
	for (c = lc_head; c; c = c->next)
		if (strcmp(c->name, name) == 0)
			break;
	if (!c) {
		c = xcalloc(1, sizeof(*c));
		c->name = xstrdup(name);
		c->next = lc_head;
		lc_head = c;
	}
	pthread_mutex_unlock(&lc_lock);
	return c;
}

struct listener {
	struct loop *loop;
	struct listener_owner own;
	char *name;
	char *addr;                     /* the address its socket was bound to */
	struct evconnlistener *evl;
	struct event *pause_ev;
	bool paused, stopped;
	int local;                      /* connections of this socket still open (its worker's) */
	struct lcount *count;
	/* its entry in the config of generation cached_gen (0: none looked up yet): keyed by
	 * generation, not by the config's address, which a later config may reuse */
	uint64_t cached_gen;
	struct cfg_listener *cached;
	/* connections accepted past the cap (another worker took the last place at the same
	 * moment): held, unread, until a place frees -- at the cap a connection waits, it is
	 * never refused (SPEC §2) */
	struct parked {
		evutil_socket_t fd;
		struct sockaddr_storage sa;
		int salen;
	} parked[MAX_PARKED];
	int nparked;
};

/* Addresses this process has bound already (main thread: startup and reloads): the first socket
 * of an address is the one that checks for another process; the workers' further sockets
 * join it. */
static struct bound_addr {
	struct sockaddr_storage ss;
	socklen_t len;
} *bound;
static int nbound;

static bool bound_before(const struct sockaddr_storage *ss, socklen_t len)
{
	for (int i = 0; i < nbound; i++)
		if (bound[i].len == len && memcmp(&bound[i].ss, ss, (size_t)len) == 0)
			return true;
	return false;
}

/* socket + SO_REUSEADDR (+ SO_REUSEPORT) + bind (+ listen). -1 with *err set. */
static int bind_one(const struct sockaddr_storage *ss, socklen_t len, bool reuseport,
                    bool do_listen, const char **err)
{
	int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		*err = strerror(errno);
		return -1;
	}
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (reuseport)
		setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
	if (bind(fd, (const struct sockaddr *)ss, len) != 0 || (do_listen && listen(fd, 1024) != 0)) {
		*err = errno == EADDRINUSE ? "address already in use (another process listens there)"
		                           : strerror(errno);
		close(fd);
		return -1;
	}
	return fd;
}

/*
 * One instance per address: SO_REUSEPORT would let a second process (same user) join our
 * group silently, and the kernel would share connections -- and admin POSTs -- between the
 * two. So the first socket of an address is preceded by a probe bound without SO_REUSEPORT
 * (SO_REUSEADDR only: TIME_WAIT leftovers of a previous run do not count), which fails with
 * EADDRINUSE while any other socket listens there. The probe is closed and the SO_REUSEPORT
 * socket bound and listening two system calls later: a process starting in that window
 * (microseconds) could still join, which a concurrent double start alone can hit.
 */
int listener_bind(const char *addr, const char **err)
{
	struct sockaddr_storage ss;
	int len = sizeof(ss);
	if (evutil_parse_sockaddr_port(addr, (struct sockaddr *)&ss, &len) != 0) {
		*err = "not an address:port";
		return -1;
	}
	bool port0 = (ss.ss_family == AF_INET && ((struct sockaddr_in *)&ss)->sin_port == 0) ||
	             (ss.ss_family == AF_INET6 && ((struct sockaddr_in6 *)&ss)->sin6_port == 0);
	if (!port0 && !bound_before(&ss, (socklen_t)len)) {
		int probe = bind_one(&ss, (socklen_t)len, false, false, err);
		if (probe < 0)
			return -1;
		close(probe);
		bound = xrealloc(bound, (size_t)(nbound + 1) * sizeof(*bound));
		bound[nbound].ss = ss;
		bound[nbound++].len = (socklen_t)len;
	}
	return bind_one(&ss, (socklen_t)len, true, true, err);
}

int listener_bind_single(const char *addr, const char **err)
{
	struct sockaddr_storage ss;
	int len = sizeof(ss);
	if (evutil_parse_sockaddr_port(addr, (struct sockaddr *)&ss, &len) != 0) {
		*err = "not an address:port";
		return -1;
	}
	return bind_one(&ss, (socklen_t)len, false, true, err);
}

/* Its entry in the current config; NULL once a reload removed it or moved it to another
 * address (a socket bound for the new address takes over the name). */
static struct cfg_listener *current(struct listener *l)
{
	uint64_t gen = 0;
	const struct config *cfg = l->own.config(l->own.arg, &gen);
	if (gen != l->cached_gen || !l->cached_gen) {
		l->cached_gen = gen;
		l->cached = config_listener(cfg, l->name);
		if (l->cached && strcmp(l->cached->listen, l->addr) != 0)
			l->cached = NULL;
	}
	return l->cached;
}

bool listener_check(struct listener *l)
{
	if (current(l))
		return true;
	listener_stop(l);
	return false;
}

static void pause_for(struct listener *l, int64_t us)
{
	if (!l->paused) {
		evconnlistener_disable(l->evl);
		l->paused = true;
	}
	struct timeval tv = clock_tv(us);
	evtimer_add(l->pause_ev, &tv);
}

/* Start sessions for parked connections while places are free, oldest first. */
static void unpark(struct listener *l, int64_t cap)
{
	while (l->nparked > 0) {
		int64_t n = atomic_fetch_add(&l->count->conns, 1) + 1;
		if (n > cap) {
			atomic_fetch_sub(&l->count->conns, 1);
			return;
		}
		struct parked p = l->parked[0];
		l->nparked--;
		memmove(&l->parked[0], &l->parked[1], sizeof(l->parked[0]) * (size_t)l->nparked);
		l->local++;
		l->own.on_accept(l->own.arg, l, l->name, p.fd, (struct sockaddr *)&p.sa, p.salen);
	}
}

static void pause_cb(evutil_socket_t fd, short what, void *arg)
{
	struct listener *l = arg;
	if (l->stopped || !listener_check(l))
		return;
	int64_t cap = l->cached->limits.max_connections;
	unpark(l, cap);
	if (l->nparked > 0 || atomic_load(&l->count->conns) >= cap) {
		pause_for(l, PAUSE_POLL_US);
		return;
	}
	l->paused = false;
	evconnlistener_enable(l->evl);
}

static void accept_cb(struct evconnlistener *evl, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
	struct listener *l = arg;
	if (!listener_check(l)) {
		/* removed by a reload the worker has not heard of yet: no new sessions */
		close(fd);
		return;
	}
	int64_t cap = l->cached->limits.max_connections;
	int64_t n = atomic_fetch_add(&l->count->conns, 1) + 1;
	if (n > cap) {
		/* another worker took the last place at the same moment: park it */
		atomic_fetch_sub(&l->count->conns, 1);
		if (l->nparked < MAX_PARKED && salen > 0 && (size_t)salen <= sizeof(l->parked[0].sa)) {
			struct parked *p = &l->parked[l->nparked++];
			p->fd = fd;
			memcpy(&p->sa, sa, (size_t)salen);
			p->salen = salen;
		} else {
			close(fd);
		}
		pause_for(l, PAUSE_POLL_US);
		return;
	}
	if (n == cap)
		pause_for(l, PAUSE_POLL_US);
	l->local++;
	l->own.on_accept(l->own.arg, l, l->name, fd, sa, salen);
}

static void accept_error_cb(struct evconnlistener *evl, void *arg)
{
	struct listener *l = arg;
	int err = EVUTIL_SOCKET_ERROR();
	/* out of descriptors: pause instead of spinning on a readable listen socket */
	log_warn("listener %s: accept: %s; pausing", l->name, evutil_socket_error_to_string(err));
	pause_for(l, EMFILE_PAUSE_US);
}

struct listener *listener_new(struct loop *loop, const struct listener_owner *own,
                              const char *name, const char *addr, int fd)
{
	struct listener *l = xcalloc(1, sizeof(*l));
	l->loop = loop;
	l->own = *own;
	l->name = xstrdup(name);
	l->addr = xstrdup(addr);
	l->count = lcount_get(name);
	/* backlog 0: the socket listens already (listener_bind, 1024); -1 would listen() again
	 * with libevent's default of 128, and a burst of connects would see SYNs dropped */
	l->evl = evconnlistener_new(loop->base, accept_cb, l, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
	                            0, fd);
	evconnlistener_set_error_cb(l->evl, accept_error_cb);
	l->pause_ev = evtimer_new(loop->base, pause_cb, l);
	return l;
}

void listener_stop(struct listener *l)
{
	if (l->stopped)
		return;
	l->stopped = true;
	evtimer_del(l->pause_ev);
	while (l->nparked > 0)
		close(l->parked[--l->nparked].fd);
	evconnlistener_free(l->evl);    /* closes the socket: the kernel stops queueing to it */
	l->evl = NULL;
}

void listener_free(struct listener *l)
{
	listener_stop(l);
	event_free(l->pause_ev);
	free(l->name);
	free(l->addr);
	free(l);
}

bool listener_done(const struct listener *l)
{
	return l->stopped && l->local == 0;
}

void listener_release(struct listener *l)
{
	l->local--;
	atomic_fetch_sub(&l->count->conns, 1);
	if (l->paused && !l->stopped) {
		evtimer_del(l->pause_ev);
		pause_cb(-1, 0, l);
	}
}
