#!/usr/bin/env bash
# Instructions per proxied request, user space, under callgrind: retrygate, HAProxy and nginx
# on the same bench upstream and configs as run.sh. Unlike req/s or CPU time, the count does
# not depend on what else the machine runs, so a change on the request path can be judged on a
# busy shared machine (kernel time, i.e. system calls, is what run.sh's syscall line counts).
#
#   tests/bench/instructions.sh [PROXY...]     PROXY: retrygate haproxy nginx, or a binary path
#   BENCH_CONNS [64]   wrk connections         RETRYGATE_BIN [build/retrygate]
#
# Method: a proxy under callgrind serves N1 then (in a second run) N2 requests from wrk; the
# difference of the two program totals over N2 - N1 leaves start-up and shutdown out.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
RG_BIN=${RETRYGATE_BIN:-$ROOT/build/retrygate}
CONNS=${BENCH_CONNS:-64}
N1=3000 N2=30000
for t in valgrind callgrind_annotate wrk curl gcc; do
    command -v "$t" >/dev/null || { echo "instructions: $t is missing (apt-get install valgrind wrk curl)" >&2; exit 1; }
done
RUN=$(mktemp -d "${TMPDIR:-/tmp}/rg-instr.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$RUN"' EXIT
gcc -O2 -o "$RUN/upstream" "$HERE/upstream.c"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=$(port)
"$RUN/upstream" "$UP" 2>/dev/null &

# command line of PROXY listening on port P
proxy_cmd() {
    local what=$1 p=$2 dir=$RUN/$1.$2
    mkdir -p "$dir/nginx-tmp"
    case $what in
    haproxy) sed "s/@HA_PORT@/$p/; s/@UP_PORT@/$UP/" "$HERE/haproxy.cfg.in" > "$dir/cfg"
             echo "haproxy -db -f $dir/cfg" ;;
    nginx)   sed "s/@NG_PORT@/$p/; s/@UP_PORT@/$UP/; s#@DIR@#$dir#g" "$HERE/nginx.conf.in" |
                 sed 's/^daemon off;/daemon off;\nmaster_process off;/' > "$dir/cfg"
             echo "nginx -c $dir/cfg -p $dir" ;;
    retrygate) sed "s/@RG_PORT@/$p/; s/@UP_PORT@/$UP/" "$HERE/retrygate.yaml.in" > "$dir/cfg"
             echo "$RG_BIN -c $dir/cfg" ;;
    *)       sed "s/@RG_PORT@/$p/; s/@UP_PORT@/$UP/" "$HERE/retrygate.yaml.in" > "$dir/cfg"
             echo "$what -c $dir/cfg" ;;
    esac
}

# total instructions of one callgrind run serving at least N requests: "REQUESTS INSTRUCTIONS"
measure() {
    local what=$1 n=$2 p; p=$(port)
    local cmd; cmd=$(proxy_cmd "$what" "$p")
    valgrind --tool=callgrind --callgrind-out-file="$RUN/cg.out" $cmd >/dev/null 2>&1 &
    local v=$!
    for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$p/" && break; sleep 0.2; done
    local got=0 out
    while [ "$got" -lt "$n" ]; do
        out=$(wrk -t1 -c"$CONNS" -d2s "http://127.0.0.1:$p/" 2>&1)
        got=$((got + $(echo "$out" | awk '/requests in/{print $1}')))
    done
    kill -INT $v 2>/dev/null || true; sleep 0.5; kill -TERM $v 2>/dev/null || true
    wait $v 2>/dev/null || true
    echo "$got $(callgrind_annotate "$RUN/cg.out" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1}')"
}

echo "instructions per request (user space, callgrind, wrk -c$CONNS, $N1 -> $N2 requests)"
for what in ${@:-retrygate haproxy nginx}; do
    read -r n1 i1 < <(measure "$what" $N1)
    read -r n2 i2 < <(measure "$what" $N2)
    printf "  %-12s %8d\n" "$(basename "$what")" $(( (i2 - i1) / (n2 - n1) ))
done
