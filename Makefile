# retrygate — build, dependencies, tests.
#
#   make deps        install what is missing (Debian packages; llhttp 9.2 from Debian 13 on 12)
#   make deps-build  the same for compiling only (no test tools): the image's build stage
#   make             build/retrygate
#   make strip       build/stripped/retrygate, without symbols (the image's binary)
#   make test        include-loop check + unit + integration tests (SANITIZE=address,undefined:
#                    the ASan/UBSan build, which also checks every callback's object magic)
#   make run         start the bundled demo upstream and retrygate on conf/retrygate.yaml
#   make tsan        the ThreadSanitizer build on the tests where threads meet
#   make fuzz        libFuzzer targets, bounded time  (FUZZ_SECONDS=60)
#   make bench       retrygate vs nginx vs HAProxy, ratios

VERSION   := 0.1.0
CC        ?= cc
SANITIZE  ?=
WERROR    ?= -Werror
ARCH      := $(shell dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)

ifeq ($(SANITIZE),)
BUILD     ?= build
OPT       := -O2
else ifeq ($(SANITIZE),thread)
BUILD     ?= build/tsan
OPT       := -O1 -fsanitize=thread -fno-omit-frame-pointer -DRG_CHECK_MAGIC
else
BUILD     ?= build/san
OPT       := -O1 -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all -DRG_CHECK_MAGIC
endif

# llhttp: the system's when Debian ships it (13+), else Debian 13's package unpacked under build/deps.
DEPS_DIR  := build/deps
ifneq ($(wildcard /usr/include/llhttp.h),)
LLHTTP_INC :=
LLHTTP_LIB := /usr/lib/$(ARCH)/libllhttp.a
else
LLHTTP_INC := -I$(DEPS_DIR)/usr/include
LLHTTP_LIB := $(DEPS_DIR)/usr/lib/$(ARCH)/libllhttp.a
endif

WARN      := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 \
             -Wno-unused-parameter $(WERROR)
CFLAGS    ?= -g
CFLAGS    += -std=c11 -D_GNU_SOURCE -pthread $(OPT) $(WARN) $(LLHTTP_INC) -DRETRYGATE_VERSION='"$(VERSION)"'
LDLIBS    := $(LLHTTP_LIB) -levent_openssl -levent_pthreads -levent -lnghttp2 -lyaml -lhiredis -lssl -lcrypto -lm -pthread
LDFLAGS   += $(filter -fsanitize=%,$(OPT))

SRCS      := $(wildcard src/*/*.c)
HDRS      := $(wildcard src/*/*.h)
OBJS      := $(SRCS:src/%.c=$(BUILD)/obj/%.o)
LIBOBJS   := $(filter-out $(BUILD)/obj/app/main.o,$(OBJS))

UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/unit/%)

PYTEST    ?= /usr/bin/python3 -m pytest
PYTEST_ARGS ?= -q

.PHONY: all deps deps-build strip test structure unit integration tsan run clean fuzz bench demo
.SECONDARY:

all: $(BUILD)/retrygate

$(BUILD)/retrygate: $(OBJS) | $(LLHTTP_LIB)
	$(CC) $(LDFLAGS) -o $@ $(OBJS) $(LDLIBS)

strip: $(BUILD)/stripped/retrygate

$(BUILD)/stripped/retrygate: $(BUILD)/retrygate
	@mkdir -p $(dir $@)
	strip --strip-unneeded -o $@ $<

$(BUILD)/obj/%.o: src/%.c $(HDRS) | $(LLHTTP_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -c -o $@ $<

$(BUILD)/unit/%: tests/unit/%.c $(LIBOBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc $(LDFLAGS) -o $@ $< $(LIBOBJS) $(LDLIBS) -lcmocka

# ---------------------------------------------------------------- dependencies
# deps-build: what compiling the binary needs (the container's build stage); deps adds the
# test, fuzz and bench tools (~1.6 GB more).
APT_BUILD_PKGS := build-essential pkg-config libevent-dev libyaml-dev libssl-dev libhiredis-dev libnghttp2-dev
APT_PKGS := $(APT_BUILD_PKGS) libcmocka-dev python3 python3-pytest curl redis-server wrk prometheus clang \
            python3-h2 python3-grpcio python3-yaml nghttp2-client nodejs
# Node's gRPC client for the tests (tests/tools/grpc_node_client.js), from npm, pinned
GRPC_JS_VERSION := 1.14.7
NODE_DIR := $(DEPS_DIR)/node
GRPC_JS_STAMP := $(NODE_DIR)/.grpc-js-$(GRPC_JS_VERSION)
# $(call apt_missing,PACKAGES,APT OPTIONS): install those not installed (as root), else say how
apt_missing = missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "deps: installing$$missing"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(2) $$missing || exit 1; \
	  else \
	    echo "deps: missing packages; run:  sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi
deps:
	@$(call apt_missing,$(APT_PKGS))
	@$(MAKE) --no-print-directory $(LLHTTP_LIB) $(GRPC_JS_STAMP)

deps-build:
	@$(call apt_missing,$(APT_BUILD_PKGS),--no-install-recommends)
	@$(MAKE) --no-print-directory $(LLHTTP_LIB)

# Debian 12 has no libllhttp-dev 9.x: fetch Debian 13's two packages with a private apt
# state under build/ (the system's apt config is untouched) and unpack them.
$(DEPS_DIR)/usr/lib/$(ARCH)/libllhttp.a:
	@set -e; d=$$(pwd)/build/apt; mkdir -p $$d/lists/partial $$d/cache/archives/partial $(DEPS_DIR); \
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" > $$d/sources.list; \
	o="-o Dir::Etc::SourceList=$$d/sources.list -o Dir::Etc::SourceParts=/nonexistent -o Dir::State::Lists=$$d/lists -o Dir::Cache=$$d/cache -o Debug::NoLocking=1 -o APT::Sandbox::User=root"; \
	echo "deps: fetching libllhttp-dev 9.2 from Debian 13 into $(DEPS_DIR)"; \
	apt-get $$o -q update >/dev/null; \
	(cd $$d && apt-get $$o -q download libllhttp-dev libllhttp9.2 >/dev/null); \
	for f in $$d/libllhttp*.deb; do dpkg-deb -x $$f $(DEPS_DIR); done; \
	test -f $@

# @grpc/grpc-js into build/deps/node/node_modules (a Debian nodejs without npm gets Debian's)
$(GRPC_JS_STAMP):
	@set -e; command -v npm >/dev/null || { $(call apt_missing,npm); }; \
	echo "deps: npm install @grpc/grpc-js@$(GRPC_JS_VERSION) into $(NODE_DIR)"; \
	mkdir -p $(NODE_DIR); \
	npm install --prefix $(NODE_DIR) --save-exact --no-audit --no-fund --loglevel=error \
	  @grpc/grpc-js@$(GRPC_JS_VERSION) >/dev/null; \
	rm -f $(NODE_DIR)/.grpc-js-*; touch $@

# ---------------------------------------------------------------- tests
test: deps
	@$(MAKE) --no-print-directory structure unit integration

# DESIGN rule 7: no two files of src/ include each other, directly or through a loop
structure:
	/usr/bin/python3 tests/tools/check-includes.py src

unit: $(UNIT_BINS)
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; $$t; done

integration: $(BUILD)/retrygate
	RETRYGATE_BIN=$(abspath $(BUILD)/retrygate) $(PYTEST) $(PYTEST_ARGS) tests/integration

# ThreadSanitizer on the tests where threads meet: several workers, reloads under load, the
# shared budget and idempotency table, Redis, the access log and the reconciliation queue.
# (The whole suite under TSan takes over an hour on two cores; these cover every shared
# structure.) The harness fails a test on any "WARNING: ThreadSanitizer" line.
TSAN_TESTS := test_operations.py test_operator.py test_access_log.py test_reload_registry.py \
              test_reconcile.py test_budget_amplification.py test_idempotency.py \
              test_reload_applies.py test_watch.py test_outage_logs.py test_fleet_budget.py \
              test_tls_errors.py test_hedging.py
tsan:
	@$(MAKE) --no-print-directory SANITIZE=thread build/tsan/retrygate
	cd tests/integration && RETRYGATE_BIN=$(abspath build/tsan/retrygate) RETRYGATE_READY_TIMEOUT=30 \
	  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" $(PYTEST) $(PYTEST_ARGS) $(TSAN_TESTS)

run: deps $(BUILD)/retrygate
	/usr/bin/python3 tests/tools/upstream.py --listen 127.0.0.1:9001 --flaky /flaky --quiet & up=$$!; \
	trap "kill $$up 2>/dev/null" EXIT INT TERM; \
	$(BUILD)/retrygate -c conf/retrygate.yaml

# Peer comparison: retrygate, HAProxy and nginx side by side (tests/bench/README.md).
bench: deps $(BUILD)/retrygate
	tests/bench/run.sh

# The point in one command: a flaky dependency, a naive retry policy vs retrygate's.
demo: deps $(BUILD)/retrygate
	/usr/bin/python3 tests/tools/demo.py

clean:
	rm -rf build/obj build/unit build/san build/tsan build/retrygate build/stripped build/fuzz

# ---------------------------------------------------------------- fuzzing (clang, libFuzzer)
FUZZ_SECONDS ?= 60
FUZZ_SRCS  := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS  := $(FUZZ_SRCS:tests/fuzz/%.c=build/fuzz/%)
# RG_CHECK_MAGIC: the magic checks, and freed objects go back to malloc (no free lists) where
# ASan sees a use after free
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -pthread -g -O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all \
               -fno-omit-frame-pointer $(LLHTTP_INC) -Isrc -DRETRYGATE_VERSION='"$(VERSION)"' -DRG_CHECK_MAGIC
FUZZ_OBJS  := $(filter-out build/fuzz/obj/app/main.o,$(SRCS:src/%.c=build/fuzz/obj/%.o))

build/fuzz/obj/%.o: src/%.c $(HDRS) | $(LLHTTP_LIB)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -c -o $@ $<

build/fuzz/%: tests/fuzz/%.c $(wildcard tests/fuzz/*.h) $(FUZZ_OBJS)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_OBJS) $(LDLIBS)

fuzz: deps $(FUZZ_BINS)
	@set -e; for f in $(FUZZ_BINS); do n=$$(basename $$f); mkdir -p build/fuzz/corpus/$$n; \
	  echo "== $$n ($(FUZZ_SECONDS)s)"; \
	  if ! $$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -artifact_prefix=build/fuzz/$$n- \
	       build/fuzz/corpus/$$n tests/fuzz/corpus/$$n > build/fuzz/$$n.log 2>&1; then \
	    tail -n 40 build/fuzz/$$n.log; echo "fuzz: $$n FAILED (artifact under build/fuzz/)"; exit 1; fi; \
	  grep -E "stat::number_of_executed_units|cov:" build/fuzz/$$n.log | tail -n 2; done
