#!/usr/bin/env bash
# `make bench`: retrygate vs HAProxy vs nginx as plain keep-alive HTTP reverse proxies, side by
# side on this machine, reported as ratios. Method and how to read it: tests/bench/README.md.
# First the HTTP/1.1 rows (wrk), then the HTTP/2 rows (h2load): HTTP/2 client -> HTTP/1.1
# upstream, HTTP/2 -> HTTP/2 (no nginx: it proxies HTTP/2 only as gRPC), and unary gRPC.
#
# Environment (defaults in brackets):
#   BENCH_ROUNDS [5]         interleaved rounds; each round measures every proxy once per concurrency
#   BENCH_SECONDS [5]        length of one wrk measurement
#   BENCH_QUICK=1            2 rounds x 2 s (a smoke run: numbers are rough)
#   BENCH_CONNS ["1 64"]     wrk concurrencies (wrk always runs one thread)
#   BENCH_WARMUP [1]         seconds of warm-up per proxy and concurrency before round 1
#   BENCH_PROXIES ["retrygate haproxy nginx haproxy-fields"]
#                            haproxy-fields: the same HAProxy process on frontends that also do
#                            retrygate's per-request field work (X-Forwarded-For/-Proto, a
#                            request id up and back; haproxy.cfg.in). Not a peer of the goal:
#                            `retrygate/best` is over the plain peers only
#   BENCH_PROXY_CPU [0]      the core every proxy is pinned to
#   BENCH_LOAD_CPU [1]       the core wrk and the upstream are pinned to
#   BENCH_BODY [13]          response body size in bytes (upstream, at most 256)
#   BENCH_SYSCALLS [1; 0 in quick mode]  after the rounds, count each proxy's system calls per
#                            request (perf stat on the syscall tracepoints, else strace -c) during
#                            one more wrk run at the highest concurrency
#   BENCH_SYSCALL_TOOL=strace  use strace even where perf works
#   BENCH_SYSCALL_SECONDS    that run's length [BENCH_SECONDS with perf, 3 with strace]
#   BENCH_INSTRUCTIONS [1; 0 in quick mode]  last, each proxy's user-space instructions per
#                            request in every row (tests/bench/instructions.sh: callgrind, the
#                            two-run difference; not moved by load), printed beside the ratios
#   BENCH_KEEP=1             keep build/bench/run.* (configs, logs, raw wrk output) after success
#   RETRYGATE_BIN            the binary to measure [build/retrygate]
#   BENCH_H2_ROWS ["h2 h2h2 grpc h2h2-1cpu"]  the HTTP/2 rows ("" = none); ROW-1cpu is ROW with
#                            the proxies moved onto the load core for its runs (one core for
#                            everything: no wake-ups across cores, every process's work counts)
#   BENCH_H2_ROUNDS [5; 2 in quick mode]  interleaved rounds of the HTTP/2 rows
#   BENCH_H2_SECONDS [3, or BENCH_SECONDS if less]  length of one h2load measurement (req/s)
#   BENCH_H2_LATENCY_SECONDS [1]  length of the h2load run with --log-file that gives the
#                            latencies (a separate run: the log costs the load core a write per
#                            request)
#   BENCH_H2_CONNS [4]  BENCH_H2_STREAMS [16]  h2load -c and -m (h2load always runs one thread)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/tests/bench
OUT=$ROOT/build/bench
RG_BIN=${RETRYGATE_BIN:-$ROOT/build/retrygate}

ROUNDS=${BENCH_ROUNDS:-5}
SECS=${BENCH_SECONDS:-5}
SYSCALLS=${BENCH_SYSCALLS:-1}
INSTRUCTIONS=${BENCH_INSTRUCTIONS:-1}
if [ "${BENCH_QUICK:-0}" = 1 ]; then
    ROUNDS=${BENCH_ROUNDS:-2}
    SECS=${BENCH_SECONDS:-2}
    SYSCALLS=${BENCH_SYSCALLS:-0}
    INSTRUCTIONS=${BENCH_INSTRUCTIONS:-0}
fi
SYSCALL_SECS=${BENCH_SYSCALL_SECONDS:-3}
CONNS=${BENCH_CONNS:-"1 64"}
WARMUP=${BENCH_WARMUP:-1}
PROXIES=${BENCH_PROXIES:-"retrygate haproxy nginx haproxy-fields"}
PROXY_CPU=${BENCH_PROXY_CPU:-0}
LOAD_CPU=${BENCH_LOAD_CPU:-1}
BODY=${BENCH_BODY:-13}
H2_ROWS=${BENCH_H2_ROWS-"h2 h2h2 grpc h2h2-1cpu"}
H2_ROUNDS=${BENCH_H2_ROUNDS:-5}
[ "${BENCH_QUICK:-0}" = 1 ] && H2_ROUNDS=${BENCH_H2_ROUNDS:-2}
H2_SECS=${BENCH_H2_SECONDS:-$((SECS > 3 ? 3 : SECS))}
H2_LAT_SECS=${BENCH_H2_LATENCY_SECONDS:-1}
H2_C=${BENCH_H2_CONNS:-4}
H2_M=${BENCH_H2_STREAMS:-16}

log() { printf 'bench: %s\n' "$*" >&2; }
die() { printf 'bench: error: %s\n' "$*" >&2; exit 1; }

# ------------------------------------------------------------------ tools
need_cmd_pkg="wrk:wrk nginx:nginx haproxy:haproxy gcc:gcc taskset:util-linux python3:python3 curl:curl"
[ -z "$H2_ROWS" ] || need_cmd_pkg="$need_cmd_pkg h2load:nghttp2-client"
[ "$INSTRUCTIONS" = 0 ] || need_cmd_pkg="$need_cmd_pkg valgrind:valgrind"
# the syscall phase uses perf when it works here, else strace
[ "$SYSCALLS" = 0 ] || command -v perf >/dev/null 2>&1 || need_cmd_pkg="$need_cmd_pkg strace:strace"
missing=""
for cp in $need_cmd_pkg; do
    c=${cp%%:*}; p=${cp#*:}
    command -v "$c" >/dev/null 2>&1 || [ -x "/usr/sbin/$c" ] || missing="$missing $p"
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ]; then
        log "installing$missing"
        apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null \
            || die "apt-get install$missing failed"
    else
        die "missing tools; run:  sudo apt-get install -y$missing"
    fi
fi
export PATH=$PATH:/usr/sbin
[ -x "$RG_BIN" ] || die "$RG_BIN not built (run: make all)"

NCPU=$(nproc)
if [ "$NCPU" -lt 2 ]; then
    log "warning: $NCPU CPU: no pinning possible, proxies compete with wrk and the upstream"
    PIN_PROXY=""; PIN_LOAD=""
else
    PIN_PROXY="taskset -c $PROXY_CPU"; PIN_LOAD="taskset -c $LOAD_CPU"
fi

# ------------------------------------------------------------------ workspace and cleanup
mkdir -p "$OUT"
RUN=$(mktemp -d "$OUT/run.XXXXXX")
PIDS=()
TRACER_PID=""
ok=0
cleanup() {
    local rc=$?
    [ -z "$TRACER_PID" ] || { kill -INT "$TRACER_PID" 2>/dev/null || true; wait "$TRACER_PID" 2>/dev/null || true; }
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [ "$ok" = 1 ] && [ "${BENCH_KEEP:-0}" != 1 ]; then
        rm -rf "$RUN"
    else
        log "logs, configs and raw wrk output kept in $RUN"
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
UP_PORT=$(free_port); RG_PORT=$(free_port); HA_PORT=$(free_port); NG_PORT=$(free_port)
# the HTTP/2 rows: an HTTP/2 and a gRPC upstream, and a port per proxy and row
UP_H2_PORT=$(free_port); UP_GRPC_PORT=$(free_port)
RG_H2_PORT=$(free_port); RG_H2H2_PORT=$(free_port); RG_GRPC_PORT=$(free_port)
HA_H2_PORT=$(free_port); HA_H2H2_PORT=$(free_port); HA_GRPC_PORT=$(free_port)
NG_H2_PORT=$(free_port); NG_GRPC_PORT=$(free_port)
HAF_PORT=$(free_port); HAF_H2_PORT=$(free_port); HAF_H2H2_PORT=$(free_port); HAF_GRPC_PORT=$(free_port)

subst() {
    local args=(-e "s|@DIR@|$RUN|g") v
    for v in UP_PORT RG_PORT HA_PORT NG_PORT UP_H2_PORT UP_GRPC_PORT RG_H2_PORT RG_H2H2_PORT \
             RG_GRPC_PORT HA_H2_PORT HA_H2H2_PORT HA_GRPC_PORT NG_H2_PORT NG_GRPC_PORT \
             HAF_PORT HAF_H2_PORT HAF_H2H2_PORT HAF_GRPC_PORT; do
        args+=(-e "s|@$v@|${!v}|g")
    done
    sed "${args[@]}" "$1" > "$2"
}

# ------------------------------------------------------------------ upstream
gcc -O2 -Wall -Wextra -DUPSTREAM_H2 -o "$RUN/upstream" "$HERE/upstream.c" -lnghttp2 || die "cannot compile the upstream"
$PIN_LOAD "$RUN/upstream" "$UP_PORT" "$BODY" 2> "$RUN/upstream.log" &
PIDS+=($!); UP_PID=$!
if [ -n "$H2_ROWS" ]; then
    $PIN_LOAD "$RUN/upstream" "$UP_H2_PORT" "$BODY" h2 2> "$RUN/upstream-h2.log" & PIDS+=($!)
    $PIN_LOAD "$RUN/upstream" "$UP_GRPC_PORT" "$BODY" grpc 2> "$RUN/upstream-grpc.log" & PIDS+=($!)
fi

# ------------------------------------------------------------------ proxies
declare -A PORT PID
PORT[direct]=$UP_PORT
PORT[h2.retrygate]=$RG_H2_PORT;   PORT[h2.haproxy]=$HA_H2_PORT;   PORT[h2.nginx]=$NG_H2_PORT
PORT[h2h2.retrygate]=$RG_H2H2_PORT; PORT[h2h2.haproxy]=$HA_H2H2_PORT
PORT[h2h2.direct]=$UP_H2_PORT
PORT[grpc.retrygate]=$RG_GRPC_PORT; PORT[grpc.haproxy]=$HA_GRPC_PORT; PORT[grpc.nginx]=$NG_GRPC_PORT
PORT[grpc.direct]=$UP_GRPC_PORT
PORT[h2.haproxy-fields]=$HAF_H2_PORT; PORT[h2h2.haproxy-fields]=$HAF_H2H2_PORT
PORT[grpc.haproxy-fields]=$HAF_GRPC_PORT
for p in $PROXIES; do
    case $p in
    retrygate)
        subst "$HERE/retrygate.yaml.in" "$RUN/retrygate.yaml"
        "$RG_BIN" -c "$RUN/retrygate.yaml" --check > "$RUN/retrygate.check" 2>&1 \
            || { cat "$RUN/retrygate.check" >&2; die "retrygate rejects the bench config"; }
        $PIN_PROXY "$RG_BIN" -c "$RUN/retrygate.yaml" 2> "$RUN/retrygate.log" &
        PORT[$p]=$RG_PORT ;;
    haproxy|haproxy-fields)
        # one HAProxy process serves both columns, each on its own frontends
        if [ -n "${HA_PID:-}" ]; then
            PID[$p]=$HA_PID
        else
            subst "$HERE/haproxy.cfg.in" "$RUN/haproxy.cfg"
            $PIN_PROXY haproxy -db -f "$RUN/haproxy.cfg" > "$RUN/haproxy.log" 2>&1 &
            HA_PID=$!; PIDS+=($!); PID[$p]=$!
        fi
        PORT[haproxy]=$HA_PORT; PORT[haproxy-fields]=$HAF_PORT
        continue ;;
    nginx)
        mkdir -p "$RUN/nginx-tmp"
        subst "$HERE/nginx.conf.in" "$RUN/nginx.conf"
        $PIN_PROXY nginx -p "$RUN" -c "$RUN/nginx.conf" -e "$RUN/nginx-error.log" > "$RUN/nginx.log" 2>&1 &
        PORT[$p]=$NG_PORT ;;
    *) die "unknown proxy '$p' in BENCH_PROXIES" ;;
    esac
    PIDS+=($!); PID[$p]=$!
done

# All the processes of one proxy: the pid and its children (nginx: master + worker).
tree_pids() { echo "$1"; pgrep -P "$1" 2>/dev/null || true; }
# pin_for_row ROW PID CPU: in a ROW-1cpu row, move every thread of the proxy's processes onto CPU
# (the load core before its runs, its own core after); other rows and `direct` are left alone
pin_for_row() {
    local pid
    [ "$1" != "${1%-1cpu}" ] && [ -n "$2" ] && [ -n "$PIN_PROXY" ] || return 0
    for pid in $(tree_pids "$2"); do taskset -a -p -c "$3" "$pid" >/dev/null || die "cannot pin $pid to CPU $3"; done
}
# CPU time (microseconds, user+system) of a proxy's processes.
cpu_us() {
    local t=0 pid f
    local hz; hz=$(getconf CLK_TCK)
    for pid in $(tree_pids "$1"); do
        f=$(cut -d')' -f2- "/proc/$pid/stat" 2>/dev/null) || continue
        set -- $f
        t=$((t + ${12} + ${13}))   # utime, stime: fields 14 and 15 of stat
    done
    echo $((t * 1000000 / hz))
}
mem_kb() {   # "$1" = pid, "$2" = VmRSS | VmHWM: summed over the tree
    local t=0 pid v
    for pid in $(tree_pids "$1"); do
        v=$(awk -v k="$2:" '$1==k {print $2}' "/proc/$pid/status" 2>/dev/null || true)
        t=$((t + ${v:-0}))
    done
    echo $t
}

expect="hello, world"
[ "$BODY" = 13 ] || expect=$(printf '%*s' "$BODY" '' | tr ' ' x)
for p in direct $PROXIES; do
    port=${PORT[$p]}
    got=""
    for _ in $(seq 100); do
        got=$(curl -s -m 2 "http://127.0.0.1:$port/" 2>/dev/null || true)
        [ -n "$got" ] && break
        if [ "$p" != direct ] && ! kill -0 "${PID[$p]}" 2>/dev/null; then
            cat "$RUN/${p%-fields}.log" "$RUN/nginx-error.log" 2>/dev/null | tail -n 20 >&2 || true
            die "$p exited at start"
        fi
        sleep 0.1
    done
    [ "$got" = "$expect" ] || die "$p on port $port answers '${got:0:80}', expected '$expect'"
    # the columns that do the field work must be doing it: a request id comes back
    case $p in retrygate|haproxy-fields)
        curl -s -m 2 -D - -o /dev/null "http://127.0.0.1:$port/" | grep -qi '^x-request-id: [^ ]' ||
            die "$p on port $port answers without X-Request-Id" ;;
    esac
done
# The HTTP/2 rows: the same body over HTTP/2 (prior knowledge); for gRPC, the upstream's
# message (5-byte prefix + body) and the trailers grpc-status: 0 (curl writes trailers with -D).
GRPC_MSG=$RUN/grpc-request.bin
printf '\0\0\0\0\005hello' > "$GRPC_MSG"
GRPC_PATH=/bench.Bench/Unary
h2_proxies() {   # ROW: the proxies of that row, in BENCH_PROXIES order
    local p
    for p in $PROXIES; do [ -n "${PORT[${1%-1cpu}.$p]:-}" ] && printf '%s ' "$p"; done
}
for row in $H2_ROWS; do
    case ${row%-1cpu} in h2|h2h2|grpc) ;; *) die "unknown row '$row' in BENCH_H2_ROWS (h2 h2h2 grpc, ROW-1cpu)" ;; esac
    [ "$row" = "${row%-1cpu}" ] || continue     # the same ports as its row, checked there
    for p in $(h2_proxies "$row") $([ -n "${PORT[$row.direct]:-}" ] && echo direct); do
        port=${PORT[$row.$p]}
        if [ "$row" = grpc ]; then
            curl -s -m 2 --http2-prior-knowledge -H 'content-type: application/grpc' -H 'te: trailers' \
                --data-binary @"$GRPC_MSG" -D "$RUN/check.hdr" -o "$RUN/check.body" \
                "http://127.0.0.1:$port$GRPC_PATH" 2>/dev/null || true
            got=$(tail -c +6 "$RUN/check.body" 2>/dev/null || true)
            grep -qi '^grpc-status: 0' "$RUN/check.hdr" 2>/dev/null || got="(no grpc-status: 0) $got"
        else
            got=$(curl -s -m 2 --http2-prior-knowledge "http://127.0.0.1:$port/" 2>/dev/null || true)
        fi
        [ "$got" = "$expect" ] || die "$p ($row row) on port $port answers '${got:0:80}', expected '$expect'"
    done
done
log "upstream :$UP_PORT  $(for p in $PROXIES; do printf '%s :%s  ' "$p" "${PORT[$p]}"; done)"
log "proxies on CPU $PROXY_CPU, wrk + upstream on CPU $LOAD_CPU; $ROUNDS rounds x ${SECS}s at c=[$CONNS]"

# ------------------------------------------------------------------ measurement
RESULTS=$RUN/records.jsonl
: > "$RESULTS"
# measure LABEL CONNS SECONDS ROUND: one wrk run; appends one JSON record (round < 0: not kept)
measure() {
    local p=$1 c=$2 s=$3 r=$4 raw c0 c1 line
    raw=$RUN/wrk.$p.c$c.r$r.txt
    c0=0; [ "$p" = direct ] || c0=$(cpu_us "${PID[$p]}")
    $PIN_LOAD wrk -t1 -c"$c" -d"${s}s" --timeout 5s -s "$HERE/report.lua" \
        "http://127.0.0.1:${PORT[$p]}/" > "$raw" 2>&1 || { cat "$raw" >&2; die "wrk failed against $p"; }
    c1=0; [ "$p" = direct ] || c1=$(cpu_us "${PID[$p]}")
    [ "$p" = direct ] || kill -0 "${PID[$p]}" 2>/dev/null || die "$p died during the run (see $RUN)"
    line=$(sed -n 's/^BENCHJSON //p' "$raw")
    [ -n "$line" ] || { cat "$raw" >&2; die "no result from wrk against $p"; }
    [ "$r" -ge 0 ] || return 0
    printf '{"proxy":"%s","conns":%s,"round":%s,"cpu_us":%s,"wrk":%s}\n' \
        "$p" "$c" "$r" "$((c1 - c0))" "$line" >> "$RESULTS"
    printf '  round %s  c=%-3s %-10s %10s req/s\n' "$r" "$c" "$p" \
        "$(sed -n 's/.*"rps":\([0-9.]*\).*/\1/p' <<<"$line")" >&2
}

# measure_h2 ROW LABEL SECONDS ROUND: one h2load run (-t1 -cC -mM for SECONDS), one record
# like measure's (the proxy's CPU time, h2load's numbers in report.lua's shape); round < 0: not kept
measure_h2() {
    local row=$1 p=$2 s=$3 r=$4 raw c0 c1 line pid="" base=${1%-1cpu}
    raw=$RUN/h2load.$row.$p.r$r
    [ "$p" = direct ] || pid=${PID[$p]}
    local extra=() url="http://127.0.0.1:${PORT[$base.$p]}/"
    if [ "$base" = grpc ]; then
        extra=(-H 'content-type: application/grpc' -H 'te: trailers' -d "$GRPC_MSG")
        url="http://127.0.0.1:${PORT[$base.$p]}$GRPC_PATH"
    fi
    # ROW-1cpu: the proxy joins h2load and the upstream on the load core for these runs
    pin_for_row "$row" "$pid" "$LOAD_CPU"
    c0=0; [ -z "$pid" ] || c0=$(cpu_us "$pid")
    $PIN_LOAD h2load -t1 -c"$H2_C" -m"$H2_M" -D "$s" "${extra[@]}" "$url" \
        > "$raw.txt" 2>&1 || { tail -n 20 "$raw.txt" >&2; die "h2load failed against $p ($row row)"; }
    c1=0; [ -z "$pid" ] || c1=$(cpu_us "$pid")
    [ -z "$pid" ] || kill -0 "$pid" 2>/dev/null || die "$p died during the $row row (see $RUN)"
    # Latencies from a second, shorter run (not for a warm-up): h2load's --log-file costs a
    # write(2) per request on the load core, which then limits every proxy alike and hides what
    # each one costs.
    if [ "$r" -ge 0 ]; then
        $PIN_LOAD h2load -t1 -c"$H2_C" -m"$H2_M" -D "$H2_LAT_SECS" "${extra[@]}" \
            --log-file="$raw.log" "$url" > "$raw.lat.txt" 2>&1 ||
            { tail -n 20 "$raw.lat.txt" >&2; die "h2load failed against $p ($row row, latency run)"; }
    fi
    pin_for_row "$row" "$pid" "$PROXY_CPU"
    [ "$r" -ge 0 ] || return 0      # a warm-up
    line=$(python3 "$HERE/h2load_json.py" "$raw.txt" "$raw.log" "$raw.lat.txt" |
           sed -n 's/^BENCHJSON //p')
    rm -f "$raw.log"    # one line per request: large
    [ -n "$line" ] || { tail -n 20 "$raw.txt" >&2; die "no result from h2load against $p ($row row)"; }
    printf '{"proxy":"%s","row":"%s","conns":%s,"round":%s,"cpu_us":%s,"wrk":%s}\n' \
        "$p" "$row" "$((H2_C * H2_M))" "$r" "$((c1 - c0))" "$line" >> "$RESULTS"
    printf '  round %s  %-5s %-10s %10s req/s\n' "$r" "$row" "$p" \
        "$(sed -n 's/.*"rps": *\([0-9.]*\).*/\1/p' <<<"$line")" >&2
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
if [ "$WARMUP" != 0 ]; then
    log "warm-up (${WARMUP}s per proxy and concurrency)"
    for c in $CONNS; do for p in $PROXIES; do measure "$p" "$c" "$WARMUP" -1; done; done
fi
# Ceiling of the load core: wrk straight to the upstream does the same work on CPU $LOAD_CPU
# per request as wrk + upstream behind a proxy; a proxy near it is measuring the load core.
for c in $CONNS; do measure direct "$c" "$SECS" 0; done

set -- $PROXIES; NP=$#; PLIST=("$@")
for r in $(seq 1 "$ROUNDS"); do
    log "round $r/$ROUNDS"
    for c in $CONNS; do
        # rotate the order each round, so no proxy always runs first or last
        for i in $(seq 0 $((NP - 1))); do
            measure "${PLIST[$(((i + r - 1) % NP))]}" "$c" "$SECS" "$r"
        done
    done
done

# The HTTP/2 rows, the same way: warm-up, the ceiling of the load core where the upstream speaks
# the row's protocol, then interleaved rounds with the order rotating.
if [ -n "$H2_ROWS" ]; then
    log "HTTP/2 rows [$H2_ROWS]: h2load -c$H2_C -m$H2_M, $H2_ROUNDS rounds x ${H2_SECS}s"
    if [ "$WARMUP" != 0 ]; then
        for row in $H2_ROWS; do for p in $(h2_proxies "$row"); do measure_h2 "$row" "$p" "$WARMUP" -1; done; done
    fi
    for row in $H2_ROWS; do   # (ROW-1cpu: the same ceiling as ROW)
        [ "$row" != "${row%-1cpu}" ] || [ -z "${PORT[$row.direct]:-}" ] || measure_h2 "$row" direct "$H2_SECS" 0
    done
    for r in $(seq 1 "$H2_ROUNDS"); do
        log "HTTP/2 round $r/$H2_ROUNDS"
        for row in $H2_ROWS; do
            set -- $(h2_proxies "$row"); NP=$#; PLIST=("$@")
            for i in $(seq 0 $((NP - 1))); do
                measure_h2 "$row" "${PLIST[$(((i + r - 1) % NP))]}" "$H2_SECS" "$r"
            done
        done
    done
fi
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ------------------------------------------------------------------ system calls per request
# One more wrk run per proxy with a syscall counter attached to all its processes: `perf stat` on
# the syscall tracepoints (cheap: the proxy runs at nearly full speed) or, without perf, `strace -c`
# (slow: only its counts are used). Counts are divided by the requests wrk completed; the proxy
# serves nothing else meanwhile. The setup of the wrk connections is included (accept4, close).
SYSC=$RUN/syscalls.jsonl
: > "$SYSC"
SYSCALL_NAMES="epoll_wait epoll_pwait epoll_ctl read readv recvfrom recvmsg write writev sendto sendmsg
    ioctl getsockopt setsockopt accept4 close futex clock_gettime brk mmap munmap"
if [ "$SYSCALLS" != 0 ]; then
    tool=strace; evs=""
    if [ "${BENCH_SYSCALL_TOOL:-auto}" != strace ] && command -v perf >/dev/null 2>&1 && perf stat -e raw_syscalls:sys_enter -- true >/dev/null 2>&1; then
        tool=perf; evs=raw_syscalls:sys_enter
        have=$(perf list tracepoint 2>/dev/null | grep -o 'syscalls:sys_enter_[a-z0-9_]*' | sort -u)
        for n in $SYSCALL_NAMES; do grep -qx "syscalls:sys_enter_$n" <<<"$have" && evs="$evs,syscalls:sys_enter_$n"; done
    fi
    if [ "$tool" = perf ]; then SYSCALL_SECS=${BENCH_SYSCALL_SECONDS:-$SECS}; fi
    set -- $CONNS; cmax=$1; for c in $CONNS; do [ "$c" -gt "$cmax" ] && cmax=$c; done
    log "system calls per request ($tool, c=$cmax, ${SYSCALL_SECS}s per proxy)"
    for p in $PROXIES; do
        pids=$(tree_pids "${PID[$p]}" | paste -sd, -)
        if [ $tool = perf ]; then
            perf stat -x, -e "$evs" -p "$pids" -o "$RUN/syscalls.$p.txt" 2> "$RUN/syscalls.$p.log" &
        else
            args=(); for pid in ${pids//,/ }; do args+=(-p "$pid"); done
            strace -c -f -qq -o "$RUN/syscalls.$p.txt" "${args[@]}" 2> "$RUN/syscalls.$p.log" &
        fi
        TRACER_PID=$!
        sleep 0.5
        $PIN_LOAD wrk -t1 -c"$cmax" -d"${SYSCALL_SECS}s" --timeout 5s -s "$HERE/report.lua" \
            "http://127.0.0.1:${PORT[$p]}/" > "$RUN/wrk.$p.syscalls.txt" 2>&1 || true
        sleep 0.2
        kill -INT "$TRACER_PID" 2>/dev/null || true
        wait "$TRACER_PID" 2>/dev/null || true
        TRACER_PID=""
        n=$(sed -n 's/^BENCHJSON .*"requests":\([0-9]*\).*/\1/p' "$RUN/wrk.$p.syscalls.txt")
        [ -s "$RUN/syscalls.$p.txt" ] && [ -n "$n" ] && [ "$n" -gt 0 ] || { log "no syscall count for $p"; continue; }
        # perf -x,: "count,unit,event,..."   strace -c: "% time seconds usecs/call calls [errors] syscall"
        awk -v p="$p" -v n="$n" -v c="$cmax" -v tool=$tool '
            tool == "perf" {
                split($0, f, ","); if (f[1] !~ /^[0-9]+$/) next
                if (f[3] == "raw_syscalls:sys_enter") total = f[1]
                else if (f[3] ~ /^syscalls:sys_enter_/) { k = substr(f[3], 20); calls[k] = f[1]; err[k] = 0; named += f[1] }
                next
            }
            $1 ~ /^[0-9.]+$/ && $NF != "total" { k = $NF; calls[k] = $4; err[k] = (NF == 6 ? $5 : 0) }
            END {
                if (tool == "perf" && total > named) { calls["(other)"] = total - named; err["(other)"] = 0 }
                printf "{\"proxy\":\"%s\",\"tool\":\"%s\",\"conns\":%d,\"requests\":%d,\"calls\":{", p, tool, c, n
                sep = ""
                for (k in calls) if (calls[k] > 0) { printf "%s\"%s\":[%d,%d]", sep, k, calls[k], err[k]; sep = "," }
                printf "}}\n"
            }' "$RUN/syscalls.$p.txt" >> "$SYSC"
    done
fi

# ------------------------------------------------------------------ instructions per request
# Last, as it needs no quiet machine: every proxy of every row under callgrind, one after the
# other, on instructions.sh's own upstreams and ports (the measured proxies above keep running,
# idle). The -1cpu rows are their base row's work: counted once.
INSTR=$RUN/instructions.jsonl
: > "$INSTR"
if [ "$INSTRUCTIONS" != 0 ]; then
    irows="h1"
    for row in $H2_ROWS; do case " $irows " in *" ${row%-1cpu} "*) ;; *) irows="$irows ${row%-1cpu}" ;; esac; done
    for row in $irows; do
        ips=""
        for p in $PROXIES; do [ "$row" = h2h2 ] && [ "$p" = nginx ] || ips="$ips $p"; done
        log "instructions per request, $row row:$ips (callgrind)"
        BENCH_MODE=$row BENCH_INSTR_JSON=$INSTR RETRYGATE_BIN=$RG_BIN "$HERE/instructions.sh" $ips >&2 \
            || log "instructions.sh failed for the $row row"
    done
fi

# ------------------------------------------------------------------ memory, report
MEM=$RUN/mem.json
{
    printf '{'
    sep=""
    for p in $PROXIES; do
        # one process serves haproxy and haproxy-fields: report it once
        [ "$p" = haproxy-fields ] && [ "${PID[haproxy]:-}" = "${PID[$p]}" ] && continue
        printf '%s"%s":{"rss_kb":%s,"hwm_kb":%s,"processes":%s}' "$sep" "$p" \
            "$(mem_kb "${PID[$p]}" VmRSS)" "$(mem_kb "${PID[$p]}" VmHWM)" "$(tree_pids "${PID[$p]}" | wc -l)"
        sep=","
    done
    printf '}\n'
} > "$MEM"

META=$RUN/meta.json
python3 - "$META" <<EOF
import json, sys
json.dump({
  "rounds": $ROUNDS, "seconds": $SECS, "warmup_seconds": $WARMUP, "conns": "$CONNS".split(),
  "h2_rows": "$H2_ROWS".split(), "h2_rounds": $H2_ROUNDS, "h2_seconds": $H2_SECS,
  "h2_conns": $H2_C, "h2_streams": $H2_M,
  "h2load": "$(h2load --version 2>/dev/null | head -1 | sed 's/.*nghttp2\/\([^ ]*\).*/\1/')",
  "proxies": "$PROXIES".split(), "proxy_cpu": "$PROXY_CPU", "load_cpu": "$LOAD_CPU",
  "body_bytes": $BODY, "ncpu": $NCPU, "loadavg_before": "$LOAD_BEFORE", "loadavg_after": "$LOAD_AFTER",
  "retrygate": "$("$RG_BIN" --version 2>/dev/null | head -1)",
  "retrygate_git": "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD -- src 2>/dev/null || echo '+dirty-src')",
  "haproxy": "$(haproxy -v 2>/dev/null | head -1 | cut -d' ' -f3)",
  "nginx": "$(nginx -v 2>&1 | sed 's|.*nginx/||')",
  "wrk": "$(wrk -v 2>&1 | head -1 | cut -d' ' -f2)",
}, open(sys.argv[1], "w"))
EOF

python3 "$HERE/report.py" "$RESULTS" "$MEM" "$META" "$SYSC" "$OUT/results.json" "$INSTR" | tee "$OUT/results.txt"
log "results: $OUT/results.json, $OUT/results.txt"
ok=1
