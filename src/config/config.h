/*
 * config: the YAML policy (SPEC §2) loaded into an immutable, reference-counted struct.
 *
 * config_load() parses the whole file with libyaml, collects every error as
 * "FILE:LINE:COL: path.to.key: what is wrong (what was expected)" and returns NULL when there
 * was any. A loaded config is never modified; a reload builds a new one. Every holder takes a
 * reference (config_ref) and drops it (config_unref); the last unref frees it.
 * Times are microseconds (*_us), sizes bytes.
 */
#ifndef RG_CONFIG_H
#define RG_CONFIG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* retry.on conditions that are not statuses */
#define RETRY_ON_CONNECT_FAILURE 0x1u
#define RETRY_ON_RESET           0x2u
#define RETRY_ON_TIMEOUT         0x4u

/* Bounds the schema enforces, so that no consumer clamps silently: the worker threads (main.c,
 * stats.h's MAX_WORKERS) and the endpoints of one upstream (endpoint.h's MAX_ENDPOINTS) live
 * in fixed arrays of these sizes. tests/unit/test_config.c asserts that they agree. */
#define CFG_MAX_WORKERS   64
#define CFG_MAX_ENDPOINTS 64

enum non_idempotent { NI_REQUIRE_KEY, NI_NEVER, NI_ALWAYS };
enum cfg_log_format { LF_TEXT, LF_JSON };
enum up_protocol { UP_HTTP1, UP_H2 };
enum probe_kind { PROBE_HTTP, PROBE_GRPC };   /* health.active.kind */

struct cfg_deadline {
	int64_t default_us;         /* 5s */
	int64_t max_us;             /* 30s */
	int64_t min_us;             /* 5ms */
};

struct cfg_retry {
	bool enabled;               /* true */
	int max_attempts;           /* 3, >= 1 */
	int64_t per_try_timeout_us; /* 1s */
	unsigned on_flags;          /* RETRY_ON_* */
	uint8_t on_status[200 / 8]; /* bit (status - 400) set: retry on that status (400..599) */
	int64_t backoff_base_us;    /* 25ms */
	int64_t backoff_max_us;     /* 250ms */
	bool retry_after_honor;     /* true */
	int64_t retry_after_max_us; /* 10s */
	double budget_ratio;        /* 0.2 */
	double budget_min_per_second; /* 10 */
	int64_t budget_max_tokens;  /* 100 */
	char *budget_shared;        /* "": this process's bucket; else the redis URL of the
	                             * fleet's (SPEC §4), decoded into: */
	char *budget_shared_host;   /* NULL: not shared */
	int budget_shared_port, budget_shared_db;
	char *budget_shared_user, *budget_shared_password;  /* NULL: none */
	enum non_idempotent non_idempotent; /* require-key */
	int64_t max_body;           /* 64KiB */
	uint32_t on_grpc;           /* bit CODE set: retry on that grpc-status (SPEC §10); the
	                             * default has UNAVAILABLE */
	char **idempotent_paths;    /* retry.idempotent_paths: path prefixes idempotent whatever
	                             * the method (rule 4), default none */
	int nidempotent_paths;
	int non_idempotent_line;    /* where non_idempotent was written (0: the default), so that
	                             * --check can point at it */
	/* hedge (SPEC §14): after hedge_after_us, or the hedge_pct percentile (95, 99) of the
	 * upstream's first-attempt head latency when hedge_pct is set; off when both are 0 */
	int64_t hedge_after_us;     /* 0ms */
	int hedge_pct;              /* 0 */
	int hedge_max_extra;        /* 1, 1..HEDGE_MAX_EXTRA */
};

#define HEDGE_MAX_EXTRA 4

static inline bool cfg_hedge_on(const struct cfg_retry *r)
{
	return r->hedge_after_us > 0 || r->hedge_pct > 0;
}

struct cfg_idempotency {
	bool enabled;               /* false */
	char *header;               /* "Idempotency-Key" (used by retry rule 4 even when disabled) */
	char **methods;             /* ["POST","PATCH"] */
	int nmethods;
	bool require_key;           /* false */
	char **scope_headers;       /* ["Authorization"] */
	int nscope_headers;
	int64_t ttl_us;             /* 24h */
	int64_t lock_timeout_us;    /* 30s */
	int64_t max_body;           /* 1MiB */
	int64_t max_response;       /* 1MiB */
	/* release_on: the answers that say the service did not take the request (SPEC §6), as
	 * retry.on keeps them: bit (status - 400) of release_status, bit CODE of release_grpc */
	uint8_t release_status[200 / 8];    /* default 429, 503 */
	uint32_t release_grpc;              /* default resource-exhausted */
	char *store;                /* "memory" | "redis://[user:password@]host[:port][/db]" */
	/* the redis store URL, decoded at load (all unset for "memory") */
	char *store_host;           /* NULL: memory; an IPv6 literal without brackets */
	int store_port;             /* 6379 when not given */
	int store_db;               /* 0 when not given */
	char *store_user;           /* NULL: none (percent-decoded) */
	char *store_password;       /* NULL: none (percent-decoded) */
};

/* SPEC §11: fault injection for gray tests. The kinds, in the order of
 * cfg_fault_kind_words (config_schema.c) and of faults.h's names. */
enum fault_kind { FAULT_CONNECT_FAILURE, FAULT_ABORT, FAULT_DELAY, FAULT_LOST_RESPONSE, FAULT_NKINDS };

struct cfg_fault_rule {
	int kind;                   /* enum fault_kind */
	double percent;             /* 0..100, fractions allowed */
	char **methods;             /* []: every method */
	int nmethods;
	char *path_prefix;          /* "/" */
	int status;                 /* abort: 503 */
	char *retry_after;          /* abort: "" = no Retry-After */
	int grpc_status;            /* abort, gRPC calls: a Trailers-Only answer with it; -1: none */
	int pushback_ms;            /* abort with grpc_status: grpc-retry-pushback-ms; -1: none */
	int64_t delay_us;           /* delay: 1s */
};

struct cfg_faults {
	bool enabled;               /* false: at start; POST /faults switches it at runtime */
	struct cfg_fault_rule *rules;
	int nrules;
	int64_t stop_after_us;      /* 10m; 0: off */
	double stop_min_success_rate;   /* 0.9; 0: off */
	double stop_max_amplification;  /* 2.0; 0: off */
};

enum balance_mode { BAL_ROUND_ROBIN, BAL_LEAST_REQUEST, BAL_RANDOM };

/* SPEC §13: passive health (outlier detection) and active probes of each endpoint address */
struct cfg_health {
	int consecutive_failures;   /* 5; 0: passive health off */
	int64_t base_ejection_us;   /* 10s */
	int64_t max_ejection_us;    /* 5m */
	int max_ejected_percent;    /* 50 */
	enum probe_kind active_kind; /* http; grpc: grpc.health.v1.Health/Check (needs h2) */
	char *active_path;          /* kind http: "": no probes */
	char *active_service;       /* kind grpc: the service checked ("": the whole server) */
	int64_t active_interval_us; /* 5s */
	int64_t active_timeout_us;  /* 1s */
	int unhealthy_after;        /* 3 */
	int healthy_after;          /* 2 */
};

/* Active health is on (SPEC §13): a path to GET, or the gRPC health service. */
static inline bool cfg_health_active(const struct cfg_health *h)
{
	return h->active_kind == PROBE_GRPC || *h->active_path;
}

struct cfg_upstream {
	char *name;
	char **endpoints;           /* "host:port" as written; names resolved asynchronously */
	int nendpoints;             /* 1..CFG_MAX_ENDPOINTS */
	bool tls;                   /* a tls: block was given */
	char *tls_sni;              /* NULL: none */
	char *tls_ca;               /* NULL: system default store */
	bool tls_verify;            /* true */
	char *tls_cert, *tls_key;   /* NULL: no client certificate; else both (mTLS) */
	char *host_rewrite;         /* "" : send the client's Host */
	enum up_protocol protocol;  /* http1; h2: HTTP/2 (prior knowledge, or ALPN h2 with tls) */
	int64_t connect_timeout_us; /* 250ms */
	struct cfg_deadline deadline;
	struct cfg_retry retry;
	int max_in_flight;          /* 256 */
	int max_retries_in_flight;  /* 32 (effective: min with max_in_flight) */
	enum balance_mode balance;  /* round-robin */
	struct cfg_health health;
	struct cfg_idempotency idem;
	struct cfg_faults faults;
	int line, col;              /* where it was defined, for messages */
};

struct cfg_route {
	char *host;                 /* NULL: any host; "*.example.com" allowed; lower-cased */
	char *path_prefix;          /* "/" */
	char *upstream_name;
	struct cfg_upstream *upstream; /* resolved at load, points into config->upstreams */
	/* The policy of requests on this route (SPEC §2): the upstream's retry and deadline, or
	 * this route's own, merged at load (the upstream's keys with the route's written over
	 * them, key by key). Budget, concurrency, holds, health, idempotency and faults stay the
	 * upstream's: own_retry's budget fields are the upstream's, never the route's. */
	const struct cfg_retry *retry;          /* &upstream->retry or &own_retry */
	const struct cfg_deadline *deadline;    /* &upstream->deadline or &own_deadline */
	struct cfg_retry own_retry;
	struct cfg_deadline own_deadline;
	bool has_retry, has_deadline;           /* the route writes retry: / deadline: */
};

struct cfg_limits {
	int64_t max_header_bytes;   /* 32KiB */
	int64_t header_timeout_us;  /* 10s */
	int64_t max_uri_bytes;      /* 8KiB (effective: min with max_header_bytes) */
	int64_t idle_timeout_us;    /* 60s */
	int64_t max_body;           /* 0 = unlimited */
	int64_t max_connections;    /* 10000 */
	int64_t max_concurrent_streams; /* 100: HTTP/2 streams per connection */
};

struct cfg_listener {
	char *name;
	char *listen;               /* "host:port" */
	bool tls;
	char *tls_cert, *tls_key;
	char *tls_client_ca;        /* NULL: no client certificates asked for; else verified (mTLS) */
	bool tls_require_client_cert; /* true: a client without a valid one fails the handshake */
	bool http2;                 /* true: HTTP/2 by prior knowledge, or ALPN h2 with TLS */
	struct cfg_limits limits;
	struct cfg_route *routes;
	int nroutes;
};

/* SPEC §12: the queue of unknown outcomes */
struct cfg_reconcile {
	int64_t keep;               /* 1000 records in memory, oldest dropped */
	char *redis;                /* "": none; else "redis://[user:password@]host[:port][/db]" */
	char *stream;               /* "retrygate:unknown" */
	/* reconcile.redis decoded at load (host NULL when "") */
	char *redis_host;
	int redis_port, redis_db;
	char *redis_user, *redis_password;
};

struct config {
	atomic_int refs;
	char *path;                 /* the file it was loaded from */
	char *admin_listen;         /* "127.0.0.1:9901"; "" disables the admin listener */
	char *admin_token;          /* "" */
	int workers;                /* 1..CFG_MAX_WORKERS; "auto": the CPU count, capped there */
	int64_t drain_timeout_us;   /* 15s */
	char *access_log;           /* "off" | "stdout" | path */
	char **resolvers;           /* "IP:port" DNS servers; none: those of /etc/resolv.conf */
	int nresolvers;
	enum cfg_log_format log_format; /* text: stderr event lines as text; json: one object each */
	struct cfg_reconcile reconcile;
	struct cfg_listener *listeners;
	int nlisteners;
	struct cfg_upstream *upstreams;
	int nupstreams;
	/* things the loader adjusted (a limit clamped by a smaller one), as
	 * "path.to.key: what happened"; config_report prints them, the caller may log them */
	char **warnings;
	int nwarnings;
	/* the string fields (char * slots in this config) whose value was written ${NAME}: a
	 * secret from the environment, which /config redacts */
	char ***secrets;
	int nsecrets;
};

/* Load and validate PATH. On any error, print every one of them to ERRS and return NULL.
 * The result has one reference. */
struct config *config_load(const char *path, FILE *errs);
/* config_load for --check: also every file the config names must be usable (TLS certificate,
 * key and CA files readable PEM, the access log's directory writable), each failure an
 * error at the key that names it. */
struct config *config_load_check(const char *path, FILE *errs);
/* The same from memory (LEN bytes, need not be NUL-terminated); NAME is used in messages. */
struct config *config_load_buffer(const char *name, const char *data, size_t len, FILE *errs);
struct config *config_ref(struct config *c);
void config_unref(struct config *c);

struct cfg_upstream *config_upstream(const struct config *c, const char *name);
/* The listener named NAME (sessions look their config up by it, reload after reload). */
struct cfg_listener *config_listener(const struct config *c, const char *name);

/* --check report: per upstream the worst case its policy allows, warnings, then "FILE: ok". */
void config_report(const struct config *c, FILE *out);

/* /config: the effective configuration as JSON (admin token and store passwords redacted).
 * Returns a malloc'd NUL-terminated string. */
char *config_to_json(const struct config *c);

/* Every key of the schema, as a dotted path without list indexes or upstream names
 * ("admin.listen", "listeners.routes.host", "upstreams.retry.backoff.base"), parents before
 * their children, in schema order. The documentation test walks this. */
void config_schema_keys(void (*cb)(const char *dotted_path, void *arg), void *arg);

static inline bool cfg_retry_on_status(const struct cfg_retry *r, int status)
{
	if (status < 400 || status > 599)
		return false;
	return (r->on_status[(status - 400) / 8] >> ((status - 400) % 8)) & 1;
}

/* CODE is a grpc-status (grpc.h); retry.on lists it by name. OK is never listed. */
static inline bool cfg_retry_on_grpc(const struct cfg_retry *r, int code)
{
	if (code <= 0 || code >= 32)
		return false;
	return (r->on_grpc >> code) & 1u;
}

/* Is this answer listed in idempotency.release_on? GRPC >= 0: a gRPC response under :status
 * 200, whose code decides (SPEC §10); else the HTTP status. */
static inline bool cfg_idem_release_on(const struct cfg_idempotency *c, int status, int grpc)
{
	if (grpc >= 0 && status == 200)
		return grpc > 0 && grpc < 32 && ((c->release_grpc >> grpc) & 1u);
	if (status < 400 || status > 599)
		return false;
	return (c->release_status[(status - 400) / 8] >> ((status - 400) % 8)) & 1;
}

/* The backoff cap before retry n, as retry.backoff means it: min(max, base * 2^(n-1)),
 * saturating; n below 1 counts as 1; 0 when base or max is not positive. The retry policy
 * draws its jitter under it; the --check report prints it. */
static inline int64_t cfg_backoff_cap(const struct cfg_retry *r, int n)
{
	int64_t cap = r->backoff_base_us;
	if (cap <= 0 || r->backoff_max_us <= 0)
		return 0;
	/* base * 2^(n-1), doubling only while below max: at most 63 steps for any n, and no
	 * overflow even for n = INT_MAX */
	for (int i = 1; i < n && cap < r->backoff_max_us; i++)
		cap = cap > INT64_MAX / 2 ? INT64_MAX : cap * 2;
	return cap < r->backoff_max_us ? cap : r->backoff_max_us;
}

#endif
