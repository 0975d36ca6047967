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
/* Why a TLS handshake failed, the label of the handshake error metrics (SPEC §7): the peer
 * sent no certificate although one is required; its certificate does not chain to a CA we
 * trust; it chains but fails otherwise (expired, wrong name, bad signature); the peer refused
 * ours or the handshake by an alert; no common protocol (version, ciphers, not TLS at all);
 * anything else. V(index, label) lists them for stats.h. */
enum tls_failure {
	TLSF_NONE, TLSF_NO_CLIENT_CERT, TLSF_UNKNOWN_CA, TLSF_BAD_CERTIFICATE, TLSF_PEER_REFUSED,
	TLSF_PROTOCOL, TLSF_OTHER, TLSF_N
};
#define TLS_FAILURE_VALUES(V) \
	V(TLSF_NO_CLIENT_CERT, "no-client-cert") V(TLSF_UNKNOWN_CA, "unknown-ca") \
	V(TLSF_BAD_CERTIFICATE, "bad-certificate") V(TLSF_PEER_REFUSED, "peer-refused") \
	V(TLSF_PROTOCOL, "protocol") V(TLSF_OTHER, "other")
/* What the OpenSSL error E on SSL (whose verify result tells certificate failures apart)
 * means; TLSF_NONE for no error. */
enum tls_failure tls_failure_of(const SSL *ssl, unsigned long e);
const char *tls_failure_name(enum tls_failure f);
/* A short human reason for E on SSL into BUF: OpenSSL's reason, and the certificate check's
 * verdict when that failed. */
void tls_failure_detail(const SSL *ssl, unsigned long e, char *buf, size_t cap);
/* The server name to send and check towards ENDPOINT ("host:port"): CONFIGURED (tls.sni) when
 * set, else the endpoint's host when it is a name, not an address; NULL for none. */
const char *tls_server_name(const char *configured, const char *endpoint, char *buf, size_t cap);
/* A client SSL for one upstream connection: SNI and, when verifying, the expected name. */
SSL *tls_client_ssl(SSL_CTX *ctx, const char *sni, bool verify);
/* Offer h2 by ALPN on a client SSL; after the handshake, did the server select it? */
void tls_offer_h2(SSL *ssl);
bool tls_selected_h2(SSL *ssl);

#endif
