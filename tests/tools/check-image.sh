#!/usr/bin/env bash
# tests/tools/check-image.sh — build docker/Dockerfile for real and run the image, without a
# Docker daemon: buildah and podman (runc, cgroupfs), on a base image made by debootstrap.
#
#   tests/tools/check-image.sh [--keep-base]      (as root; minutes; needs the Debian mirror)
#
# Not part of `make test`. Each line printed is one check, PASS / FAIL, and the exit status
# is 1 if any failed. Work and logs: build/image-check/ (log/*.log).
#
#  1. Tools: debootstrap, buildah, podman, runc (apt-get install when missing).
#  2. Base: `debootstrap --variant=minbase bookworm` from $MIRROR (deb.debian.org), with the
#     official images' apt sources and an apt that keeps no caches, imported with `podman
#     import`, and again without documentation, manual pages and translations (as -slim is
#     made); tagged as
#     docker.io/library/debian:bookworm and :bookworm-slim in local storage, so that the
#     Dockerfile's FROM lines resolve to it (`--pull=never`: no registry is asked).
#     --keep-base reuses the imported base of an earlier run.
#  3. Build: `buildah bud --isolation chroot --format docker --layers`; the HEALTHCHECK must
#     be in the image (and is shown missing once the image is committed in the OCI format).
#     Figures: build time, image size, binary size before and after strip.
#  4. Run: `podman --runtime runc --cgroup-manager cgroupfs run --network host` with a config
#     mounted at /etc/retrygate/retrygate.yaml, in front of tests/tools/upstream.py --flaky on
#     the host's loopback: /ready answers 200, `podman healthcheck run` (the image's
#     HEALTHCHECK) passes, a proxied GET is answered (and a /flaky one retried), SIGHUP
#     reloads a changed config (seen on /config), and `podman stop` ends it with exit 0.
#     Host networking: the container reaches the upstream on 127.0.0.1 and nothing leaves the
#     machine's loopback; admin.listen is 127.0.0.1:9901, which the HEALTHCHECK asks, so that
#     port must be free on the host.
#
# The sandbox this was written in refuses to let runc raise RLIMIT_NOFILE/RLIMIT_NPROC to
# podman's defaults ("error setting rlimit type 7: operation not permitted"): every run and
# build passes lower --ulimit values.

# shellcheck disable=SC2015  # pass()/fail() return 0
set -uo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SELF")/../.." && pwd)
WORK=$REPO/build/image-check
LOG=$WORK/log
MIRROR=${MIRROR:-http://deb.debian.org/debian}
BASE=localhost/retrygate-check/debootstrap:bookworm
IMAGE=localhost/retrygate:check
NAME=retrygate-image-check
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
ULIMITS=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
ADMIN_PORT=9901
KEEP_BASE=0
[ "${1:-}" = "--keep-base" ] && KEEP_BASE=1

CHECK_NAME=check-image
# shellcheck source=tests/tools/checklib.sh
. "$(dirname "$SELF")/checklib.sh"
tail_log() { tail -n "${2:-15}" "$1" | sed 's/^/      | /'; }
UP_PID=
check_cleanup() {
	"${PODMAN[@]}" rm -f "$NAME" >/dev/null 2>&1
	[ -n "$UP_PID" ] && kill "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null
	UP_PID=
}
trap check_cleanup EXIT
# podman's complaints that it has no systemd to schedule the HEALTHCHECK with (it runs only
# when asked, `podman healthcheck run`, here) go to $LOG/podman.log with the rest of stderr.
# timed CMD...: run, log to $LOG/$STEPLOG, set ELAPSED
timed() {
	local t0=$SECONDS
	"$@" >"$LOG/$STEPLOG" 2>&1
	local rc=$?
	ELAPSED=$((SECONDS - t0))
	return $rc
}
http_get() { # URL -> "STATUS\nheaders...\n\nbody" on stdout; status 000 when no answer
	/usr/bin/python3 - "$1" <<-'EOF'
	import signal, sys, urllib.request, urllib.error
	signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # a reader that wants one line only
	try:
	    r = urllib.request.urlopen(sys.argv[1], timeout=3)
	except urllib.error.HTTPError as e:
	    r = e
	except Exception:
	    print("000"); sys.exit()
	print(r.status)
	for k, v in r.headers.items():
	    print("%s: %s" % (k, v))
	print()
	print(r.read().decode(errors="replace"))
	EOF
}
status_of() { http_get "$1" | head -n 1; }
header_of() { http_get "$1" | awk -v h="$2" 'BEGIN { IGNORECASE = 1 } NR > 1 && $0 == "" { exit } tolower($1) == tolower(h) ":" { print $2 }' | tr -d '\r'; }

[ "$(id -u)" = 0 ] || { echo "check-image: run as root (debootstrap, podman)"; exit 1; }
mkdir -p "$LOG"

# ------------------------------------------------------------ 1. tools
step "1. tools"
need=()
for t in debootstrap buildah podman runc; do command -v "$t" >/dev/null || need+=("$t"); done
if [ ${#need[@]} -gt 0 ]; then
	STEPLOG=apt.log
	if timed sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q ${need[*]}"; then
		pass "apt-get install ${need[*]} (${ELAPSED}s)"
	else fail "apt-get install ${need[*]}:"; tail_log "$LOG/apt.log"; abort "tools missing"; fi
fi
info "$(buildah --version); $(podman --version); $(runc --version | head -n 1); debootstrap $(dpkg-query -W -f '${Version}' debootstrap)"

# ------------------------------------------------------------ 2. base image
step "2. base image: debootstrap bookworm from $MIRROR"
if [ "$KEEP_BASE" = 1 ] && "${PODMAN[@]}" image exists "$BASE" && "${PODMAN[@]}" image exists "$BASE-slim"; then
	pass "reusing $BASE (--keep-base)"
else
	rm -rf "$WORK/rootfs"
	STEPLOG=debootstrap.log
	if timed debootstrap --variant=minbase bookworm "$WORK/rootfs" "$MIRROR"; then
		pass "debootstrap --variant=minbase bookworm (${ELAPSED}s, $(du -sh "$WORK/rootfs" | cut -f1))"
	else fail "debootstrap:"; tail_log "$LOG/debootstrap.log"; abort "no base image"; fi
	# the apt sources of Debian's official images (updates and security too)
	rm -f "$WORK/rootfs/etc/apt/sources.list"
	cat >"$WORK/rootfs/etc/apt/sources.list.d/debian.sources" <<-EOF
	Types: deb
	URIs: $MIRROR
	Suites: bookworm bookworm-updates
	Components: main
	Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

	Types: deb
	URIs: ${MIRROR%/debian}/debian-security
	Suites: bookworm-security
	Components: main
	Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
	EOF
	# as in a container image: apt keeps no binary caches, downloads or translations
	cat >"$WORK/rootfs/etc/apt/apt.conf.d/90image-check" <<-'EOF'
	// a container image's apt: no pkgcache.bin files, no .deb left behind, no translations
	Dir::Cache::pkgcache "";
	Dir::Cache::srcpkgcache "";
	DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb || true"; };
	Acquire::Languages "none";
	EOF
	chroot "$WORK/rootfs" apt-get clean
	rm -rf "$WORK/rootfs/var/lib/apt/lists/"* "$WORK/rootfs/var/cache/apt/"*.bin
	STEPLOG=import.log
	if timed sh -c "tar -C '$WORK/rootfs' -c . | ${PODMAN[*]} import - '$BASE'"; then
		pass "podman import -> $BASE (${ELAPSED}s)"
	else fail "podman import:"; tail_log "$LOG/import.log"; abort "no base image"; fi
	# -slim as Debian makes it: no documentation, manual pages or translations (dpkg is told
	# to skip them from now on; copyright files stay)
	cat >"$WORK/rootfs/etc/dpkg/dpkg.cfg.d/90image-check-slim" <<-'EOF'
	path-exclude /usr/share/doc/*
	path-include /usr/share/doc/*/copyright
	path-exclude /usr/share/man/*
	path-exclude /usr/share/info/*
	path-exclude /usr/share/locale/*
	EOF
	find "$WORK/rootfs/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
	rm -rf "$WORK/rootfs/usr/share/man/"* "$WORK/rootfs/usr/share/info/"* "$WORK/rootfs/usr/share/locale/"*
	STEPLOG=import-slim.log
	if timed sh -c "tar -C '$WORK/rootfs' -c . | ${PODMAN[*]} import - '$BASE-slim'"; then
		pass "podman import -> $BASE-slim (${ELAPSED}s)"
	else fail "podman import (slim):"; tail_log "$LOG/import-slim.log"; abort "no base image"; fi
fi
"${PODMAN[@]}" tag "$BASE" docker.io/library/debian:bookworm || abort "podman tag $BASE"
"${PODMAN[@]}" tag "$BASE-slim" docker.io/library/debian:bookworm-slim || abort "podman tag $BASE-slim"
info "tagged as debian:bookworm ($(( $("${PODMAN[@]}" image inspect --format '{{.Size}}' "$BASE") / 1000000 )) MB) and" \
	"debian:bookworm-slim ($(( $("${PODMAN[@]}" image inspect --format '{{.Size}}' "$BASE-slim") / 1000000 )) MB), local storage only"

# ------------------------------------------------------------ 3. build
step "3. buildah bud --isolation chroot --format docker"
BUD=(buildah bud --isolation chroot --layers --pull=never "${ULIMITS[@]}" -f docker/Dockerfile)
cd "$REPO" || abort "cd $REPO"
STEPLOG=build.log
if timed "${BUD[@]}" --format docker -t "$IMAGE" .; then
	pass "built $IMAGE (${ELAPSED}s, log build/image-check/log/build.log)"
else fail "buildah bud:"; tail_log "$LOG/build.log" 25; abort "no image"; fi
BUILD_SECONDS=$ELAPSED
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")
info "image size: $((size / 1000000)) MB ($size bytes)"
hc=$(buildah inspect --type image --format '{{if .Docker.Config.Healthcheck}}{{.Docker.Config.Healthcheck.Test}}{{end}}' "$IMAGE")
if [[ "$hc" == *--health* ]]; then pass "HEALTHCHECK in the docker-format image: $hc"
else fail "HEALTHCHECK missing from the docker-format image ('$hc')"; fi
# the OCI format (buildah's default) has no field for a HEALTHCHECK: the image committed again
# in it (same config, seconds instead of a second uncached build) has none
if ctr=$(buildah from --pull=never "$IMAGE" 2>"$LOG/oci.log") &&
   buildah commit --format oci "$ctr" "$IMAGE-oci" >>"$LOG/oci.log" 2>&1; then
	hc_oci=$(buildah inspect --type image --format '{{if .Docker.Config.Healthcheck}}{{.Docker.Config.Healthcheck.Test}}{{end}}' "$IMAGE-oci")
	if [ -z "$hc_oci" ]; then pass "the same image in --format oci has no HEALTHCHECK, as documented"
	else fail "--format oci kept a HEALTHCHECK ($hc_oci): the documented caveat is wrong"; fi
	buildah rm "$ctr" >/dev/null 2>&1; buildah rmi "$IMAGE-oci" >/dev/null 2>&1
else fail "buildah from / commit --format oci:"; tail_log "$LOG/oci.log"; fi
# binary sizes: the build stage's (cached layers) before and after strip
STEPLOG=build-stage.log
if timed "${BUD[@]}" --format docker --target build -t "$IMAGE-build" .; then
	sizes=$("${PODMAN[@]}" run --rm "${ULIMITS[@]}" --network none --entrypoint /usr/bin/stat "$IMAGE-build" \
		-c '%n %s' /src/build/retrygate /src/build/stripped/retrygate 2>>"$LOG/podman.log")
	bsize=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE-build")
	info "build stage: $((bsize / 1000000)) MB; binaries: $(echo "$sizes" | tr '\n' ' ')"
	buildah rmi "$IMAGE-build" >/dev/null 2>&1
fi
in_image=$("${PODMAN[@]}" run --rm "${ULIMITS[@]}" --network none --entrypoint /usr/bin/stat "$IMAGE" -c %s /usr/local/bin/retrygate 2>>"$LOG/podman.log")
info "binary in the image: $in_image bytes"
if out=$("${PODMAN[@]}" run --rm "${ULIMITS[@]}" --network none "$IMAGE" --version 2>>"$LOG/podman.log"); then
	pass "podman run $IMAGE --version -> $out"
else fail "podman run --version: $out"; abort "the image does not run"; fi

# ------------------------------------------------------------ 4. run it
step "4. podman run --network host, in front of tests/tools/upstream.py"
free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
if [ "$(status_of "http://127.0.0.1:$ADMIN_PORT/ready")" != 000 ]; then
	abort "127.0.0.1:$ADMIN_PORT is taken on the host: the HEALTHCHECK asks that port (stop make run?)"
fi
PORT=$(free_port); UPORT=$(free_port)
/usr/bin/python3 "$REPO/tests/tools/upstream.py" --listen "127.0.0.1:$UPORT" --flaky /flaky --quiet &
UP_PID=$!
CONF=$WORK/conf
mkdir -p "$CONF"; chmod 755 "$CONF"
write_conf() { # MAX_ATTEMPTS
	cat >"$CONF/retrygate.yaml" <<-EOF
	admin:
	  listen: "127.0.0.1:$ADMIN_PORT"
	workers: 2
	drain_timeout: 5s
	listeners:
	  - name: egress
	    listen: "127.0.0.1:$PORT"
	    routes:
	      - upstream: demo
	upstreams:
	  demo:
	    endpoints: ["127.0.0.1:$UPORT"]
	    retry:
	      max_attempts: $1
	      backoff: { base: 5ms, max: 20ms }
	EOF
	chmod 644 "$CONF/retrygate.yaml"
}
write_conf 3
if cid=$("${PODMAN[@]}" run -d --name "$NAME" --network host "${ULIMITS[@]}" \
	-v "$CONF:/etc/retrygate:ro" "$IMAGE" 2>"$LOG/run.log"); then
	pass "podman run -d --network host: container ${cid:0:12}"
else
	fail "podman run --network host:"; tail_log "$LOG/run.log"
	abort "the container does not start"
fi
t0=$SECONDS; st=000
while [ $((SECONDS - t0)) -lt 20 ]; do
	st=$(status_of "http://127.0.0.1:$ADMIN_PORT/ready"); [ "$st" = 200 ] && break; sleep 0.3
done
if [ "$st" = 200 ]; then pass "GET /ready -> 200 ($((SECONDS - t0))s after start)"
else fail "GET /ready -> $st after 20s; container log:"; "${PODMAN[@]}" logs "$NAME" 2>&1 | tail -n 15 | sed 's/^/      | /'; abort "not ready"; fi
if out=$("${PODMAN[@]}" healthcheck run "$NAME" 2>&1); then pass "podman healthcheck run (the image's HEALTHCHECK) -> ${out:-healthy}"
else fail "podman healthcheck run: $out"; fi
a=$(header_of "http://127.0.0.1:$PORT/hello" X-Retrygate-Attempts)
s=$(status_of "http://127.0.0.1:$PORT/hello")
[ "$s" = 200 ] && [ "$a" = 1 ] && pass "proxied GET /hello -> 200, X-Retrygate-Attempts: $a" \
	|| fail "proxied GET /hello -> $s, X-Retrygate-Attempts '$a'"
a=$(header_of "http://127.0.0.1:$PORT/flaky/x" X-Retrygate-Attempts)
[ "$a" = 2 ] && pass "proxied GET /flaky/x -> retried, X-Retrygate-Attempts: $a" \
	|| fail "proxied GET /flaky/x: X-Retrygate-Attempts '$a' (want 2)"

write_conf 2
"${PODMAN[@]}" kill --signal HUP "$NAME" >/dev/null
t0=$SECONDS; got=
while [ $((SECONDS - t0)) -lt 10 ]; do
	got=$(http_get "http://127.0.0.1:$ADMIN_PORT/config" | grep -o '"max_attempts": *[0-9]*' | head -n 1)
	[[ "$got" == *2 ]] && break; sleep 0.3
done
if [[ "$got" == *2 ]] && "${PODMAN[@]}" logs "$NAME" 2>&1 | grep -q "reloaded"; then
	pass "SIGHUP: reloaded, /config shows $got"
else fail "SIGHUP: /config shows '$got' (want max_attempts 2)"; "${PODMAN[@]}" logs "$NAME" 2>&1 | tail -n 5 | sed 's/^/      | /'; fi
[ "$(status_of "http://127.0.0.1:$PORT/hello")" = 200 ] && pass "serves after the reload" || fail "no answer after the reload"

t0=$SECONDS
"${PODMAN[@]}" stop -t 20 "$NAME" >/dev/null 2>&1
code=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$NAME" 2>&1)
if [ "$code" = 0 ] && "${PODMAN[@]}" logs "$NAME" 2>&1 | tail -n 1 | grep -q stopped; then
	pass "podman stop (SIGTERM): exit 0 after $((SECONDS - t0))s, last log line: $("${PODMAN[@]}" logs "$NAME" 2>&1 | tail -n 1)"
else fail "podman stop: exit code '$code'"; "${PODMAN[@]}" logs "$NAME" 2>&1 | tail -n 5 | sed 's/^/      | /'; fi
"${PODMAN[@]}" logs "$NAME" >"$LOG/container.log" 2>&1

printf '\nfigures: build %ss, image %s MB, binary in the image %s bytes\n' \
	"$BUILD_SECONDS" "$((size / 1000000))" "$in_image"
finish
