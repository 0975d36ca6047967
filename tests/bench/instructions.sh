#!/usr/bin/env bash
# Instructions per proxied request, user space, under callgrind: retrygate, HAProxy and nginx
# on the same bench upstream and configs as run.sh. Unlike req/s or CPU time, the count does
# not depend on what else the machine runs, so a change on the request path can be judged on a
# busy shared machine (kernel time, i.e. system calls, is what run.sh's syscall line counts).
#
#   tests/bench/instructions.sh [PROXY...]     PROXY: retrygate haproxy nginx haproxy-fields
#                      (run.sh's column of that name: HAProxy doing retrygate's field work),
#                      or a binary path
#   BENCH_CONNS [64]   wrk connections         RETRYGATE_BIN [build/retrygate]
#   BENCH_MODE [h1]    h1:   wrk (HTTP/1.1) -> HTTP/1.1 upstream
#                      h2:   h2load -c4 -m16 (HTTP/2 client) -> HTTP/1.1 upstream
#                      h2h2: h2load -> HTTP/2 upstream (retrygate protocol: h2, HAProxy proto h2;
#                            nginx has none)
#                      grpc: h2load unary gRPC calls -> the gRPC-shaped HTTP/2 upstream
#   BENCH_INSTR_JSON=FILE  also append one JSON line per proxy to FILE (run.sh's report reads them)
#   BENCH_KEEP_PROFILE=DIR  keep each proxy's callgrind output of the larger run in DIR
#                      (callgrind_annotate DIR/cg.retrygate.h2 shows where the instructions go)
#
# Method: a proxy under callgrind serves N1 then (in a second run) N2 requests; the difference
# of the two program totals over N2 - N1 leaves start-up and shutdown out. The configs are
# run.sh's: the same listener (port) per mode as its rows.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
RG_BIN=${RETRYGATE_BIN:-$ROOT/build/retrygate}
CONNS=${BENCH_CONNS:-64}
MODE=${BENCH_MODE:-h1}
N1=3000 N2=30000
case $MODE in
h1) ;;
h2|h2h2|grpc) N1=2000 N2=20000 ;;
*) echo "instructions: BENCH_MODE must be h1, h2, h2h2 or grpc, not '$MODE'" >&2; exit 2 ;;
esac
for t in valgrind callgrind_annotate wrk h2load curl gcc; do
    command -v "$t" >/dev/null || { echo "instructions: $t is missing (apt-get install valgrind wrk curl)" >&2; exit 1; }
done
RUN=$(mktemp -d "${TMPDIR:-/tmp}/rg-instr.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$RUN"' EXIT
gcc -O2 -DUPSTREAM_H2 -o "$RUN/upstream" "$HERE/upstream.c" -lnghttp2
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=$(port) UP_H2=$(port) UP_GRPC=$(port)
"$RUN/upstream" "$UP" 2>/dev/null &
"$RUN/upstream" "$UP_H2" 13 h2 2>/dev/null &
"$RUN/upstream" "$UP_GRPC" 13 grpc 2>/dev/null &
printf '\0\0\0\0\005hello' > "$RUN/grpc-request.bin"
# the placeholder of the port MODE is measured on (the other listeners get unused ports)
case $MODE in h1) SLOT="";; h2) SLOT=_H2;; h2h2) SLOT=_H2H2;; grpc) SLOT=_GRPC;; esac

# fill a run.sh config: upstream ports, port P for this mode's listener of proxy PFX (RG, HA,
# HAF, NG); the template's other listeners (prefixes OTHER...) get unused ports
fill() {   # TEMPLATE PFX P DIR [OTHER...]
    local args=(-e "s|@UP_PORT@|$UP|g" -e "s|@UP_H2_PORT@|$UP_H2|g" -e "s|@UP_GRPC_PORT@|$UP_GRPC|g"
                -e "s|@DIR@|$4|g" -e "s|@${2}${SLOT}_PORT@|$3|g") s x
    for x in "$2" "${@:5}"; do
        for s in "" _H2 _H2H2 _GRPC; do args+=(-e "s|@${x}${s}_PORT@|$(port)|g"); done
    done
    sed "${args[@]}" "$1"
}

# command line of PROXY listening on port P
proxy_cmd() {
    local what=$1 p=$2 dir=$RUN/$1.$2
    mkdir -p "$dir/nginx-tmp"
    case $what in
    haproxy) fill "$HERE/haproxy.cfg.in" HA "$p" "$dir" HAF > "$dir/cfg"
             echo "haproxy -db -f $dir/cfg" ;;
    haproxy-fields) fill "$HERE/haproxy.cfg.in" HAF "$p" "$dir" HA > "$dir/cfg"
             echo "haproxy -db -f $dir/cfg" ;;
    nginx)   fill "$HERE/nginx.conf.in" NG "$p" "$dir" |
                 sed 's/^daemon off;/daemon off;\nmaster_process off;/' > "$dir/cfg"
             echo "nginx -c $dir/cfg -p $dir" ;;
    retrygate) fill "$HERE/retrygate.yaml.in" RG "$p" "$dir" > "$dir/cfg"
             echo "$RG_BIN -c $dir/cfg" ;;
    *)       fill "$HERE/retrygate.yaml.in" RG "$p" "$dir" > "$dir/cfg"
             echo "$what -c $dir/cfg" ;;
    esac
}

# one load run of at least N requests against port P; prints the requests completed
load() {   # P N
    local out
    case $MODE in
    h1)   out=$(wrk -t1 -c"$CONNS" -d2s "http://127.0.0.1:$1/" 2>&1)
          echo "$out" | awk '/requests in/{print $1}' ;;
    h2|h2h2) out=$(h2load -t1 -c4 -m16 -n"$2" "http://127.0.0.1:$1/" 2>&1)
          echo "$out" | sed -n 's/.* \([0-9]*\) succeeded.*/\1/p' ;;
    grpc) out=$(h2load -t1 -c4 -m16 -n"$2" -H 'content-type: application/grpc' -H 'te: trailers' \
                    -d "$RUN/grpc-request.bin" "http://127.0.0.1:$1/bench.Bench/Unary" 2>&1)
          echo "$out" | sed -n 's/.* \([0-9]*\) succeeded.*/\1/p' ;;
    esac
}

# total instructions of one callgrind run serving at least N requests: "REQUESTS INSTRUCTIONS"
measure() {
    local what=$1 n=$2 p; p=$(port)
    local cmd; cmd=$(proxy_cmd "$what" "$p")
    valgrind --tool=callgrind --callgrind-out-file="$RUN/cg.out" $cmd >/dev/null 2>&1 &
    local v=$!
    local h2=""; [ "$MODE" = h1 ] || h2=--http2-prior-knowledge
    for _ in $(seq 100); do curl -s $h2 -o /dev/null "http://127.0.0.1:$p/" && break; sleep 0.2; done
    local got=0 k
    while [ "$got" -lt "$n" ]; do
        k=$(load "$p" $((n - got)))
        [ "${k:-0}" -gt 0 ] || { echo "instructions: no request served by $what ($MODE)" >&2; exit 1; }
        got=$((got + k))
    done
    kill -INT $v 2>/dev/null || true; sleep 0.5; kill -TERM $v 2>/dev/null || true
    wait $v 2>/dev/null || true
    [ -z "${BENCH_KEEP_PROFILE:-}" ] || { mkdir -p "$BENCH_KEEP_PROFILE";
        cp "$RUN/cg.out" "$BENCH_KEEP_PROFILE/cg.$(basename "$what").$MODE"; }
    echo "$got $(callgrind_annotate "$RUN/cg.out" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1}')"
}

case $MODE in
h1) echo "instructions per request (user space, callgrind, wrk -c$CONNS, $N1 -> $N2 requests)" ;;
*)  echo "instructions per request, $MODE row (user space, callgrind, h2load -c4 -m16, $N1 -> $N2 requests)" ;;
esac
default="retrygate haproxy nginx"; [ "$MODE" != h2h2 ] || default="retrygate haproxy"
for what in ${@:-$default}; do
    read -r n1 i1 < <(measure "$what" $N1)
    read -r n2 i2 < <(measure "$what" $N2)
    per=$(( (i2 - i1) / (n2 - n1) ))
    printf "  %-14s %8d\n" "$(basename "$what")" "$per"
    [ -z "${BENCH_INSTR_JSON:-}" ] || printf '{"row":"%s","proxy":"%s","instructions":%d,"requests":[%d,%d]}\n' \
        "$MODE" "$(basename "$what")" "$per" "$n1" "$n2" >> "$BENCH_INSTR_JSON"
done
