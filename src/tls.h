/*
 * tls: OpenSSL contexts for TLS termination on listeners and TLS to upstreams, built once
 * per loaded config (a reload with a bad certificate fails and the old config keeps serving).
 */
#ifndef RG_TLS_H
#define RG_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <openssl/ssl.h>

SSL_CTX *tls_server_ctx(const char *cert, const char *key, char *err, size_t errlen);
/* ALPN on a listener's context: h2 (when H2) then http/1.1; a client offering neither, or no
 * ALPN at all, gets HTTP/1.1 (SPEC §9). */
void tls_server_alpn(SSL_CTX *ctx, bool h2);
SSL_CTX *tls_client_ctx(const char *ca, bool verify, char *err, size_t errlen);
/* The server name to send and check towards ENDPOINT ("host:port"): CONFIGURED (tls.sni) when
 * set, else the endpoint's host when it is a name, not an address; NULL for none. */
const char *tls_server_name(const char *configured, const char *endpoint, char *buf, size_t cap);
/* A client SSL for one upstream connection: SNI and, when verifying, the expected name. */
SSL *tls_client_ssl(SSL_CTX *ctx, const char *sni, bool verify);

#endif
