/*
 * health: `retrygate --health URL`, a container HEALTHCHECK that needs no other tool: one
 * blocking GET to an http://host:port/path URL (the admin /ready, say), exit 0 on a 2xx,
 * else 1. Runs only in its own short-lived process, never in the proxy.
 */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "health.h"
#include "util.h"

int health_check(const char *url)
{
	const char *p = url;
	if (strncmp(p, "http://", 7) == 0)
		p += 7;
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
	if (split_host_port(hostport, host, sizeof(host), &port) != 0) {
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
	int fd = socket(res->ai_family, SOCK_STREAM, 0);
	struct timeval tv = { 2, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	int rc = connect(fd, res->ai_addr, res->ai_addrlen);
	freeaddrinfo(res);
	if (rc != 0) {
		fprintf(stderr, "health: cannot connect to %s\n", hostport);
		close(fd);
		return 1;
	}
	char req[512];
	int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
	                 path, hostport);
	if (n < 0 || write(fd, req, (size_t)n) != n) {
		close(fd);
		return 1;
	}
	char buf[64] = { 0 };
	ssize_t got = 0;
	while (got < 12) {
		ssize_t k = read(fd, buf + got, sizeof(buf) - 1 - (size_t)got);
		if (k <= 0)
			break;
		got += k;
	}
	close(fd);
	int status = 0;
	if (got >= 12 && sscanf(buf, "HTTP/1.%*d %d", &status) == 1 && status >= 200 && status < 300)
		return 0;
	fprintf(stderr, "health: %s answered %d\n", url, status);
	return 1;
}
