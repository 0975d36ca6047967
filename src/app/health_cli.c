/*
 * health_cli: `retrygate --health URL`, a container HEALTHCHECK that needs no other tool: one
 * blocking GET to an http:// or https://host[:port]/path URL (the admin /ready, say), exit 0
 * on a 2xx, else 1. https verifies no certificate: it is a liveness probe of a local address,
 * not a client to trust. Runs only in its own short-lived process, never in the proxy.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "app/health_cli.h"
#include "base/util.h"

#define HEALTH_TIMEOUT_S 2

/* The connection: a socket, and a TLS session on it for https. */
struct probe {
	int fd;
	SSL_CTX *ctx;
	SSL *ssl;
};

static void probe_close(struct probe *pr)
{
	if (pr->ssl)
		SSL_free(pr->ssl);
	if (pr->ctx)
		SSL_CTX_free(pr->ctx);
	if (pr->fd >= 0)
		close(pr->fd);
}

static int probe_write(struct probe *pr, const char *buf, int n)
{
	if (pr->ssl)
		return SSL_write(pr->ssl, buf, n) == n ? 0 : -1;
	return write(pr->fd, buf, (size_t)n) == n ? 0 : -1;
}

static int probe_read(struct probe *pr, char *buf, int cap)
{
	if (pr->ssl)
		return SSL_read(pr->ssl, buf, cap);
	return (int)read(pr->fd, buf, (size_t)cap);
}

/* TLS on the connected socket: SNI when HOST is a name, no verification. 0 or -1. */
static int probe_tls(struct probe *pr, const char *host)
{
	pr->ctx = SSL_CTX_new(TLS_client_method());
	if (!pr->ctx)
		return -1;
	SSL_CTX_set_verify(pr->ctx, SSL_VERIFY_NONE, NULL);
	pr->ssl = SSL_new(pr->ctx);
	if (!pr->ssl || SSL_set_fd(pr->ssl, pr->fd) != 1)
		return -1;
	unsigned char addr[16];
	if (inet_pton(AF_INET, host, addr) != 1 && inet_pton(AF_INET6, host, addr) != 1)
		SSL_set_tlsext_host_name(pr->ssl, host);
	return SSL_connect(pr->ssl) == 1 ? 0 : -1;
}

/* "host:port", "[v6]:port", or either without the port (the scheme's default). 0 or -1. */
static int health_host_port(const char *hostport, int default_port, char *host, size_t cap,
                            int *port)
{
	if (split_host_port(hostport, host, cap, port) == 0)
		return 0;
	char with_port[320];
	snprintf(with_port, sizeof(with_port), "%s:%d", hostport, default_port);
	return split_host_port(with_port, host, cap, port);
}

int health_check(const char *url)
{
	const char *p = url;
	bool tls = false;
	if (strncmp(p, "http://", 7) == 0) {
		p += 7;
	} else if (strncmp(p, "https://", 8) == 0) {
		p += 8;
		tls = true;
	} else if (strstr(p, "://")) {
		fprintf(stderr, "health: %s: only http:// and https:// URLs\n", url);
		return 1;
	}
	const char *slash = strchr(p, '/');
	char hostport[300];
	size_t hl = slash ? (size_t)(slash - p) : strlen(p);
	if (hl == 0 || hl >= sizeof(hostport)) {
		fprintf(stderr, "health: bad URL %s\n", url);
		return 1;
	}
	memcpy(hostport, p, hl);
	hostport[hl] = 0;
	const char *path = slash ? slash : "/";
	char host[256];
	int port;
	if (health_host_port(hostport, tls ? 443 : 80, host, sizeof(host), &port) != 0) {
		fprintf(stderr, "health: bad host:port in %s\n", url);
		return 1;
	}
	char portstr[16];
	snprintf(portstr, sizeof(portstr), "%d", port);
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
	if (getaddrinfo(host, portstr, &hints, &res) != 0 || !res) {
		fprintf(stderr, "health: cannot resolve %s\n", host);
		return 1;
	}
	struct probe pr = { .fd = socket(res->ai_family, SOCK_STREAM, 0) };
	struct timeval tv = { HEALTH_TIMEOUT_S, 0 };
	setsockopt(pr.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(pr.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	int rc = connect(pr.fd, res->ai_addr, res->ai_addrlen);
	freeaddrinfo(res);
	if (rc != 0) {
		fprintf(stderr, "health: cannot connect to %s\n", hostport);
		probe_close(&pr);
		return 1;
	}
	if (tls && probe_tls(&pr, host) != 0) {
		unsigned long e = ERR_get_error();
		fprintf(stderr, "health: TLS handshake with %s failed: %s\n", hostport,
		        e ? ERR_reason_error_string(e) : "connection closed");
		probe_close(&pr);
		return 1;
	}
	char req[512];
	int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
	                 path, hostport);
	if (n < 0 || n >= (int)sizeof(req) || probe_write(&pr, req, n) != 0) {
		fprintf(stderr, "health: cannot send the request to %s\n", hostport);
		probe_close(&pr);
		return 1;
	}
	char buf[64] = { 0 };
	int got = 0;
	while (got < 12) {
		int k = probe_read(&pr, buf + got, (int)sizeof(buf) - 1 - got);
		if (k <= 0)
			break;
		got += k;
	}
	probe_close(&pr);
	int status = 0;
	if (got >= 12 && sscanf(buf, "HTTP/1.%*d %d", &status) == 1 && status >= 200 && status < 300)
		return 0;
	fprintf(stderr, "health: %s answered %d\n", url, status);
	return 1;
}
