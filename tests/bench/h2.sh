#!/usr/bin/env bash
# HTTP/2 rows of the peer comparison: h2load (prior knowledge, -c CONNS -m STREAMS) through
# retrygate, nginx (listen ... http2) and HAProxy (bind ... proto h2), each in front of the same
# HTTP/1.1 bench upstream (tests/bench/upstream.c), interleaved rounds, req/s and p99 (from
# h2load's per-request log), then the ratios. Proxies on CPU 0, h2load and upstream on CPU 1.
#
#   H2_ROUNDS [3]  H2_REQUESTS [200000]  H2_CONNS [4]  H2_STREAMS [16]  RETRYGATE_BIN
#   H2_PIN [1]: 0 runs everything unpinned (on 2 CPUs the pinned h2load starves the upstream)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/tests/bench
RG_BIN=${RETRYGATE_BIN:-$ROOT/build/retrygate}
ROUNDS=${H2_ROUNDS:-3}; N=${H2_REQUESTS:-200000}; C=${H2_CONNS:-4}; M=${H2_STREAMS:-16}
export PATH=$PATH:/usr/sbin
if [ "${H2_PIN:-1}" = 1 ]; then P0="taskset -c 0"; P1="taskset -c 1"; else P0=""; P1=""; fi
RUN=$(mktemp -d "$ROOT/build/bench-h2.XXXXXX")
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=$(port); RG=$(port); NG=$(port); HA=$(port)

gcc -O2 -o "$RUN/upstream" "$HERE/upstream.c"
$P1 "$RUN/upstream" "$UP" 13 2>/dev/null & PIDS+=($!)

cat > "$RUN/rg.yaml" <<EOC
admin: { listen: "" }
workers: 1
access_log: "off"
listeners:
  - name: bench
    listen: "127.0.0.1:$RG"
    routes: [ { path_prefix: "/", upstream: bench } ]
upstreams:
  bench: { endpoints: ["127.0.0.1:$UP"] }
EOC
$P0 "$RG_BIN" -c "$RUN/rg.yaml" 2>"$RUN/rg.log" & PIDS+=($!)

mkdir -p "$RUN/ng"
cat > "$RUN/nginx.conf" <<EOC
worker_processes 1; daemon off; pid $RUN/nginx.pid; error_log $RUN/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $RUN/ng/b; proxy_temp_path $RUN/ng/p; fastcgi_temp_path $RUN/ng/f;
    uwsgi_temp_path $RUN/ng/u; scgi_temp_path $RUN/ng/s;
    upstream up { server 127.0.0.1:$UP; keepalive 256; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$NG http2;
        http2_max_requests 1000000; keepalive_requests 1000000;
        location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }
    }
}
EOC
$P0 nginx -p "$RUN" -c "$RUN/nginx.conf" -e "$RUN/nginx-error.log" >/dev/null 2>&1 & PIDS+=($!)

cat > "$RUN/haproxy.cfg" <<EOC
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
frontend bench
    bind 127.0.0.1:$HA proto h2
    default_backend up
backend up
    server up1 127.0.0.1:$UP
EOC
$P0 haproxy -db -f "$RUN/haproxy.cfg" >/dev/null 2>&1 & PIDS+=($!)
sleep 1

declare -A PORTS=([retrygate]=$RG [nginx]=$NG [haproxy]=$HA)
for r in $(seq "$ROUNDS"); do
    for p in retrygate nginx haproxy; do
        $P1 h2load -c"$C" -m"$M" -n"$N" --log-file="$RUN/$p.$r.log" \
            "http://127.0.0.1:${PORTS[$p]}/bench" > "$RUN/$p.$r.out" 2>&1 || true
    done
done
python3 - "$RUN" "$ROUNDS" <<'EOP'
import statistics, sys, re
run, rounds = sys.argv[1], int(sys.argv[2])
res = {}
for p in ("retrygate", "nginx", "haproxy"):
    rps, p99, p50, ok = [], [], [], []
    for r in range(1, rounds + 1):
        out = open("%s/%s.%d.out" % (run, p, r)).read()
        m = re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out)
        rps.append(float(m.group(1)) if m else 0.0)
        s = re.search(r"(\d+) succeeded", out); ok.append(int(s.group(1)) if s else 0)
        d = sorted(int(l.split("\t")[2]) for l in open("%s/%s.%d.log" % (run, p, r)) if l.strip())
        p99.append(d[int(len(d) * 0.99)] if d else 0); p50.append(d[len(d) // 2] if d else 0)
    res[p] = (statistics.median(rps), statistics.median(p50), statistics.median(p99), min(ok))
print("%d rounds (median); latency in us" % rounds)
for p, (a, b, c, k) in res.items():
    print("%-10s %10.0f req/s  p50 %6d us  p99 %6d us  (min succeeded %d)" % (p, a, b, c, k))
rg = res["retrygate"]
for p in ("nginx", "haproxy"):
    o = res[p]
    print("retrygate/%-8s req/s %.2f  p99 %.2f" % (p, rg[0] / o[0] if o[0] else 0, rg[2] / o[2] if o[2] else 0))
EOP
