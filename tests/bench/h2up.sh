#!/usr/bin/env bash
# The h1 -> h2 row: wrk (HTTP/1.1, keep-alive) through retrygate (`protocol: h2`) and through
# HAProxy (`server ... proto h2`) to the same HTTP/2 origin (HAProxy `bind ... proto h2` with
# `http-request return`: no h2 server of ours in the measurement), side by side, interleaved
# rounds, reported as retrygate/HAProxy ratios. Proxies on BENCH_PROXY_CPU, wrk and the origin
# on BENCH_LOAD_CPU, as in run.sh.
#
#   BENCH_ROUNDS [3]  BENCH_SECONDS [5]  BENCH_CONNS ["1 64"]  RETRYGATE_BIN [build/retrygate]
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RG_BIN=${RETRYGATE_BIN:-$ROOT/build/retrygate}
ROUNDS=${BENCH_ROUNDS:-3}
SECS=${BENCH_SECONDS:-5}
CONNS=${BENCH_CONNS:-"1 64"}
PROXY_CPU=${BENCH_PROXY_CPU:-0}
LOAD_CPU=${BENCH_LOAD_CPU:-1}
OUT=$(mktemp -d "${TMPDIR:-/tmp}/h2bench.XXXXXX")
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ORIGIN=$(port); HA=$(port); RG=$(port)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$OUT"; }
trap cleanup EXIT

cat > "$OUT/origin.cfg" <<EOF
global
    nbthread 1
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend origin
    bind 127.0.0.1:$ORIGIN proto h2
    http-request return status 200 content-type text/plain string "hello, world\n"
EOF
cat > "$OUT/proxy.cfg" <<EOF
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    option http-keep-alive
    http-reuse always
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
frontend bench
    bind 127.0.0.1:$HA
    default_backend up
backend up
    server o1 127.0.0.1:$ORIGIN proto h2
EOF
cat > "$OUT/rg.yaml" <<EOF
admin:
  listen: ""
workers: 1
access_log: "off"
listeners:
  - name: bench
    listen: "127.0.0.1:$RG"
    routes:
      - upstream: bench
upstreams:
  bench:
    endpoints: ["127.0.0.1:$ORIGIN"]
    protocol: h2
EOF

taskset -c "$LOAD_CPU" "$HAPROXY" -f "$OUT/origin.cfg" -db >"$OUT/origin.log" 2>&1 & pids+=($!)
taskset -c "$PROXY_CPU" "$HAPROXY" -f "$OUT/proxy.cfg" -db >"$OUT/proxy.log" 2>&1 & pids+=($!)
taskset -c "$PROXY_CPU" "$RG_BIN" -c "$OUT/rg.yaml" >"$OUT/rg.log" 2>&1 & pids+=($!)
for p in $HA $RG; do
    for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$p/" && break; sleep 0.05; done
    curl -sf -o /dev/null "http://127.0.0.1:$p/" || { cat "$OUT"/*.log >&2; echo "proxy on $p not serving" >&2; exit 1; }
done

measure() {   # port conns -> "rps p99_us"
    taskset -c "$LOAD_CPU" wrk -t1 -c"$2" -d"${SECS}s" --latency "http://127.0.0.1:$1/" 2>&1 |
        python3 -c '
import re, sys
t = sys.stdin.read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", t)
p99 = float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)]
err = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
print(rps, p99, err.group(1) if err else 0)'
}

for c in $CONNS; do measure $HA "$c" >/dev/null; measure $RG "$c" >/dev/null; done   # warm-up
printf '%-6s %-10s %12s %12s %8s\n' conns proxy req/s p99_us non2xx
for c in $CONNS; do
    rg_r=(); ha_r=(); rg_p=(); ha_p=()
    for r in $(seq "$ROUNDS"); do
        read -r a b e < <(measure $HA "$c"); ha_r+=("$a"); ha_p+=("$b")
        printf '%-6s %-10s %12.0f %12.0f %8s\n' "$c" haproxy "$a" "$b" "$e"
        read -r a b e < <(measure $RG "$c"); rg_r+=("$a"); rg_p+=("$b")
        printf '%-6s %-10s %12.0f %12.0f %8s\n' "$c" retrygate "$a" "$b" "$e"
    done
    python3 - "${rg_r[*]}" "${ha_r[*]}" "${rg_p[*]}" "${ha_p[*]}" "$c" <<'EOF'
import statistics as st, sys
rr, hr, rp, hp = ([float(x) for x in a.split()] for a in sys.argv[1:5])
print("c=%s median req/s retrygate %.0f haproxy %.0f ratio %.2f; median p99 retrygate %.0fus "
      "haproxy %.0fus ratio %.2f" % (sys.argv[5], st.median(rr), st.median(hr),
                                     st.median(rr) / st.median(hr), st.median(rp), st.median(hp),
                                     st.median(rp) / st.median(hp)))
EOF
done
