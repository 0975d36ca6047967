/*
 * main: command line, startup, signals (SIGHUP reload, SIGTERM/SIGINT drain, SIGUSR1 reopen
 * the access log), and shutdown. The main thread runs the admin listener, the signal events
 * and the trim timer (memory back to the system after a burst of connections); workers run
 * the proxy. From teardown on, signals are ignored: the process is already stopping.
 */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "obs/accesslog.h"
#include "app/admin.h"
#include "base/clock.h"
#include "config/config.h"
#include "state/faults_watch.h"
#include "app/health_cli.h"
#include "idempotency/idempotency.h"
#include "net/listener.h"
#include "base/log.h"
#include "base/loop.h"
#include "state/probe.h"
#include "state/resolve.h"
#include "upstream/pool.h"
#include "obs/reconcile.h"
#include "obs/reconcile_publish.h"
#include "obs/stats.h"
#include "state/runtime.h"
#include "state/upstream.h"
#include "base/util.h"
#include "app/watch.h"
#include "app/worker.h"

static struct event_base *main_base;
static const char *config_path = "conf/retrygate.yaml";
static struct worker workers[MAX_WORKERS];
static _Atomic int workers_running;
static struct event *workers_done_ev, *drain_timer, *flush_timer, *trim_timer;

#define TRIM_PERIOD_US 1000000

static void usage(FILE *f)
{
	fprintf(f, "usage: retrygate [-c FILE] [--watch] [--check] [--version] [--health URL]\n"
	           "  -c FILE       config file (default conf/retrygate.yaml)\n"
	           "  --watch       also reload when FILE changes (an editor's save, or the symlink\n"
	           "                swap of a Kubernetes ConfigMap volume)\n"
	           "  --check       validate FILE, print the worst case each upstream allows, exit\n"
	           "  --version     print the version and exit\n"
	           "  --health URL  GET URL (http:// or https://, e.g. http://127.0.0.1:9901/ready):\n"
	           "                exit 0 on 2xx, else 1; https verifies no certificate\n"
	           "  -h, --help    this text\n"
	           "\n"
	           "signals:\n"
	           "  SIGHUP          reload FILE; on an error the old config keeps serving\n"
	           "  SIGTERM, SIGINT close the listeners, /ready answers 503, drain up to\n"
	           "                  drain_timeout, exit 0\n"
	           "  SIGUSR1         reopen the access log (after logrotate has moved it)\n"
	           "\n"
	           "environment:\n"
	           "  RETRYGATE_LOG=debug  add per-attempt debug lines to the stderr log\n"
	           "                       (unset or any other value: info and above)\n");
}

/* A command-line mistake: "retrygate: WHAT ARG", then the usage; exit status 2. */
static int usage_error(const char *what, const char *arg)
{
	fprintf(stderr, "retrygate: %s %s\n", what, arg);
	usage(stderr);
	return 2;
}

static void worker_exited(struct worker *w)
{
	if (atomic_fetch_sub(&workers_running, 1) == 1)
		event_active(workers_done_ev, EV_TIMEOUT, 0);
}

static void workers_done_cb(evutil_socket_t fd, short what, void *arg)
{
	event_base_loopexit(main_base, NULL);
}

static void drain_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
	log_warn("drain timeout: closing the remaining connections");
	for (int i = 0; i < g_nworkers; i++)
		worker_stop(&workers[i]);
}

static void on_term(evutil_socket_t sig, short what, void *arg)
{
	if (atomic_load(&g_draining))
		return;
	struct runtime *rt = runtime_current();
	int64_t drain = rt->cfg->drain_timeout_us;
	runtime_unref(rt);
	log_info("signal %d: draining (up to %lld ms)", (int)sig, (long long)(drain / 1000));
	atomic_store(&g_draining, true);
	admin_set_state(ADMIN_DRAINING);
	for (int i = 0; i < g_nworkers; i++)
		worker_notify(&workers[i]);
	struct timeval tv = clock_tv(drain);
	evtimer_add(drain_timer, &tv);
}

static void reload_failed(struct config *cfg)
{
	stats_config_reload_failed();
	config_unref(cfg);
}

/* One socket per worker for listener L into FDS[g_nworkers]; 0, or -1 with *ERR set and
 * nothing left open. */
static int bind_listener(const struct cfg_listener *l, int *fds, const char **err)
{
	for (int w = 0; w < g_nworkers; w++) {
		fds[w] = listener_bind(l->listen, err);
		if (fds[w] < 0) {
			while (w-- > 0)
				close(fds[w]);
			return -1;
		}
	}
	return 0;
}

/* Whether OLD has listener L at the same address: its sockets stay. */
static bool listener_kept(const struct config *old, const struct cfg_listener *l)
{
	const struct cfg_listener *was = config_listener(old, l->name);
	return was && strcmp(was->listen, l->listen) == 0;
}

/* The sockets a reload opens, bound before anything is switched so that a bind error fails
 * the reload with the old config still serving: FDS[i * g_nworkers + w] for CFG's listener i
 * when it is new or moved, else -1. NULL after logging why. */
static int *reload_bind(const struct config *old, const struct config *cfg)
{
	int *fds = xcalloc((size_t)cfg->nlisteners * (size_t)g_nworkers, sizeof(int));
	for (int i = 0; i < cfg->nlisteners; i++) {
		int *f = fds + (size_t)i * (size_t)g_nworkers;
		const char *err = NULL;
		for (int w = 0; w < g_nworkers; w++)
			f[w] = -1;
		if (listener_kept(old, &cfg->listeners[i]))
			continue;
		if (bind_listener(&cfg->listeners[i], f, &err) == 0)
			continue;
		log_error("reload of %s failed; the old config keeps serving: listener %s: cannot "
		          "listen on %s: %s", config_path, cfg->listeners[i].name,
		          cfg->listeners[i].listen, err);
		for (int k = 0; k < i * g_nworkers; k++)
			if (fds[k] >= 0)
				close(fds[k]);
		free(fds);
		return NULL;
	}
	return fds;
}

static void reload_unbind(const struct config *cfg, int *fds)
{
	for (int k = 0; k < cfg->nlisteners * g_nworkers; k++)
		if (fds[k] >= 0)
			close(fds[k]);
	free(fds);
}

/* The new config is published: the workers take the new sockets (and close the listeners it
 * no longer has, or has elsewhere, when notified). */
static void reload_listeners(const struct config *old, const struct config *cfg, int *fds)
{
	for (int i = 0; i < cfg->nlisteners; i++) {
		const struct cfg_listener *l = &cfg->listeners[i];
		if (fds[(size_t)i * (size_t)g_nworkers] < 0)
			continue;
		for (int w = 0; w < g_nworkers; w++)
			worker_add_listener(&workers[w], l->name, l->listen, fds[(size_t)i * (size_t)g_nworkers + (size_t)w]);
		const struct cfg_listener *was = config_listener(old, l->name);
		if (was)
			log_info("reload: listener %s moved from %s to %s", l->name, was->listen, l->listen);
		else
			log_info("reload: listening on %s (%s)", l->listen, l->name);
	}
	free(fds);
	for (int j = 0; j < old->nlisteners; j++)
		if (!config_listener(cfg, old->listeners[j].name))
			log_info("reload: listener %s (%s) removed: its socket closes, its connections "
			         "close after their current request", old->listeners[j].name,
			         old->listeners[j].listen);
}

/* What a reload keeps from start: the worker count (the live value stays in the config that
 * /config shows; the file's is returned, for the warning once the reload succeeded), and the
 * fault switches, which only POST /faults and the stop conditions move once running. */
static int reload_keep(struct config *cfg)
{
	int file = cfg->workers;
	cfg->workers = g_nworkers;
	return file;
}

static void log_faults_differ(const struct config *old, struct runtime *rt)
{
	struct strbuf b = { 0 };
	for (int i = 0; i < rt->cfg->nupstreams; i++) {
		const struct cfg_upstream *u = &rt->cfg->upstreams[i];
		if (!config_upstream(old, u->name))
			continue;       /* a new name starts with its file's switch */
		bool file = u->faults.enabled && u->faults.nrules > 0;
		bool live = atomic_load(&rt->ups[i].st->faults_on);
		if (file != live)
			sb_printf(&b, "%s%s (file %s, live %s)", b.s ? ", " : "", u->name,
			          file ? "on" : "off", live ? "on" : "off");
	}
	if (b.s)
		log_warn("reload: faults.enabled applies at start only; the runtime switch is kept "
		         "(POST /faults moves it): %s", b.s);
	free(b.s);
}

static void on_hup(evutil_socket_t sig, short what, void *arg)
{
	char *errs = NULL;
	size_t errlen = 0;
	FILE *ef = open_memstream(&errs, &errlen);
	struct config *cfg = config_load(config_path, ef);
	fclose(ef);
	if (!cfg) {
		/* one log line per event: each error ("FILE:LINE:COL: message") on its own line */
		for (char *ln = errs, *nl; ln && *ln; ln = nl ? nl + 1 : NULL) {
			nl = strchr(ln, '\n');
			if (nl)
				*nl = 0;
			if (*ln)
				log_error("reload: %s", ln);
		}
		log_error("reload of %s failed; the old config keeps serving", config_path);
		stats_config_reload_failed();
		free(errs);
		return;
	}
	free(errs);
	int file_workers = reload_keep(cfg);
	/* everything that can fail comes before anything is switched: a failed reload leaves
	 * the old config serving, its access log and its sockets included */
	char terr[512];
	struct runtime *nrt = runtime_new(cfg, terr, sizeof(terr));
	if (!nrt) {
		log_error("reload of %s failed; the old config keeps serving: %s", config_path, terr);
		reload_failed(cfg);
		return;
	}
	struct runtime *old = runtime_current();
	int *fds = reload_bind(old->cfg, cfg);
	int admin_fd = -1;
	if (!fds)
		goto fail;
	if (admin_bind_moved(old->cfg, cfg, &admin_fd) != 0) {
		reload_unbind(cfg, fds);
		goto fail;
	}
	if (strcmp(cfg->access_log, old->cfg->access_log) != 0 &&
	    accesslog_switch(cfg->access_log) != 0) {
		log_error("reload of %s failed; the old config keeps serving: cannot open access "
		          "log %s: %s", config_path, cfg->access_log, strerror(errno));
		reload_unbind(cfg, fds);
		if (admin_fd >= 0)
			close(admin_fd);
		goto fail;
	}
	runtime_publish(nrt);
	if (file_workers != g_nworkers)
		log_warn("reload: workers changed to %d; takes effect at restart (keeps %d)",
		         file_workers, g_nworkers);
	log_faults_differ(old->cfg, nrt);
	reload_listeners(old->cfg, cfg, fds);
	admin_move(old->cfg, cfg, admin_fd);
	runtime_unref(old);
	resolve_reconfigure(cfg);
	admin_reconfigure(cfg);
	log_json = cfg->log_format == LF_JSON;
	reconcile_set_keep(cfg->reconcile.keep);
	reconcile_publish_configure(main_base, &cfg->reconcile);
	config_unref(cfg);
	stats_config_loaded(true);
	/* workers take the new sockets and close the listeners the config no longer has */
	for (int i = 0; i < g_nworkers; i++)
		worker_notify(&workers[i]);
	log_info("reloaded %s", config_path);
	return;
fail:
	runtime_unref(old);
	runtime_unref(nrt);
	reload_failed(cfg);
}

/* --watch: the file changed; a reload as SIGHUP does it */
static void on_file_change(void *arg)
{
	on_hup(SIGHUP, 0, NULL);
}

static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
	accesslog_flush();
}

/* glibc keeps freed memory in its arenas (one per worker thread): after a burst of
 * connections the heap in use is small and the RSS is not. Once a second, when the open
 * connections have fallen to half the most seen since the last trim, hand the free pages
 * back; again once the loops have freed what the burst left in their free lists (two of their
 * scavenging ticks), and once more when the upstream connections the burst left idle in the
 * pools have timed out. Trimming walks the free lists, so it runs only after such a fall, not
 * every tick. */
#define TRIM_AFTER_LISTS (2 * LOOP_SCAVENGE_US / TRIM_PERIOD_US + 1)
#define TRIM_AFTER_POOLS (POOL_CLOSE_MAX_US / TRIM_PERIOD_US + 2)
static void trim_cb(evutil_socket_t fd, short what, void *arg)
{
	static int64_t peak, since = -1;        /* ticks since the last fall; -1: none pending */
	int64_t now = 0;
	for (int i = 0; i < g_nworkers; i++)
		now += atomic_load(&g_gstats[i].conns_active);
	if (now > peak) {
		peak = now;
	} else if (now < peak / 2 || (now == 0 && peak > 0)) {
		malloc_trim(0);
		peak = now;
		since = 0;
	} else if (since >= 0) {
		since++;
		if (since == TRIM_AFTER_LISTS || since == TRIM_AFTER_POOLS)
			malloc_trim(0);
		if (since == TRIM_AFTER_POOLS)
			since = -1;
	}
}

/* From here on a signal finds the process stopping: SIGTERM again, or a SIGHUP, must not
 * kill it (freeing a signal event restores the default disposition, which terminates). Only
 * the main thread is left, so blocking the signals in it holds any that arrive while the
 * events are freed; SIG_IGN then discards them. */
static void signals_ignore(struct event **evs, int n)
{
	static const int sigs[] = { SIGTERM, SIGINT, SIGHUP, SIGUSR1 };
	sigset_t set;
	sigemptyset(&set);
	for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
		sigaddset(&set, sigs[i]);
	sigprocmask(SIG_BLOCK, &set, NULL);
	for (int i = 0; i < n; i++)
		event_free(evs[i]);
	for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
		signal(sigs[i], SIG_IGN);
	sigprocmask(SIG_UNBLOCK, &set, NULL);
}

static void on_usr1(evutil_socket_t sig, short what, void *arg)
{
	accesslog_reopen();
	log_info("access log reopened");
}

int main(int argc, char **argv)
{
	loop_global_init();
	bool check = false, watch = false;
	for (int i = 1; i < argc; i++) {
		bool has_value = i + 1 < argc;
		if (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--health") == 0) {
			if (!has_value)
				return usage_error("a value is missing after", argv[i]);
			if (argv[i][1] == 'c')
				config_path = argv[++i];
			else
				return health_check(argv[i + 1]);
		} else if (strcmp(argv[i], "--check") == 0) {
			check = true;
		} else if (strcmp(argv[i], "--watch") == 0) {
			watch = true;
		} else if (strcmp(argv[i], "--version") == 0) {
			printf("retrygate %s\n", RETRYGATE_VERSION);
			return 0;
		} else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			usage(stdout);
			return 0;
		} else {
			return usage_error(argv[i][0] == '-' ? "unknown option" : "unexpected argument",
			                   argv[i]);
		}
	}

	struct config *cfg = (check ? config_load_check : config_load)(config_path, stderr);
	if (!cfg)
		return 1;
	if (check) {
		config_report(cfg, stdout);
		config_unref(cfg);
		return 0;
	}

	log_json = cfg->log_format == LF_JSON;
	for (int i = 0; i < cfg->nwarnings; i++)
		log_warn("%s: %s", config_path, cfg->warnings[i]);
	signal(SIGPIPE, SIG_IGN);
	const char *lvl = getenv("RETRYGATE_LOG");
	if (lvl && strcmp(lvl, "debug") == 0)
		log_min_level = LOG_DEBUG;
	evthread_use_pthreads();
	g_nworkers = cfg->workers;     /* 1..CFG_MAX_WORKERS: the schema rejects more */
	main_base = event_base_new();
	char terr[512];
	struct runtime *rt0 = runtime_new(cfg, terr, sizeof(terr));
	if (!rt0) {
		fprintf(stderr, "%s: %s\n", config_path, terr);
		return 1;
	}
	runtime_publish(rt0);
	stats_config_loaded(false);

	if (accesslog_open(cfg->access_log) != 0) {
		fprintf(stderr, "%s: cannot open access log %s: %s\n", config_path, cfg->access_log,
		        strerror(errno));
		return 1;
	}

	/* bind everything before serving anything: a bind error is a startup error */
	for (int w = 0; w < g_nworkers; w++)
		worker_init(&workers[w], w, worker_exited);
	for (int i = 0; i < cfg->nlisteners; i++) {
		const struct cfg_listener *l = &cfg->listeners[i];
		const char *err = NULL;
		int fds[MAX_WORKERS];
		if (bind_listener(l, fds, &err) != 0) {
			fprintf(stderr, "%s: listener %s: cannot listen on %s: %s\n", config_path,
			        l->name, l->listen, err);
			return 1;
		}
		for (int w = 0; w < g_nworkers; w++)
			worker_add_listener(&workers[w], l->name, l->listen, fds[w]);
	}
	if (admin_start(main_base, cfg) != 0)
		return 1;
	reconcile_set_keep(cfg->reconcile.keep);
	reconcile_publish_configure(main_base, &cfg->reconcile);
	faults_watch_start(main_base);
	/* endpoint names get their addresses before traffic (a bounded wait), probes begin */
	if (resolve_start(main_base, cfg) != 0 || probe_start(main_base) != 0) {
		fprintf(stderr, "retrygate: cannot start the resolver\n");
		return 1;
	}
	resolve_settle(main_base, 3 * 1000000LL);

	struct event *sigs[] = {
		evsignal_new(main_base, SIGTERM, on_term, NULL),
		evsignal_new(main_base, SIGINT, on_term, NULL),
		evsignal_new(main_base, SIGHUP, on_hup, NULL),
		evsignal_new(main_base, SIGUSR1, on_usr1, NULL),
	};
	int nsigs = (int)(sizeof sigs / sizeof sigs[0]);
	for (int i = 0; i < nsigs; i++)
		evsignal_add(sigs[i], NULL);
	struct watch *watcher = NULL;
	if (watch && !(watcher = watch_start(main_base, config_path, on_file_change, NULL))) {
		fprintf(stderr, "%s: --watch: cannot watch its directory: %s\n", config_path,
		        strerror(errno));
		return 1;
	}
	workers_done_ev = event_new(main_base, -1, 0, workers_done_cb, NULL);
	drain_timer = evtimer_new(main_base, drain_timeout_cb, NULL);
	flush_timer = event_new(main_base, -1, EV_PERSIST, flush_cb, NULL);
	struct timeval flush_tv = { 0, 200 * 1000 };
	evtimer_add(flush_timer, &flush_tv);
	trim_timer = event_new(main_base, -1, EV_PERSIST, trim_cb, NULL);
	struct timeval trim_tv = clock_tv(TRIM_PERIOD_US);
	evtimer_add(trim_timer, &trim_tv);

	atomic_store(&workers_running, g_nworkers);
	for (int w = 0; w < g_nworkers; w++) {
		if (worker_start(&workers[w]) != 0) {
			fprintf(stderr, "retrygate: cannot start worker %d\n", w);
			return 1;
		}
	}
	for (int i = 0; i < cfg->nlisteners; i++)
		log_info("listening on %s (%s), %d worker%s", cfg->listeners[i].listen,
		         cfg->listeners[i].name, g_nworkers, g_nworkers > 1 ? "s" : "");
	config_unref(cfg);
	admin_set_state(ADMIN_READY);

	event_base_dispatch(main_base);

	for (int w = 0; w < g_nworkers; w++)
		worker_join(&workers[w]);
	watch_stop(watcher);
	admin_stop();
	faults_watch_stop();
	reconcile_publish_stop();
	reconcile_clear();
	probe_stop();
	resolve_stop();
	idem_store_release_all();
	signals_ignore(sigs, nsigs);
	event_free(workers_done_ev);
	event_free(drain_timer);
	event_free(flush_timer);
	event_free(trim_timer);
	event_base_free(main_base);
	struct runtime *rt = runtime_current();
	runtime_unref(rt);
	runtime_publish_none();
	upstream_states_free();
	accesslog_close();
	log_info("stopped");
	return 0;
}
