/*
 * config_report: the --check report. Per listener its routes; per upstream the worst case
 * its policy allows (attempts, amplification, concurrency, latency against the deadlines,
 * Retry-After); then warnings: the loader's adjustments and policies that are legal but
 * probably not meant. Reads a loaded config only; prints to OUT, ends with "FILE: ok".
 * Calls go down only, to config_values.c (the retry.on words).
 */
#include "config/config.h"
#include "config/config_impl.h"
#include "http/grpc.h"

#include <stdio.h>
#include <string.h>

/* For people: "5s", "250ms", and "3.075s" rather than "3075ms" */
static const char *dur(int64_t us, char *buf)
{
	if (us > 1000000 && us % 1000000 && us % 1000 == 0) {
		int n = snprintf(buf, 32, "%lld.%03lld", (long long)(us / 1000000),
		                 (long long)(us % 1000000 / 1000));
		while (buf[n - 1] == '0')
			buf[--n] = '\0';
		snprintf(buf + n, (size_t)(32 - n), "s");
	} else
		format_duration(us, buf, 32);
	return buf;
}

/* SPEC §13: balancing, passive ejection and active probes, in one or two lines */
static void report_health(FILE *out, const struct cfg_upstream *u)
{
	static const char *const modes[] = { "round-robin", "least-request", "random" };
	const struct cfg_health *h = &u->health;
	char a[32], b[32];
	fprintf(out, "  balance        %s over the endpoints not ejected\n", modes[u->balance]);
	if (h->consecutive_failures > 0)
		fprintf(out, "  passive health eject after %d failures in a row for %s x n (at most %s), "
		        "at most %d%% of the endpoints at once\n", h->consecutive_failures,
		        dur(h->base_ejection_us, a), dur(h->max_ejection_us, b), h->max_ejected_percent);
	else
		fprintf(out, "  passive health off (consecutive_failures: 0)\n");
	if (h->active_kind == PROBE_GRPC)
		fprintf(out, "  active health  grpc.health.v1 Check \"%s\"", h->active_service);
	else if (*h->active_path)
		fprintf(out, "  active health  GET %s", h->active_path);
	else
		fprintf(out, "  active health  off (no path)\n");
	if (cfg_health_active(h))
		fprintf(out, " every %s (timeout %s): down after %d failures, up after %d successes\n",
		        dur(h->active_interval_us, a), dur(h->active_timeout_us, b), h->unhealthy_after,
		        h->healthy_after);
}

/* How deadline D treats the worst case of N attempts that all time out after maximal
 * backoffs: attempt i starts at S(i) and is started only if S(i) + min <= D (SPEC §3).
 * Returns whether all of them run to their end. */
static bool report_deadline(FILE *out, const struct cfg_retry *r, const struct cfg_deadline *dl,
                            int n, const char *what, int64_t d, bool quiet)
{
	int64_t start = 0;
	int full = 0, started = 0;
	char a[32];

	for (int i = 1; i <= n; i++) {
		if (i > 1)
			start += r->per_try_timeout_us + cfg_backoff_cap(r, i - 1);
		if (start + dl->min_us > d)
			break;
		started = i;
		if (start + r->per_try_timeout_us <= d)
			full = i;
	}
	if (quiet && full == n)
		return true;
	if (full == n)
		fprintf(out, "fits %s %s", what, dur(d, a));
	else if (n == 1)
		fprintf(out, "%s %s cuts it short", what, dur(d, a));
	else if (started > full)
		fprintf(out, "%s %s cuts attempt %d of %d short", what, dur(d, a), started, n);
	else
		fprintf(out, "%s %s leaves room for %d of %d attempts", what, dur(d, a), full, n);
	return full == n;
}

static bool retry_on_any(const struct cfg_retry *r)
{
	for (size_t i = 0; i < sizeof r->on_status; i++)
		if (r->on_status[i])
			return true;
	return r->on_flags != 0 || r->on_grpc != 0;
}

/* The budget's long-run bound per first attempt at a traffic of RATE first attempts a second:
 * each adds `ratio` tokens and time adds min_per_second, so 1 + ratio + min_per_second / rate,
 * never above the N attempts of one request. Low traffic is where the time term dominates. */
static void report_sustained(FILE *out, const struct cfg_retry *r, int n)
{
	static const int rates[] = { 1, 10, 100, 1000 };

	fputs("  sustained     ", out);
	for (size_t i = 0; i < sizeof rates / sizeof *rates; i++) {
		double x = 1 + r->budget_ratio + r->budget_min_per_second / rates[i];
		fprintf(out, "%s %.2fx at %d%s%s", i ? "," : "", x < n ? x : n, rates[i],
		        i ? "/s" : " first attempt/s", x < n ? "" : " (max_attempts)");
	}
	fputc('\n', out);
}

/* SPEC §4: the bound per process, and what a fleet of N sidecars makes of it: with
 * budget.shared one bucket for all (its figures are the fleet's), else N floors. */
static void report_fleet(FILE *out, const struct cfg_retry *b)
{
	if (b->budget_shared_host)
		fprintf(out, "  fleet          one bucket in redis %s%s%s:%d/%d for every retrygate naming "
		        "it: retries <= %lld + %g x (the fleet's requests) + %g/s for the whole fleet "
		        "(+ one 100ms batch of credits per process); unshared each process would add "
		        "its own %lld + %g/s\n", strchr(b->budget_shared_host, ':') ? "[" : "",
		        b->budget_shared_host, strchr(b->budget_shared_host, ':') ? "]" : "",
		        b->budget_shared_port, b->budget_shared_db, (long long)b->budget_max_tokens,
		        b->budget_ratio, b->budget_min_per_second, (long long)b->budget_max_tokens,
		        b->budget_min_per_second);
	else
		fprintf(out, "  fleet          per process: N sidecars allow N x (%lld + %g/s) retries "
		        "on top of %g x requests (budget.shared makes it one bucket)\n",
		        (long long)b->budget_max_tokens, b->budget_min_per_second, b->budget_ratio);
}

/* The attempts and amplification lines of retry policy R; the budget is always the upstream's
 * (U's), shared by its routes. Returns the attempts per request. */
static int report_attempts(FILE *out, const struct cfg_upstream *u, const struct cfg_retry *r)
{
	const struct cfg_retry *b = &u->retry;
	bool retries = r->enabled && r->max_attempts > 1;
	int n = retries ? r->max_attempts : 1;

	if (!retries) {
		fprintf(out, "  attempts       1 per request (%s)\n",
		        r->enabled ? "max_attempts: 1" : "retries disabled");
		fprintf(out, "  amplification  none: 1.00x\n");
	} else {
		const char *sep = " ";
		fprintf(out, "  attempts       up to %d per request, on", n);
		for (int w = 0; cfg_retry_on_words[w]; w++)
			if (r->on_flags & (1u << w)) {
				fprintf(out, "%s%s", sep, cfg_retry_on_words[w]);
				sep = ", ";
			}
		for (int s = 400; s <= 599; s++)
			if (cfg_retry_on_status(r, s)) {
				fprintf(out, "%s%d", sep, s);
				sep = ", ";
			}
		for (int g = 0; g < GRPC_NCODES; g++)
			if (cfg_retry_on_grpc(r, g)) {
				fprintf(out, "%s%s", sep, grpc_status_name(g));
				sep = ", ";
			}
		if (!retry_on_any(r))
			fprintf(out, " nothing (retry.on is empty)");
		fprintf(out, "; POST/PATCH %s\n", r->non_idempotent == NI_ALWAYS ? "always re-sent" :
		        r->non_idempotent == NI_NEVER ? "only after connect-failure" :
		        "only with a key or after connect-failure");
		fprintf(out, "  amplification  retries <= %lld + %g x requests + %g/s: a burst of %lld "
		        "retries (max_tokens), never above %dx per request (max_attempts)%s\n",
		        (long long)b->budget_max_tokens, b->budget_ratio, b->budget_min_per_second,
		        (long long)b->budget_max_tokens, n, r == b ? "" :
		        "; the budget is the upstream's, shared with its other routes");
		report_sustained(out, b, n);
		report_fleet(out, b);
	}
	if (cfg_hedge_on(r)) {
		char a[96];
		if (r->hedge_pct)
			snprintf(a, sizeof a, "p%d of the first attempts' head latency (none below 100 "
			         "samples a minute)", r->hedge_pct);
		else
			dur(r->hedge_after_us, a);
		fprintf(out, "  hedging        up to %d hedge%s per request after %s; %s\n",
		        r->hedge_max_extra, r->hedge_max_extra == 1 ? "" : "s", a, retries ?
		        "each takes a budget token and a retries-in-flight slot and counts toward "
		        "max_attempts, so the worst case above is unchanged" :
		        "none are sent (retries are off)");
	}
	if (r->nidempotent_paths > 0) {
		fputs("  idempotent     any method under", out);
		for (int i = 0; i < r->nidempotent_paths; i++)
			fprintf(out, "%s%s", i ? ", " : " ", r->idempotent_paths[i]);
		fputs(" (retry.idempotent_paths)\n", out);
	}
	return n;
}

/* The latency and Retry-After lines of retry policy R under deadline D, N attempts */
static void report_latency(FILE *out, const struct cfg_retry *r, const struct cfg_deadline *d,
                           int n)
{
	int64_t backoffs = 0;
	char a[32], b[32], c[32];

	for (int i = 1; i < n; i++)
		backoffs += cfg_backoff_cap(r, i);
	if (n > 1)
		fprintf(out, "  latency        worst case %d x %s + %s backoff = %s; ", n,
		        dur(r->per_try_timeout_us, a), dur(backoffs, b),
		        dur(n * r->per_try_timeout_us + backoffs, c));
	else
		fprintf(out, "  latency        worst case %s; ", dur(r->per_try_timeout_us, a));
	/* the deadline is at most deadline.max: if that cuts, say so; else show both */
	if (report_deadline(out, r, d, n, "deadline.default", d->default_us, true))
		fprintf(out, "fits deadline.default %s and deadline.max %s",
		        dur(d->default_us, a), dur(d->max_us, b));
	else {
		fputs("; ", out);
		report_deadline(out, r, d, n, "deadline.max", d->max_us, false);
	}
	fputc('\n', out);
	if (n < 2)
		return;
	if (!r->retry_after_honor)
		fprintf(out, "  retry-after    ignored (honor: false): backoff applies, no holds\n");
	else {
		int64_t fit = d->default_us - d->min_us;
		fprintf(out, "  retry-after    hints up to %s are waited for", dur(r->retry_after_max_us, a));
		if (r->retry_after_max_us > fit)
			fprintf(out, "; without a deadline header only up to %s fit deadline.default",
			        dur(fit, b));
		if (r->retry_after_max_us > d->max_us - d->min_us)
			fprintf(out, "; more than deadline.max %s allows", dur(d->max_us, c));
		fputc('\n', out);
	}
}

static void report_upstream(FILE *out, const struct cfg_upstream *u)
{
	int n;

	fprintf(out, "upstream %s: %d endpoint%s (%s%s)%s\n", u->name, u->nendpoints,
	        u->nendpoints == 1 ? "" : "s", u->endpoints[0], u->nendpoints > 1 ? ", ..." : "",
	        !u->tls ? "" : u->tls_cert ? ", tls with a client certificate" : ", tls");
	n = report_attempts(out, u, &u->retry);
	fprintf(out, "  concurrency    %d attempts in flight, %d of them retries\n", u->max_in_flight,
	        u->max_retries_in_flight);
	report_health(out, u);
	report_latency(out, &u->retry, &u->deadline, n);
}

/* SPEC §2: a route with a retry or deadline of its own has a worst case of its own; its
 * concurrency and health are its upstream's, printed there. */
static void report_route(FILE *out, const struct cfg_route *r, int li, int ri)
{
	const char *own = r->has_retry && r->has_deadline ? "retry and deadline" :
	                  r->has_retry ? "retry" : "deadline";

	fprintf(out, "route listeners[%d].routes[%d] (host %s, path %s) -> %s: %s of its own\n", li,
	        ri, r->host ? r->host : "any", r->path_prefix, r->upstream->name, own);
	report_latency(out, r->retry, r->deadline, report_attempts(out, r->upstream, r->retry));
}

/* Does route pattern A (earlier) match every request that B (later) matches? */
static bool route_covers(const struct cfg_route *a, const struct cfg_route *b)
{
	if (strncmp(b->path_prefix, a->path_prefix, strlen(a->path_prefix)) != 0)
		return false;
	if (!a->host)
		return true;
	if (!b->host)
		return false;
	if (!strcmp(a->host, b->host))
		return true;
	if (!strncmp(a->host, "*.", 2)) {
		size_t la = strlen(a->host) - 1, lb = strlen(b->host);   /* ".suffix" */
		const char *bb = !strncmp(b->host, "*.", 2) ? b->host + 1 : b->host;
		lb = strlen(bb);
		return lb > la && !strcmp(bb + lb - la, a->host + 1);
	}
	return false;
}

/* SPEC §11: a gray test changes one condition at a time, and always has a way to stop. */
static void report_fault_warnings(FILE *out, const struct cfg_upstream *u)
{
	const struct cfg_faults *f = &u->faults;
	if (f->nrules == 0)
		return;
	if (f->nrules > 1)
		fprintf(out, "warning: upstreams.%s.faults.rules: %d rules change several conditions at "
		        "once; one rule per experiment tells which one the retries handled\n", u->name,
		        f->nrules);
	static const char *const what[] = { "after", "min_success_rate", "max_amplification" };
	const bool off[] = { f->stop_after_us == 0, f->stop_min_success_rate == 0,
	                     f->stop_max_amplification == 0 };
	for (int i = 0; i < 3; i++)
		if (off[i])
			fprintf(out, "warning: upstreams.%s.faults.stop.%s: 0 turns this stop condition off; "
			        "the experiment will not end by itself on it\n", u->name, what[i]);
}

/* Timing that cannot work, for an upstream or a route with a policy of its own (WHERE) */
static void warn_per_try(FILE *out, const char *where, const struct cfg_retry *r,
                         const struct cfg_deadline *d)
{
	char a[32], b[32];

	if (r->per_try_timeout_us > d->max_us)
		fprintf(out, "warning: %s.retry.per_try_timeout: %s is above deadline.max %s; the "
		        "deadline always cuts it\n", where, dur(r->per_try_timeout_us, a),
		        dur(d->max_us, b));
}

static void warn_fit(FILE *out, const char *where, const struct cfg_retry *r,
                     const struct cfg_deadline *d)
{
	char a[32], b[32];

	if (r->enabled && r->max_attempts > 1 &&
	    (int64_t)r->max_attempts * r->per_try_timeout_us > d->default_us)
		fprintf(out, "warning: %s.retry: max_attempts %d x per_try_timeout %s cannot fit "
		        "deadline.default %s\n", where, r->max_attempts, dur(r->per_try_timeout_us, a),
		        dur(d->default_us, b));
}

static void report_warnings(FILE *out, const struct config *c)
{
	char where[300];

	for (int i = 0; i < c->nwarnings; i++)
		fprintf(out, "warning: %s\n", c->warnings[i]);
	for (int i = 0; i < c->nlisteners; i++) {
		const struct cfg_listener *l = &c->listeners[i];
		for (int k = 1; k < l->nroutes; k++)
			for (int m = 0; m < k; m++)
				if (route_covers(&l->routes[m], &l->routes[k])) {
					fprintf(out, "warning: listeners[%d].routes[%d]: never used: routes[%d] "
					        "matches all its requests first\n", i, k, m);
					break;
				}
	}
	for (int i = 0; i < c->nupstreams; i++) {
		const struct cfg_upstream *u = &c->upstreams[i];
		const struct cfg_retry *r = &u->retry;
		bool used = false;
		const char *n = u->name;

		for (int l = 0; l < c->nlisteners && !used; l++)
			for (int k = 0; k < c->listeners[l].nroutes; k++)
				used = used || c->listeners[l].routes[k].upstream == u;
		if (!used)
			fprintf(out, "warning: upstreams.%s: no route uses it\n", n);
		snprintf(where, sizeof where, "upstreams.%s", n);
		warn_per_try(out, where, r, &u->deadline);
		report_fault_warnings(out, u);
		/* SPEC §6: only where the service guarantees it, UNAVAILABLE means "not executed" */
		if (u->idem.enabled && cfg_idem_release_on(&u->idem, 200, GRPC_UNAVAILABLE))
			fprintf(out, "warning: upstreams.%s.idempotency.release_on: unavailable releases "
			        "the key of a call the service may have run (grpcio answers UNAVAILABLE "
			        "for those too): a repeat runs it again; list it only if the service "
			        "guarantees UNAVAILABLE means not executed\n", n);
		if (!r->enabled || r->max_attempts < 2)
			continue;
		if (r->non_idempotent == NI_ALWAYS)
			fprintf(out, "warning: upstreams.%s.retry.non_idempotent: always re-sends POST and "
			        "PATCH without an Idempotency-Key; a retry after a reset or timeout can "
			        "repeat a side effect\n", n);
		/* every gRPC call is a POST: on an h2 upstream "always" replays all of them */
		if (r->non_idempotent == NI_ALWAYS && u->protocol == UP_H2)
			fprintf(out, "warning: upstreams.%s.retry.non_idempotent: %s:%d: always with protocol: "
			        "h2 re-sends every gRPC call (each is a POST) after a reset or timeout; list "
			        "read-only services in retry.idempotent_paths or send idempotency-key "
			        "metadata instead\n", n, c->path, r->non_idempotent_line);
		warn_fit(out, where, r, &u->deadline);
		if (r->budget_ratio > 0.5)
			fprintf(out, "warning: upstreams.%s.retry.budget.ratio: %g lets a failing dependency "
			        "see %.2fx its traffic (0.2 is usual)\n", n, r->budget_ratio,
			        1 + r->budget_ratio);
		if (r->budget_max_tokens > 1000)
			fprintf(out, "warning: upstreams.%s.retry.budget.max_tokens: %lld allows a burst of "
			        "that many retries before the ratio applies\n", n,
			        (long long)r->budget_max_tokens);
		/* shared, max_tokens and min_per_second are the fleet's: the defaults are a sidecar's */
		if (r->budget_shared_host && r->budget_max_tokens == 100 &&
		    r->budget_min_per_second == 10)
			fprintf(out, "warning: upstreams.%s.retry.budget.shared: max_tokens and "
			        "min_per_second are left at their defaults (100, 10/s), which are sized "
			        "for one sidecar; shared, they are the whole fleet's burst and floor\n", n);
		if (u->max_retries_in_flight == 0)
			fprintf(out, "warning: upstreams.%s.concurrency.max_retries_in_flight: 0 refuses "
			        "every retry\n", n);
		for (int s = 400; s <= 499; s++)
			if (cfg_retry_on_status(r, s) && s != 408 && s != 425 && s != 429)
				fprintf(out, "warning: upstreams.%s.retry.on: %d is a client error that a "
				        "retry will not heal; retrying it wastes capacity (4xx worth retrying: "
				        "408, 425, 429)\n", n, s);
	}
	for (int i = 0; i < c->nlisteners; i++)
		for (int k = 0; k < c->listeners[i].nroutes; k++) {
			const struct cfg_route *r = &c->listeners[i].routes[k];
			if (!r->has_retry && !r->has_deadline)
				continue;
			snprintf(where, sizeof where, "listeners[%d].routes[%d]", i, k);
			warn_per_try(out, where, r->retry, r->deadline);
			warn_fit(out, where, r->retry, r->deadline);
		}
}

void config_report(const struct config *c, FILE *out)
{
	char a[32];

	fprintf(out, "%s: %d listener%s, %d upstream%s, %d worker%s, drain_timeout %s\n", c->path,
	        c->nlisteners, c->nlisteners == 1 ? "" : "s", c->nupstreams,
	        c->nupstreams == 1 ? "" : "s", c->workers, c->workers == 1 ? "" : "s",
	        dur(c->drain_timeout_us, a));
	for (int i = 0; i < c->nlisteners; i++) {
		const struct cfg_listener *l = &c->listeners[i];
		const char *tls = !l->tls ? "" : !l->tls_client_ca ? " (tls)" :
		                  l->tls_require_client_cert ? " (tls, client certificates required)" :
		                  " (tls, client certificates verified when offered)";
		if (strcmp(l->name, l->listen))
			fprintf(out, "listener %s on %s%s\n", l->name, l->listen, tls);
		else
			fprintf(out, "listener %s%s\n", l->listen, tls);
		for (int k = 0; k < l->nroutes; k++)
			fprintf(out, "  route          host %s, path %s -> %s\n",
			        l->routes[k].host ? l->routes[k].host : "any", l->routes[k].path_prefix,
			        l->routes[k].upstream_name);
	}
	for (int i = 0; i < c->nupstreams; i++) {
		report_upstream(out, &c->upstreams[i]);
		for (int l = 0; l < c->nlisteners; l++)
			for (int k = 0; k < c->listeners[l].nroutes; k++) {
				const struct cfg_route *r = &c->listeners[l].routes[k];
				if (r->upstream == &c->upstreams[i] && (r->has_retry || r->has_deadline))
					report_route(out, r, l, k);
			}
	}
	report_warnings(out, c);
	fprintf(out, "%s: ok\n", c->path);
}
