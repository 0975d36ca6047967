/*
 * upstream: the registry of shared per-upstream state (see upstream.h).
 *
 * The registry is only changed under reg_lock: at startup and reload (runtime_new, main
 * thread) and when a runtime is freed (any thread, once its last request ended) — never on the
 * request path. Reference counts of states count the runtimes binding them and are only
 * touched under reg_lock; a state whose count drops to 0 is unlinked and freed at once.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/util.h"
#include "state/upstream.h"

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct upstream_state *reg_head;     /* first configured first */
static struct upstream_state **reg_by_id;   /* [reg_cap]; NULL: a free id */
static int reg_cap;
static _Atomic uint64_t forget_epoch;

void upstream_lock(void)
{
	pthread_mutex_lock(&reg_lock);
}

void upstream_unlock(void)
{
	pthread_mutex_unlock(&reg_lock);
}

static struct upstream_state *state_find(const char *name)
{
	for (struct upstream_state *s = reg_head; s; s = s->next)
		if (strcmp(s->name, name) == 0)
			return s;
	return NULL;
}

static struct upstream_state *state_by_id(int id)
{
	return id >= 0 && id < reg_cap ? reg_by_id[id] : NULL;
}

void upstream_faults_switch(struct upstream_state *st, bool on, int stopped)
{
	atomic_store(&st->faults_stopped, on ? 0 : stopped);
	atomic_store(&st->faults_since_us, on ? clock_now_us() : 0);
	atomic_store(&st->faults_since_wall, on ? (int64_t)clock_wall() : 0);
	atomic_store(&st->faults_on, on);
}

struct upstream_state *upstream_state_bind(const struct cfg_upstream *u)
{
	struct upstream_state *st = state_find(u->name);
	if (st) {
		st->refs++;
		return st;
	}
	st = xcalloc(1, sizeof(*st));
	st->name = xstrdup(u->name);
	st->refs = 1;
	ep_table_init(&st->slots, st);
	budget_init(&st->budget, &u->retry, clock_now_us());
	budget_fleet_init(&st->fleet);
	latency_hist_init(&st->head_lat);
	atomic_store(&st->runtime_enabled, true);
	/* faults.enabled applies when the name first appears; a reload keeps the switch */
	upstream_faults_switch(st, u->faults.enabled && u->faults.nrules > 0, 0);
	st->stats = aligned_alloc(64, sizeof(struct ustats) * (size_t)g_nworkers);
	if (!st->stats)
		abort();
	memset(st->stats, 0, sizeof(struct ustats) * (size_t)g_nworkers);
	int id = 0;
	while (id < reg_cap && reg_by_id[id])
		id++;
	if (id == reg_cap) {
		reg_by_id = xrealloc(reg_by_id, sizeof(*reg_by_id) * (size_t)(reg_cap + 8));
		memset(reg_by_id + reg_cap, 0, sizeof(*reg_by_id) * 8);
		reg_cap += 8;
	}
	st->id = id;
	reg_by_id[id] = st;
	/* append, so /metrics lists upstreams in the order they were first configured */
	struct upstream_state **pp = &reg_head;
	while (*pp)
		pp = &(*pp)->next;
	*pp = st;
	return st;
}

static void state_free(struct upstream_state *st)
{
	ep_table_free(&st->slots);
	free(st->stats);
	free(st->name);
	free(st);
}

void upstream_state_unbind(struct upstream_state *st)
{
	if (--st->refs > 0)
		return;
	struct upstream_state **pp = &reg_head;
	while (*pp != st)
		pp = &(*pp)->next;
	*pp = st->next;
	reg_by_id[st->id] = NULL;
	atomic_fetch_add(&forget_epoch, 1);
	state_free(st);
}

void upstream_states_walk(upstream_state_fn fn, void *arg)
{
	pthread_mutex_lock(&reg_lock);
	for (struct upstream_state *st = reg_head; st; st = st->next)
		fn(arg, st);
	pthread_mutex_unlock(&reg_lock);
}

void upstream_states_free(void)
{
	pthread_mutex_lock(&reg_lock);
	while (reg_head) {
		struct upstream_state *st = reg_head;
		reg_head = st->next;
		state_free(st);
	}
	free(reg_by_id);
	reg_by_id = NULL;
	reg_cap = 0;
	pthread_mutex_unlock(&reg_lock);
}

uint64_t upstream_forget_epoch(void)
{
	return atomic_load_explicit(&forget_epoch, memory_order_acquire);
}

bool upstream_ep_live(int up_id, int index, uint64_t serial)
{
	pthread_mutex_lock(&reg_lock);
	bool live = upstream_ep_find(up_id, index, serial) != NULL;
	pthread_mutex_unlock(&reg_lock);
	return live;
}

struct ep_state *upstream_ep_find(int up_id, int index, uint64_t serial)
{
	struct upstream_state *st = state_by_id(up_id);
	return st ? ep_table_find(&st->slots, index, serial) : NULL;
}

void upstream_names_walk(upstream_name_fn fn, void *arg)
{
	pthread_mutex_lock(&reg_lock);
	for (struct upstream_state *st = reg_head; st; st = st->next)
		for (int i = 0; i < MAX_ENDPOINTS; i++)
			if (st->slots.names[i] && !st->slots.names[i]->literal)
				fn(arg, st->slots.names[i], st->id);
	pthread_mutex_unlock(&reg_lock);
}

struct ep_name *upstream_name_find(int up_id, uint64_t serial)
{
	struct upstream_state *st = state_by_id(up_id);
	for (int i = 0; st && i < MAX_ENDPOINTS; i++)
		if (st->slots.names[i] && st->slots.names[i]->serial == serial)
			return st->slots.names[i];
	return NULL;
}

void upstream_sweep(int64_t now_us)
{
	bool forgot = false;
	pthread_mutex_lock(&reg_lock);
	for (struct upstream_state *st = reg_head; st; st = st->next)
		forgot |= ep_table_sweep(&st->slots, now_us);
	if (forgot)
		atomic_fetch_add(&forget_epoch, 1);
	pthread_mutex_unlock(&reg_lock);
}
