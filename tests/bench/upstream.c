/* Tiny fast HTTP/1.1 upstream for `make bench` (tests/bench/README.md).
 *
 * One thread, edge-free level-triggered epoll, non-blocking sockets. For every complete request
 * head ("\r\n\r\n") it appends one fixed keep-alive response; pipelined heads are answered in
 * order. Request bodies are not supported (the bench sends GETs only). It never allocates per
 * request, so it is never the bottleneck of a proxy pinned to another core.
 *
 *   upstream PORT [BODY_BYTES]      listens on 127.0.0.1:PORT; body defaults to 13 bytes
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
#include <unistd.h>

#define MAXFD   65536
#define BUFSZ   16384

struct conn {
    char   *in;      /* unparsed request bytes */
    size_t  inlen;
    char   *out;     /* pending response bytes */
    size_t  outlen;
    size_t  outoff;
};

static struct conn *conns[MAXFD];
static char   resp[512];
static size_t resplen;
static int    ep;

static void die(const char *what) { perror(what); exit(1); }

static void conn_close(int fd)
{
    struct conn *c = conns[fd];
    if (c) { free(c->in); free(c->out); free(c); conns[fd] = NULL; }
    close(fd);
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
            memcpy(c->out + c->outlen, resp, resplen);
            c->outlen += resplen;
        }
        if (start) { memmove(c->in, c->in + start, c->inlen - start); c->inlen -= start; }
        if ((size_t)n < BUFSZ) break;                   /* drained for now */
    }
    return conn_flush(fd, c);
}

int main(int argc, char **argv)
{
    if (argc < 2) { fprintf(stderr, "usage: %s PORT [BODY_BYTES]\n", argv[0]); return 2; }
    int port = atoi(argv[1]);
    int body = argc > 2 ? atoi(argv[2]) : 13;
    if (body < 0 || body > 256) body = 13;
    char b[257];
    memset(b, 'x', (size_t)body); b[body] = 0;
    if (body == 13) memcpy(b, "hello, world\n", 13);
    resplen = (size_t)snprintf(resp, sizeof resp,
        "HTTP/1.1 200 OK\r\nServer: bench-upstream\r\nContent-Type: text/plain\r\n"
        "Content-Length: %d\r\nConnection: keep-alive\r\n\r\n%s", body, b);
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
                    if (!c->in || !c->out) { free(c->in); free(c->out); free(c); close(cfd); continue; }
                    conns[cfd] = c;
                    struct epoll_event cev = { .events = EPOLLIN, .data.fd = cfd };
                    epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &cev);
                }
                continue;
            }
            struct conn *c = conns[fd];
            if (!c) continue;
            int rc = 0;
            if (evs[i].events & (EPOLLERR | EPOLLHUP)) rc = -1;
            if (!rc && (evs[i].events & EPOLLOUT)) rc = conn_flush(fd, c);
            if (!rc && (evs[i].events & EPOLLIN)) rc = conn_read(fd, c);
            if (rc < 0) conn_close(fd);
        }
    }
}
