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
/* mTLS towards an upstream: present CERT (a PEM chain) with KEY. 0, or -1 with ERR set. */
int tls_client_use_cert(SSL_CTX *ctx, const char *cert, const char *key, char *err, size_t errlen);
/* mTLS on a listener: ask clients for a certificate and verify it against CLIENT_CA; REQUIRE:
 * a client without one fails the handshake (else only an offered one is verified). 0 or -1. */
int tls_server_verify_clients(SSL_CTX *ctx, const char *client_ca, bool require, char *err,
                              size_t errlen);
/* Is E (an OpenSSL error code) an alert by which the peer refused our handshake, typically
 * our client certificate? With TLS 1.3 the server checks it after our side counts as
 * connected, so the alert arrives in place of a response: the request was never processed. */
bool tls_error_is_peer_refusal(unsigned long e);
/* The server name to send and check towards ENDPOINT ("host:port"): CONFIGURED (tls.sni) when
 * set, else the endpoint's host when it is a name, not an address; NULL for none. */
const char *tls_server_name(const char *configured, const char *endpoint, char *buf, size_t cap);
/* A client SSL for one upstream connection: SNI and, when verifying, the expected name. */
SSL *tls_client_ssl(SSL_CTX *ctx, const char *sni, bool verify);
/* Offer h2 by ALPN on a client SSL; after the handshake, did the server select it? */
void tls_offer_h2(SSL *ssl);
bool tls_selected_h2(SSL *ssl);

#endif
