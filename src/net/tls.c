/*
 * tls: OpenSSL 3 contexts. TLS 1.2 is the floor on both sides. mTLS: a client certificate
 * towards upstreams, client-certificate verification on listeners (SPEC §2).
 */
#include <stdio.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>

#include "net/tls.h"
#include "base/util.h"

static void last_error(char *err, size_t errlen, const char *what, const char *file)
{
	unsigned long e = ERR_get_error();
	char buf[256];
	ERR_error_string_n(e, buf, sizeof(buf));
	snprintf(err, errlen, "%s %s: %s", what, file ? file : "", e ? buf : "unknown error");
	ERR_clear_error();
}

SSL_CTX *tls_server_ctx(const char *cert, const char *key, char *err, size_t errlen)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
	if (!ctx) {
		last_error(err, errlen, "cannot create TLS context", NULL);
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
	if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
		last_error(err, errlen, "cannot load certificate", cert);
		SSL_CTX_free(ctx);
		return NULL;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
	    SSL_CTX_check_private_key(ctx) != 1) {
		last_error(err, errlen, "cannot load private key", key);
		SSL_CTX_free(ctx);
		return NULL;
	}
	return ctx;
}

/* Our preference order, in wire format: the first of ours the client offers wins. */
static int alpn_select_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                          const unsigned char *in, unsigned int inlen, void *arg)
{
	static const unsigned char h2[] = "\x02h2", h11[] = "\x08http/1.1";
	const unsigned char *const ours[] = { arg ? h2 : NULL, h11 };
	for (size_t k = 0; k < sizeof(ours) / sizeof(ours[0]); k++) {
		if (!ours[k])
			continue;
		for (unsigned int i = 0; i < inlen; i += 1u + in[i]) {
			if (i + 1u + in[i] <= inlen && in[i] == ours[k][0] &&
			    memcmp(in + i + 1, ours[k] + 1, in[i]) == 0) {
				*out = in + i + 1;
				*outlen = in[i];
				return SSL_TLSEXT_ERR_OK;
			}
		}
	}
	return SSL_TLSEXT_ERR_NOACK;
}

void tls_server_alpn(SSL_CTX *ctx, bool h2)
{
	SSL_CTX_set_alpn_select_cb(ctx, alpn_select_cb, h2 ? (void *)ctx : NULL);
}

SSL_CTX *tls_client_ctx(const char *ca, bool verify, char *err, size_t errlen)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	if (!ctx) {
		last_error(err, errlen, "cannot create TLS context", NULL);
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	if (verify) {
		SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
		int ok = ca && ca[0] ? SSL_CTX_load_verify_locations(ctx, ca, NULL)
		                     : SSL_CTX_set_default_verify_paths(ctx);
		if (ok != 1) {
			last_error(err, errlen, "cannot load CA", ca);
			SSL_CTX_free(ctx);
			return NULL;
		}
	} else {
		SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
	}
	return ctx;
}

int tls_client_use_cert(SSL_CTX *ctx, const char *cert, const char *key, char *err, size_t errlen)
{
	if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
		last_error(err, errlen, "cannot load client certificate", cert);
		return -1;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
	    SSL_CTX_check_private_key(ctx) != 1) {
		last_error(err, errlen, "cannot load client private key", key);
		return -1;
	}
	return 0;
}

int tls_server_verify_clients(SSL_CTX *ctx, const char *client_ca, bool require, char *err,
                              size_t errlen)
{
	STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(client_ca);
	if (!names || SSL_CTX_load_verify_locations(ctx, client_ca, NULL) != 1) {
		sk_X509_NAME_pop_free(names, X509_NAME_free);
		last_error(err, errlen, "cannot load client CA", client_ca);
		return -1;
	}
	/* the CertificateRequest names these CAs, so a client with several certificates picks
	 * the right one; the context owns the list from here */
	SSL_CTX_set_client_CA_list(ctx, names);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | (require ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
	                   NULL);
	return 0;
}

bool tls_error_is_peer_refusal(unsigned long e)
{
	if (ERR_GET_LIB(e) != ERR_LIB_SSL)
		return false;
	switch (ERR_GET_REASON(e)) {
	case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
	case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
	case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
	case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
	case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
	case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
	case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
	case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
	case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
	case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
		return true;
	default:
		return false;
	}
}

enum tls_failure tls_failure_of(const SSL *ssl, unsigned long e)
{
	if (!e)
		return TLSF_NONE;
	if (tls_error_is_peer_refusal(e))
		return TLSF_PEER_REFUSED;
	if (ERR_GET_LIB(e) != ERR_LIB_SSL)
		return TLSF_OTHER;
	switch (ERR_GET_REASON(e)) {
	case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
		return TLSF_NO_CLIENT_CERT;
	case SSL_R_CERTIFICATE_VERIFY_FAILED:
		switch (ssl ? SSL_get_verify_result(ssl) : X509_V_OK) {
		case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
		case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
		case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
		case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
		case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
			return TLSF_UNKNOWN_CA;
		default:
			return TLSF_BAD_CERTIFICATE;
		}
	case SSL_R_WRONG_VERSION_NUMBER:
	case SSL_R_UNSUPPORTED_PROTOCOL:
	case SSL_R_NO_SHARED_CIPHER:
	case SSL_R_NO_PROTOCOLS_AVAILABLE:
	case SSL_R_HTTP_REQUEST:
	case SSL_R_HTTPS_PROXY_REQUEST:
	case SSL_R_UNEXPECTED_MESSAGE:
	case SSL_R_UNEXPECTED_RECORD:
	case SSL_R_PACKET_LENGTH_TOO_LONG:
	case SSL_R_LENGTH_MISMATCH:
	case SSL_R_BAD_PACKET_LENGTH:
	case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION:
	case SSL_R_SSLV3_ALERT_ILLEGAL_PARAMETER:
	case SSL_R_TLSV1_ALERT_INSUFFICIENT_SECURITY:
	case SSL_R_NO_APPLICATION_PROTOCOL:
		return TLSF_PROTOCOL;
	default:
		return TLSF_OTHER;
	}
}

const char *tls_failure_name(enum tls_failure f)
{
#define X_NAME(i, v) [i] = v,
	static const char *const names[TLSF_N] = { [TLSF_NONE] = "none", TLS_FAILURE_VALUES(X_NAME) };
#undef X_NAME
	return (unsigned)f < TLSF_N ? names[f] : "other";
}

void tls_failure_detail(const SSL *ssl, unsigned long e, char *buf, size_t cap)
{
	const char *why = e ? ERR_reason_error_string(e) : NULL;
	long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
	if (e && ERR_GET_LIB(e) == ERR_LIB_SSL &&
	    ERR_GET_REASON(e) == SSL_R_CERTIFICATE_VERIFY_FAILED && v != X509_V_OK)
		snprintf(buf, cap, "%s: %s", why ? why : "certificate verify failed",
		         X509_verify_cert_error_string(v));
	else
		snprintf(buf, cap, "%s", why ? why : "unknown error");
}

SSL *tls_client_ssl(SSL_CTX *ctx, const char *sni, bool verify)
{
	SSL *ssl = SSL_new(ctx);
	if (!ssl)
		return NULL;
	if (sni && sni[0]) {
		SSL_set_tlsext_host_name(ssl, sni);
		if (verify)
			SSL_set1_host(ssl, sni);
	}
	return ssl;
}

void tls_offer_h2(SSL *ssl)
{
	SSL_set_alpn_protos(ssl, (const unsigned char *)"\x02h2", 3);
}

bool tls_selected_h2(SSL *ssl)
{
	const unsigned char *p = NULL;
	unsigned int n = 0;
	if (ssl)
		SSL_get0_alpn_selected(ssl, &p, &n);
	return n == 2 && memcmp(p, "h2", 2) == 0;
}

const char *tls_server_name(const char *configured, const char *endpoint, char *buf, size_t cap)
{
	int port;
	struct in6_addr ip;
	if (configured && configured[0])
		return configured;
	if (split_host_port(endpoint, buf, cap, &port) == 0 && inet_pton(AF_INET, buf, &ip) != 1 &&
	    inet_pton(AF_INET6, buf, &ip) != 1)
		return buf;
	return NULL;
}
