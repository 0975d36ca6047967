/* Tiny fast HTTP/1.1 upstream for `make bench` (tests/bench/README.md).
 *
 * One thread, edge-free level-triggered epoll, non-blocking sockets. For every complete request
 * head ("\r\n\r\n") it appends one fixed keep-alive response; pipelined heads are answered in
 * order. Request bodies are not supported (the bench sends GETs only). It never allocates per
 * request, so it is never the bottleneck of a proxy pinned to another core.
 *
 *   upstream PORT [BODY_BYTES] [h1|h2|grpc] [late=P] [seed=N] [status=CODE]
 *                                 listens on 127.0.0.1:PORT; body defaults to 13 bytes
 *
 * late=P (h1 only; the tail bench, tests/bench/tail.py): each response, drawn per request with
 * a generator seeded by seed=N, is late with probability P by a uniform 100-200 ms; a
 * connection's responses still leave in order, so a late one holds back those behind it (as a
 * keep-alive server's would). status=CODE answers CODE instead of 200 (503: a failing
 * upstream). Without them nothing is drawn, nothing waits: the `make bench` upstream.
 *
 * h2 and grpc: HTTP/2 with prior knowledge (h2c) through nghttp2, one server session per
 * connection. Every request stream is answered once its END_STREAM arrived (its body is read
 * and dropped): h2 with 200, text/plain and the body; grpc with 200, content-type
 * application/grpc, one length-prefixed message (5-byte prefix + BODY_BYTES) and the trailers
 * grpc-status: 0 -- the shape of a unary gRPC call. Those two modes are compiled in with
 * -DUPSTREAM_H2 -lnghttp2 (run.sh does); without, the file builds with a bare `cc` as the
 * integration tests and the soak build it, and only h1 is served.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#ifdef UPSTREAM_H2
#include <nghttp2/nghttp2.h>
#endif

#define MAXFD   65536
#define BUFSZ   16384
#define MAXPEND 64          /* responses held back on one connection (late=) */

enum mode { M_H1, M_H2, M_GRPC };

struct conn {
    char   *in;      /* unparsed request bytes */
    size_t  inlen;
    char   *out;     /* pending response bytes */
    size_t  outlen;
    size_t  outoff;
    size_t  outcap;
    int64_t *due;    /* late=: when each held-back response may leave (µs), in order */
    int     pend0, npend;
#ifdef UPSTREAM_H2
    nghttp2_session *ng;     /* h2 and grpc modes */
#endif
};

static struct conn *conns[MAXFD];
static char   resp[512];
static size_t resplen;
static int    ep;
static enum mode mode = M_H1;
static char   h2body[512];   /* the DATA of every h2 / grpc response */
static size_t h2bodylen;
static char   h2cl[16];
static double  late;         /* late=: probability of a late response */
static uint64_t rng = 1;     /* seed= */
static int     tfd = -1;     /* late=: fires at the earliest held-back response's time */
static int     pendfds[MAXFD], npendfds;   /* connections with responses held back */

static void die(const char *what) { perror(what); exit(1); }

static void conn_close(int fd)
{
    struct conn *c = conns[fd];
    if (c) {
#ifdef UPSTREAM_H2
        if (c->ng) nghttp2_session_del(c->ng);
#endif
        if (c->npend)
            for (int i = 0; i < npendfds; i++)
                if (pendfds[i] == fd) { pendfds[i] = pendfds[--npendfds]; break; }
        free(c->due); free(c->in); free(c->out); free(c); conns[fd] = NULL;
    }
    close(fd);
}

/* ------------------------------------------------------------------ late= */

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* xorshift64*: a uniform double in [0, 1) */
static double draw(void)
{
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (double)((rng * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}

/* Arm the timer for the earliest held-back response (disarm with none). */
static void late_arm(void)
{
    int64_t first = 0;
    for (int i = 0; i < npendfds; i++) {
        struct conn *c = conns[pendfds[i]];
        int64_t d = c->due[c->pend0];
        if (!first || d < first) first = d;
    }
    struct itimerspec it = { 0 };
    it.it_value.tv_sec = first / 1000000;
    it.it_value.tv_nsec = first % 1000000 * 1000;
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &it, NULL);
}

/* One response for a complete request head: at once, or held back (late, or behind a late
 * one). -1: too many held back, not our workload. */
static int answer(struct conn *c, int fd)
{
    int64_t due = 0;
    if (late > 0 && draw() < late) due = now_us() + 100000 + (int64_t)(draw() * 100000);
    if (!due && !c->npend) {
        memcpy(c->out + c->outlen, resp, resplen);
        c->outlen += resplen;
        return 0;
    }
    if (c->npend == MAXPEND) return -1;
    if (!c->due && !(c->due = malloc(MAXPEND * sizeof *c->due))) return -1;
    if (c->npend) {
        int64_t prev = c->due[(c->pend0 + c->npend - 1) % MAXPEND];
        if (due < prev) due = prev;               /* in order: not before the one ahead */
    } else {
        pendfds[npendfds++] = fd;
    }
    c->due[(c->pend0 + c->npend++) % MAXPEND] = due;
    late_arm();
    return 0;
}

static int conn_flush(int fd, struct conn *c);

/* The timer fired: every held-back response now due leaves. */
static void late_release(void)
{
    uint64_t n;
    if (read(tfd, &n, sizeof n) < 0) { /* spurious: rearmed below */ }
    int64_t now = now_us();
    for (int i = 0; i < npendfds; i++) {
        int fd = pendfds[i];
        struct conn *c = conns[fd];
        while (c->npend && c->due[c->pend0] <= now && c->outlen + resplen <= BUFSZ * 4) {
            memcpy(c->out + c->outlen, resp, resplen);
            c->outlen += resplen;
            c->pend0 = (c->pend0 + 1) % MAXPEND;
            c->npend--;
        }
        if (!c->npend) pendfds[i--] = pendfds[--npendfds];
        if (conn_flush(fd, c) < 0) { conn_close(fd); i = -1; }   /* the list changed */
    }
    late_arm();
}

/* Try to flush; returns -1 on a dead connection. Switches EPOLLOUT on/off as needed. */
static int conn_flush(int fd, struct conn *c)
{
    while (c->outoff < c->outlen) {
        ssize_t n = send(fd, c->out + c->outoff, c->outlen - c->outoff, MSG_NOSIGNAL);
        if (n > 0) { c->outoff += (size_t)n; continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT, .data.fd = fd };
            epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
            return 0;
        }
        return -1;
    }
    if (c->outlen) {
        c->outlen = c->outoff = 0;
        struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
        epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
    }
    return 0;
}

static int conn_read(int fd, struct conn *c)
{
    for (;;) {
        if (c->inlen == BUFSZ) return -1;               /* head too large: not our workload */
        ssize_t n = recv(fd, c->in + c->inlen, BUFSZ - c->inlen, 0);
        if (n == 0) return -1;
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            return -1;
        }
        c->inlen += (size_t)n;
        /* answer every complete head */
        size_t start = 0;
        for (;;) {
            char *e = memmem(c->in + start, c->inlen - start, "\r\n\r\n", 4);
            if (!e) break;
            start = (size_t)(e - c->in) + 4;
            if (c->outlen + resplen > BUFSZ * 4) return -1;
            if (answer(c, fd) < 0) return -1;
        }
        if (start) { memmove(c->in, c->in + start, c->inlen - start); c->inlen -= start; }
        if ((size_t)n < BUFSZ) break;                   /* drained for now */
    }
    return conn_flush(fd, c);
}

/* ------------------------------------------------------------------ h2 and grpc modes */
#ifdef UPSTREAM_H2

/* nghttp2's output is appended to c->out (grown as needed) and flushed after each read. */
static ssize_t h2_send_cb(nghttp2_session *ng, const uint8_t *data, size_t len, int flags,
                          void *arg)
{
    struct conn *c = arg;
    (void)ng; (void)flags;
    if (c->outlen + len > c->outcap) {
        size_t cap = c->outcap * 2;
        while (cap < c->outlen + len) cap *= 2;
        char *o = realloc(c->out, cap);
        if (!o) return NGHTTP2_ERR_CALLBACK_FAILURE;
        c->out = o; c->outcap = cap;
    }
    memcpy(c->out + c->outlen, data, len);
    c->outlen += len;
    return (ssize_t)len;
}

static ssize_t h2_body_cb(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t length,
                          uint32_t *flags, nghttp2_data_source *src, void *arg)
{
    static const nghttp2_nv trailers[] = {
        { (uint8_t *)"grpc-status", (uint8_t *)"0", 11, 1, NGHTTP2_NV_FLAG_NONE },
    };
    (void)src; (void)arg;
    size_t n = h2bodylen < length ? h2bodylen : length;   /* <= 261 bytes: always all of it */
    memcpy(buf, h2body, n);
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    if (mode == M_GRPC) {
        *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
        nghttp2_submit_trailer(ng, id, trailers, 1);
    }
    return (ssize_t)n;
}

#define NV(n, v) { (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, NGHTTP2_NV_FLAG_NONE }

/* The request is complete (END_STREAM on its HEADERS or last DATA): answer it. */
static int h2_frame_recv_cb(nghttp2_session *ng, const nghttp2_frame *f, void *arg)
{
    (void)arg;
    if ((f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA) ||
        !(f->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    nghttp2_nv h2[] = { NV(":status", "200"), NV("content-type", "text/plain"),
                        NV("server", "bench-upstream"),
                        { (uint8_t *)"content-length", (uint8_t *)h2cl, 14, strlen(h2cl),
                          NGHTTP2_NV_FLAG_NONE } };
    nghttp2_nv grpc[] = { NV(":status", "200"), NV("content-type", "application/grpc"),
                          NV("server", "bench-upstream") };
    nghttp2_data_provider prd = { .read_callback = h2_body_cb };
    if (mode == M_GRPC)
        nghttp2_submit_response(ng, f->hd.stream_id, grpc, 3, &prd);
    else
        nghttp2_submit_response(ng, f->hd.stream_id, h2, 4, &prd);
    return 0;
}

static int h2_new(struct conn *c)
{
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs) != 0) return -1;
    nghttp2_session_callbacks_set_send_callback(cbs, h2_send_cb);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, h2_frame_recv_cb);
    int rv = nghttp2_session_server_new(&c->ng, cbs, c);
    nghttp2_session_callbacks_del(cbs);
    if (rv != 0) return -1;
    /* many streams at once, and windows wide enough that no request body ever waits */
    nghttp2_settings_entry iv[] = {
        { NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 10000 },
        { NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 24 },
    };
    nghttp2_submit_settings(c->ng, NGHTTP2_FLAG_NONE, iv, 2);
    nghttp2_session_set_local_window_size(c->ng, NGHTTP2_FLAG_NONE, 0, 1 << 30);
    return nghttp2_session_send(c->ng) == 0 ? 0 : -1;
}

static int h2_read(int fd, struct conn *c)
{
    for (;;) {
        ssize_t n = recv(fd, c->in, BUFSZ, 0);
        if (n == 0) return -1;
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            return -1;
        }
        if (nghttp2_session_mem_recv(c->ng, (const uint8_t *)c->in, (size_t)n) < 0) return -1;
        if ((size_t)n < BUFSZ) break;
    }
    if (nghttp2_session_send(c->ng) != 0) return -1;
    if (!nghttp2_session_want_read(c->ng) && !nghttp2_session_want_write(c->ng) &&
        c->outlen == c->outoff)
        return -1;
    return conn_flush(fd, c);
}
#else
static int h2_new(struct conn *c) { (void)c; return -1; }
static int h2_read(int fd, struct conn *c) { (void)fd; (void)c; return -1; }
#endif

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PORT [BODY_BYTES] [h1|h2|grpc] [late=P] [seed=N] [status=CODE]\n",
                argv[0]);
        return 2;
    }
    int port = atoi(argv[1]);
    int body = argc > 2 ? atoi(argv[2]) : 13;
    if (body < 0 || body > 256) body = 13;
    if (argc > 3 && strcmp(argv[3], "h2") == 0) mode = M_H2;
    else if (argc > 3 && strcmp(argv[3], "grpc") == 0) mode = M_GRPC;
    else if (argc > 3 && strcmp(argv[3], "h1") != 0) {
        fprintf(stderr, "mode must be h1, h2 or grpc, not '%s'\n", argv[3]);
        return 2;
    }
    int status = 200;
    for (int i = 4; i < argc; i++) {
        if (strncmp(argv[i], "late=", 5) == 0) late = atof(argv[i] + 5);
        else if (strncmp(argv[i], "seed=", 5) == 0) rng = strtoull(argv[i] + 5, NULL, 10) * 2 + 1;
        else if (strncmp(argv[i], "status=", 7) == 0) status = atoi(argv[i] + 7);
        else { fprintf(stderr, "unknown option '%s'\n", argv[i]); return 2; }
    }
    if ((late > 0 || status != 200) && mode != M_H1) {
        fprintf(stderr, "late= and status= are for h1 only\n");
        return 2;
    }
    if (status < 200 || status > 599) status = 200;
#ifndef UPSTREAM_H2
    if (mode != M_H1) {
        fprintf(stderr, "mode %s needs a build with -DUPSTREAM_H2 -lnghttp2\n", argv[3]);
        return 2;
    }
#endif
    char b[257];
    memset(b, 'x', (size_t)body); b[body] = 0;
    if (body == 13) memcpy(b, "hello, world\n", 13);
    resplen = (size_t)snprintf(resp, sizeof resp,
        "HTTP/1.1 %d %s\r\nServer: bench-upstream\r\nContent-Type: text/plain\r\n"
        "Content-Length: %d\r\nConnection: keep-alive\r\n\r\n%s", status,
        status == 200 ? "OK" : status == 503 ? "Service Unavailable" : "Status", body, b);
    if (mode == M_GRPC) {
        /* one gRPC message: uncompressed flag, 4-byte big-endian length, then the bytes */
        h2body[0] = 0;
        h2body[1] = h2body[2] = h2body[3] = 0;
        h2body[4] = (char)body;
        memcpy(h2body + 5, b, (size_t)body);
        h2bodylen = (size_t)body + 5;
    } else {
        memcpy(h2body, b, (size_t)body);
        h2bodylen = (size_t)body;
    }
    snprintf(h2cl, sizeof h2cl, "%zu", h2bodylen);
    signal(SIGPIPE, SIG_IGN);

    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (ls < 0) die("socket");
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
    if (listen(ls, 4096) < 0) die("listen");

    ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1");
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = ls };
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    if (late > 0) {
        tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
        if (tfd < 0) die("timerfd_create");
        struct epoll_event tev = { .events = EPOLLIN, .data.fd = tfd };
        epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &tev);
    }

    struct epoll_event evs[256];
    for (;;) {
        int n = epoll_wait(ep, evs, 256, -1);
        if (n < 0) { if (errno == EINTR) continue; die("epoll_wait"); }
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == ls) {
                for (;;) {
                    int cfd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
                    if (cfd < 0) break;
                    if (cfd >= MAXFD) { close(cfd); continue; }
                    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct conn *c = calloc(1, sizeof *c);
                    if (!c) { close(cfd); continue; }
                    c->in = malloc(BUFSZ);
                    c->out = malloc(BUFSZ * 4);
                    c->outcap = BUFSZ * 4;
                    if (!c->in || !c->out) { free(c->in); free(c->out); free(c); close(cfd); continue; }
                    conns[cfd] = c;
                    if (mode != M_H1 && h2_new(c) != 0) { conn_close(cfd); continue; }
                    struct epoll_event cev = { .events = EPOLLIN, .data.fd = cfd };
                    epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &cev);
                }
                continue;
            }
            if (fd == tfd) { late_release(); continue; }
            struct conn *c = conns[fd];
            if (!c) continue;
            int rc = 0;
            if (evs[i].events & (EPOLLERR | EPOLLHUP)) rc = -1;
            if (!rc && (evs[i].events & EPOLLOUT)) rc = conn_flush(fd, c);
            if (!rc && (evs[i].events & EPOLLIN)) rc = mode == M_H1 ? conn_read(fd, c) : h2_read(fd, c);
            if (rc < 0) conn_close(fd);
        }
    }
}
