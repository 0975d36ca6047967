/*
 * config_files: what --check verifies on disk about the files a config names (SPEC §1): TLS
 * certificates, keys and CAs are readable PEM, the access log's directory exists and can be
 * written. Only when the loader runs for --check (ld->check_files); a normal load leaves the
 * files to startup, which reads them anyway. Errors carry the mark of the key that names it.
 * Called by config_schema.c's checks; calls go down only, to config_diag.c.
 */
#include "config/config.h"
#include "config/config_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

/* a key with a passphrase cannot be used unattended: fail instead of prompting on a tty */
static int no_passphrase_cb(char *buf, int size, int rwflag, void *u)
{
	return 0;
}

void files_check_pem(struct load *ld, const struct node *map, const char *key, const char *path,
                     enum pem_kind kind)
{
	static const char *const what[] = {
		[PEM_CERT] = "a PEM certificate",
		[PEM_KEY] = "a PEM private key without a passphrase",
		[PEM_CA] = "PEM CA certificates",
	};
	char q[300];
	bool ok;
	FILE *f;

	if (!ld->check_files || !path || !key_ok(ld, key))
		return;
	cfg_quote(path, q, sizeof q);
	if (!(f = fopen(path, "r"))) {
		key_error(ld, map, key, "cannot read %s: %s (expected a readable file with %s)", q,
		          strerror(errno), what[kind]);
		return;
	}
	if (kind == PEM_KEY) {
		EVP_PKEY *k = PEM_read_PrivateKey(f, NULL, no_passphrase_cb, NULL);
		ok = k != NULL;
		EVP_PKEY_free(k);
	} else {
		X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
		ok = x != NULL;
		X509_free(x);
	}
	fclose(f);
	ERR_clear_error();
	if (!ok)
		key_error(ld, map, key, "%s does not hold %s", q, what[kind]);
}

void files_check_log(struct load *ld, const struct node *map, const char *key, const char *path)
{
	char q[300], *dir;
	const char *slash;

	if (!ld->check_files || !path || !key_ok(ld, key) || !strcmp(path, "off") ||
	    !strcmp(path, "stdout"))
		return;
	cfg_quote(path, q, sizeof q);
	slash = strrchr(path, '/');
	dir = slash == path ? xstrdup("/") : slash ? xstrndup(path, (size_t)(slash - path)) :
	      xstrdup(".");
	if (access(dir, W_OK | X_OK) != 0)
		key_error(ld, map, key, "cannot create %s: directory %s: %s (expected a writable "
		          "directory)", q, dir, strerror(errno));
	else if (access(path, F_OK) == 0 && access(path, W_OK) != 0)
		key_error(ld, map, key, "cannot write %s: %s", q, strerror(errno));
	free(dir);
}
