#!/usr/bin/env bash
# tests/tools/check-docker.sh — verify docker/ where there is a Docker client but no engine.
#
#   tests/tools/check-docker.sh [--no-example]        (as root: apt-get, chroot, unshare)
#
# Nothing here builds or runs an image. Instead, each line printed is one check, PASS / FAIL /
# SKIP, and the exit status is 1 if any check failed:
#
#  1. docker/Dockerfile: build stage on debian:bookworm, runtime stage on debian:bookworm-slim
#     and last (the default target), non-root numeric USER, EXPOSE, HEALTHCHECK running
#     `retrygate --health http://127.0.0.1:9901/ready`, STOPSIGNAL SIGTERM, and a CMD that
#     reads /etc/retrygate/retrygate.yaml.
#  2. The build stage replayed: its WORKDIR / ENV / COPY / RUN steps, read from the Dockerfile
#     (not copied from it), run in order on this machine (Debian 12, like the stage's base) in
#     a scratch tree, build/docker-check/: the Docker context is the repository's files as git
#     sees them (`git ls-files -co --exclude-standard`, so never build/), the stage's WORKDIR
#     maps to build/docker-check/build-stage/WORKDIR. `make deps` needs deb.debian.org.
#  3. The runtime stage's needs: every package its `apt-get install` names exists in Debian 12
#     (apt-cache policy); `ldd` of the binary the replay built lists only libraries that
#     `dpkg -S` maps to those packages or to libc6 (part of debian:bookworm-slim).
#  4. A root directory holding only the files of those packages and of libc6 (`dpkg -L`), the
#     binary where the runtime stage's COPY puts it, and the config: in it (chroot, as the
#     image's USER) ENTRYPOINT --version and --check of every docker/conf/*.yaml; then, in a
#     private network namespace, ENTRYPOINT + CMD serve docker/conf/retrygate.yaml, the
#     HEALTHCHECK command exits 0, /metrics passes `promtool check metrics`, and STOPSIGNAL
#     makes it exit 0 within compose's stop_grace_period.
#  5. docker/compose.yaml: `docker-compose config` parses it, its build targets are stages of
#     the Dockerfile, its bind-mounted files exist, the Prometheus targets match the sidecar's
#     admin port; `promtool check config docker/prometheus.yml`.
#  6. Unless --no-example: the compose example's own programs (the app, the flaky payments
#     dependency, the client; their commands read from compose.yaml, run from the files the
#     Dockerfile's tools stage copies) run with the sidecar of step 4 in that namespace, with an
#     /etc/hosts naming app and payments as Docker's DNS would, and a short outage in the
#     dependency's timeline. Checked on the sidecar's /metrics: requests crossed the ingress
#     and the egress, the egress retried during the outage, the ingress stored idempotent
#     results. The one change to a program: payments binds 127.0.0.2 instead of 0.0.0.0, as the
#     app's 127.0.0.1:8080 shares this one namespace.

# shellcheck disable=SC2015,SC2317,SC1091,SC2012,SC2030,SC2031  # pass()/fail() return 0; a subshell counts its own fails
set -uo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SELF")/../.." && pwd)
DOCKERFILE=$REPO/docker/Dockerfile
COMPOSE=$REPO/docker/compose.yaml
PROMCONF=$REPO/docker/prometheus.yml
WORK=$REPO/build/docker-check
BASE_PKGS="libc6"        # in debian:bookworm-slim (Priority: required); checked below
EXAMPLE=1
[ "${1:-}" = "--no-example" ] && EXAMPLE=0

CHECK_NAME=check-docker
# shellcheck source=tests/tools/checklib.sh
. "$(dirname "$SELF")/checklib.sh"

# ============================================================ the part run inside unshare -n -m
# Invoked as: check-docker.sh --in-netns (environment from the outer run). Prints PASS/FAIL
# lines; exits with the number of failures.
if [ "${1:-}" = "--in-netns" ]; then
	pids=()
	cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
	trap cleanup EXIT
	ip link set lo up || { fail "lo up in the private network namespace"; exit "$fails"; }
	ip addr add 127.0.0.2/8 dev lo 2>/dev/null || true
	mount --bind "$NS_HOSTS" /etc/hosts || { fail "bind-mount /etc/hosts in the namespace"; exit "$fails"; }
	fetch() { # URL -> body on stdout; exit 1 unless 2xx
		/usr/bin/python3 -c 'import sys, urllib.request
try:
    sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode())
except Exception as e:
    sys.stderr.write("%s: %s\n" % (sys.argv[1], e)); sys.exit(1)' "$1"
	}
	metric() { # NAME{labels} -> value (0 if absent)
		awk -v k="$1" '$1 == k { print $2 + 0; found = 1 } END { if (!found) print 0 }' "$NS_OUT/metrics.txt"
	}

	if [ "$NS_EXAMPLE" = 1 ]; then
		(cd "$NS_TOOLS_DIR" && exec env FLAKY_PHASES="$NS_PHASES" /usr/bin/python3 -c "$(cat "$NS_OUT/payments.py")") \
			>"$NS_OUT/payments.log" 2>&1 & pids+=($!)
		(cd "$NS_TOOLS_DIR" && exec /usr/bin/python3 -c "$(cat "$NS_OUT/app.py")") >"$NS_OUT/app.log" 2>&1 & pids+=($!)
	fi

	# The image's ENTRYPOINT + CMD, as its USER, on nothing but the runtime packages' files.
	# shellcheck disable=SC2086  # NS_RUN_CMD is a list of words made by the outer run
	chroot --userspec="$NS_USER" "$NS_ROOT" $NS_RUN_CMD >"$NS_OUT/sidecar.log" 2>&1 &
	sidecar=$!; pids+=("$sidecar")
	ok=0
	for _ in $(seq 50); do
		# shellcheck disable=SC2086
		if chroot --userspec="$NS_USER" "$NS_ROOT" $NS_HEALTH_CMD >/dev/null 2>&1; then ok=1; break; fi
		kill -0 "$sidecar" 2>/dev/null || break
		sleep 0.2
	done
	if [ $ok = 1 ]; then pass "HEALTHCHECK command exits 0 in the root of the runtime packages: $NS_HEALTH_CMD"
	else fail "HEALTHCHECK never exited 0 within 10 s; sidecar log:"; sed 's/^/      | /' "$NS_OUT/sidecar.log" | tail -20
		exit "$fails"; fi

	if [ "$NS_EXAMPLE" = 1 ]; then
		(cd "$NS_TOOLS_DIR" && exec /usr/bin/python3 -c "$(cat "$NS_OUT/client.py")") >"$NS_OUT/client.log" 2>&1 &
		client=$!; pids+=("$client")
		sleep "$NS_EXAMPLE_SECONDS"
		kill "$client" 2>/dev/null; wait "$client" 2>/dev/null
	fi

	# Prometheus's target, by the name compose gives it (app:9901 -> this namespace's loopback).
	if fetch "http://$NS_SCRAPE_TARGET/metrics" >"$NS_OUT/metrics.txt"; then
		if promtool check metrics <"$NS_OUT/metrics.txt" >"$NS_OUT/promtool-metrics.txt" 2>&1; then
			pass "GET http://$NS_SCRAPE_TARGET/metrics (the Prometheus target): 200, promtool check metrics ok"
		else fail "promtool check metrics on /metrics:"; sed 's/^/      | /' "$NS_OUT/promtool-metrics.txt" | head; fi
	else fail "GET http://$NS_SCRAPE_TARGET/metrics (the Prometheus target)"; fi

	if [ "$NS_EXAMPLE" = 1 ]; then
		ing2=$(metric 'retrygate_upstream_responses_total{upstream="app",code="2xx"}')
		req=$(metric 'retrygate_upstream_requests_total{upstream="payments"}')
		att=$(metric 'retrygate_upstream_attempts_total{upstream="payments"}')
		ret=$(metric 'retrygate_upstream_retries_total{upstream="payments"}')
		stored=$(metric 'retrygate_idempotency_total{upstream="app",result="stored"}')
		replayed=$(metric 'retrygate_idempotency_total{upstream="app",result="replayed"}')
		info "after ${NS_EXAMPLE_SECONDS}s of the client, phases $NS_PHASES: ingress->app 2xx $ing2;" \
		     "egress->payments requests $req, attempts $att, retries $ret; idempotency stored $stored, replayed $replayed"
		info "client's last counts: $(tail -n 1 "$NS_OUT/client.log" 2>/dev/null)"
		[ "$ing2" -gt 0 ] && pass "example: the app answered 2xx through the ingress listener ($ing2)" \
			|| fail "example: no 2xx from the app through the ingress (logs in $NS_OUT)"
		[ "$req" -gt 0 ] && pass "example: the app reached payments through the egress listener ($req requests)" \
			|| fail "example: no request reached payments through the egress (logs in $NS_OUT)"
		[ "$ret" -gt 0 ] && [ "$att" -gt "$req" ] && pass "example: the egress retried during the outage ($att attempts for $req requests)" \
			|| fail "example: no retry to payments during its outage"
		[ "$stored" -gt 0 ] && pass "example: the ingress stored idempotent results ($stored stored, $replayed replayed)" \
			|| fail "example: the ingress stored no idempotent result"
	fi

	# STOPSIGNAL: drain, exit 0, sooner than the stop grace period (then Docker sends SIGKILL).
	t0=$(date +%s.%N)
	kill -s "$NS_STOPSIGNAL" "$sidecar"
	rc=
	for _ in $(seq $((NS_GRACE * 10))); do
		kill -0 "$sidecar" 2>/dev/null || { wait "$sidecar"; rc=$?; break; }
		sleep 0.1
	done
	took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
	if [ "$rc" = 0 ]; then pass "STOPSIGNAL $NS_STOPSIGNAL: the sidecar drained and exited 0 in ${took}s (grace ${NS_GRACE}s)"
	else fail "STOPSIGNAL $NS_STOPSIGNAL: exit status '${rc:-still running}' after ${took}s"; fi
	exit "$fails"
fi

# ============================================================ outer run
[ "$(id -u)" = 0 ] || { echo "check-docker: run as root (apt-get, chroot, unshare)"; exit 1; }
for t in python3 git dpkg apt-cache ldd chroot unshare ip awk; do
	command -v "$t" >/dev/null || { echo "check-docker: $t is missing"; exit 1; }
done
cd "$REPO" || exit 1
rm -rf "$WORK"
mkdir -p "$WORK/log" "$WORK/example"
echo "check-docker: $DOCKERFILE, $COMPOSE, $PROMCONF; scratch tree $WORK"

# ------------------------------------------------------------ parse the Dockerfile
# Logical lines (continuations joined, comments and blank lines dropped), one per line.
awk '
	function out() { if (cur != "") print cur; cur = "" }
	{
		line = $0; sub(/\r$/, "", line)
		t = line; sub(/^[ \t]+/, "", t)
		if (t == "" || t ~ /^#/) next
		if (!cont) line = t
		if (line ~ /\\[ \t]*$/) { sub(/\\[ \t]*$/, "", line); cur = cur line; cont = 1; next }
		cur = cur line; cont = 0; out()
	}
	END { out() }' "$DOCKERFILE" >"$WORK/Dockerfile.lines"

stage_names=(); stage_images=()
declare -A stage_of_line
n=0; cur=-1
while IFS= read -r line; do
	kw=${line%% *}; kw=${kw^^}
	if [ "$kw" = FROM ]; then
		read -r _ img as name _ <<<"$line"
		cur=${#stage_names[@]}
		stage_images+=("$img")
		if [ "${as^^}" = AS ]; then stage_names+=("$name"); else stage_names+=("$cur"); fi
	fi
	stage_of_line[$n]=$cur; n=$((n + 1))
done <"$WORK/Dockerfile.lines"
mapfile -t LINES <"$WORK/Dockerfile.lines"

stage_index() { local i; for i in "${!stage_names[@]}"; do [ "${stage_names[$i]}" = "$1" ] && { echo "$i"; return 0; }; done; return 1; }
stage_lines() { # INDEX -> the stage's instructions (FROM excluded)
	local i
	for i in "${!LINES[@]}"; do
		[ "${stage_of_line[$i]}" = "$1" ] || continue
		[ "${LINES[$i]%% *}" = FROM ] && continue
		printf '%s\n' "${LINES[$i]}"
	done
}
args_of() { local l=$1; l=${l#* }; printf '%s' "${l#"${l%%[![:space:]]*}"}"; }
json_words() { # a JSON array (exec form) -> its words joined by spaces, or nothing
	python3 -c 'import json, sys
try:
    v = json.loads(sys.argv[1])
    assert isinstance(v, list) and all(isinstance(x, str) and " " not in x for x in v)
    print(" ".join(v))
except Exception:
    sys.exit(1)' "$1"
}

# ------------------------------------------------------------ 1. Dockerfile shape
step "1. docker/Dockerfile"
info "stages: $(for i in "${!stage_names[@]}"; do printf '%s=%s ' "${stage_names[$i]}" "${stage_images[$i]}"; done)"
B=$(stage_index build) || abort "no stage named 'build'"
R=$(stage_index runtime) || abort "no stage named 'runtime'"
[ "${stage_images[$B]}" = debian:bookworm ] && pass "build stage FROM debian:bookworm" || fail "build stage FROM ${stage_images[$B]} (want debian:bookworm)"
[ "${stage_images[$R]}" = debian:bookworm-slim ] && pass "runtime stage FROM debian:bookworm-slim" || fail "runtime stage FROM ${stage_images[$R]} (want debian:bookworm-slim)"
[ "$R" = $((${#stage_names[@]} - 1)) ] && pass "runtime is the last stage (what a plain 'docker build' produces)" || fail "runtime is not the last stage"

RT=$(stage_lines "$R")
last_of() { printf '%s\n' "$RT" | awk -v k="$1" 'toupper($1) == k { l = $0 } END { print l }'; }
user=$(args_of "$(last_of USER)")
uid=${user%%:*}
if [ -z "$user" ]; then fail "runtime stage has no USER (it would run as root)"
elif ! [[ "$user" =~ ^[0-9]+(:[0-9]+)?$ ]]; then fail "USER $user: use a numeric uid[:gid]"
elif [ "$uid" = 0 ]; then fail "USER $user is root"
else pass "USER $user (non-root, numeric)"; fi
[ "${user#*:}" != "$user" ] || user="$user:$user"
expose=$(args_of "$(last_of EXPOSE)")
[ -n "$expose" ] && pass "EXPOSE $expose" || fail "no EXPOSE"
stopsig=$(args_of "$(last_of STOPSIGNAL)")
[ "$stopsig" = SIGTERM ] && pass "STOPSIGNAL SIGTERM" || fail "STOPSIGNAL '$stopsig' (want SIGTERM)"
hc=$(args_of "$(last_of HEALTHCHECK)")
hc_cmd=$(json_words "${hc#*CMD }")
[ "$hc_cmd" = "/usr/local/bin/retrygate --health http://127.0.0.1:9901/ready" ] \
	&& pass "HEALTHCHECK ${hc%%CMD *}CMD $hc_cmd" || fail "HEALTHCHECK is '$hc' (want exec form of retrygate --health http://127.0.0.1:9901/ready)"
entry=$(json_words "$(args_of "$(last_of ENTRYPOINT)")")
cmd=$(json_words "$(args_of "$(last_of CMD)")")
[ -n "$entry" ] && pass "ENTRYPOINT $entry" || fail "no exec-form ENTRYPOINT"
[ "$cmd" = "-c /etc/retrygate/retrygate.yaml" ] && pass "CMD $cmd" || fail "CMD '$cmd' (want -c /etc/retrygate/retrygate.yaml)"

# ------------------------------------------------------------ 2. replay the build stage
step "2. build stage replayed (${stage_images[$B]} steps on $(. /etc/os-release && echo "$PRETTY_NAME"))"
grep -q '^VERSION_ID="12"' /etc/os-release && pass "this machine is Debian 12, as debian:bookworm" \
	|| fail "this machine is not Debian 12: the replay does not stand for the build stage"
CTX=$WORK/context
mkdir -p "$CTX"
git -C "$REPO" ls-files -z -co --exclude-standard \
	| (cd "$REPO" && tar --null -T - --ignore-failed-read -cf - 2>/dev/null) \
	| tar -xf - -C "$CTX"                           # (files deleted in the work tree: skipped)
info "context: $(find "$CTX" -type f | wc -l) files from git ls-files -co --exclude-standard -> $CTX"

copy_step() { # ROOT WD "ARGS" : Docker COPY semantics for the forms used here
	local root=$1 wd=$2 args=$3 words dst src n
	read -r -a words <<<"$args"
	for w in "${words[@]}"; do [[ "$w" == --* ]] && { fail "COPY option $w is not replayed"; return 1; }; done
	n=${#words[@]}; dst=${words[$((n - 1))]}
	[[ "$dst" = /* ]] && dst=$root$dst || dst=$wd/$dst
	for src in "${words[@]:0:$((n - 1))}"; do
		[ -e "$CTX/$src" ] || { fail "COPY $src: not in the context"; return 1; }
		if [ -d "$CTX/$src" ]; then mkdir -p "$dst" && cp -a "$CTX/$src/." "$dst/"
		elif [ "$n" -gt 2 ] || [[ "$dst" == */ ]] || [ -d "$dst" ]; then mkdir -p "$dst" && cp -a "$CTX/$src" "$dst/"
		else mkdir -p "$(dirname "$dst")" && cp -a "$CTX/$src" "$dst"; fi
	done
}

replay_stage() { # INDEX ROOT [run] : WORKDIR/ENV/COPY (and RUN if asked); sets STAGE_WD
	local idx=$1 root=$2 run=${3:-} wd=$2 k a i=0 t0 rc
	while IFS= read -r l; do
		k=${l%% *}; k=${k^^}; a=$(args_of "$l")
		case $k in
		WORKDIR) if [[ "$a" = /* ]]; then wd=$root$a; else wd=$wd/$a; fi; mkdir -p "$wd" ;;
		ENV) [ -n "$run" ] && eval "export $a" ;;
		COPY) [[ "$a" == --from=* ]] && continue
		      copy_step "$root" "$wd" "$a" && info "COPY $a" || return 1 ;;
		RUN) [ -n "$run" ] || continue
		     [[ "$a" == \[* ]] && { fail "RUN exec form is not replayed: $a"; return 1; }
		     i=$((i + 1)); t0=$(date +%s)
		     (cd "$wd" && /bin/sh -c "$a") >"$WORK/log/run-$i.log" 2>&1; rc=$?
		     if [ $rc = 0 ]; then pass "RUN $a   ($(($(date +%s) - t0))s, log build/docker-check/log/run-$i.log)"
		     else fail "RUN $a   (exit $rc); last lines of build/docker-check/log/run-$i.log:"
		          tail -n 15 "$WORK/log/run-$i.log" | sed 's/^/      | /'; return 1; fi ;;
		USER|LABEL|EXPOSE|STOPSIGNAL|HEALTHCHECK|ENTRYPOINT|CMD) ;;
		*) [ -n "$run" ] && { fail "$k in the build stage is not replayed by this script"; return 1; } ;;
		esac
	done < <(stage_lines "$idx")
	STAGE_WD=$wd
}
BROOT=$WORK/build-stage
mkdir -p "$BROOT"
( fails=0; replay_stage "$B" "$BROOT" run || exit 1; exit "$fails" ) || abort "the build stage's steps did not all succeed"

# The runtime stage's COPY --from=build: the binary it takes.
copy_from=$(printf '%s\n' "$RT" | awk 'toupper($1) == "COPY" && $2 ~ /^--from=/ { print; exit }')
read -r _ from_opt bin_src bin_dst _ <<<"$copy_from"
[ "${from_opt#--from=}" = build ] || abort "runtime stage has no COPY --from=build"
BIN=$BROOT$bin_src
[ -x "$BIN" ] && pass "the runtime stage's COPY --from=build $bin_src: built ($(stat -c %s "$BIN") bytes, $("$BIN" --version))" \
	|| abort "COPY --from=build $bin_src: no such file after the build stage"
[ "$bin_dst" = "${entry%% *}" ] && pass "ENTRYPOINT runs the copied binary ($bin_dst)" || fail "COPY puts the binary at $bin_dst, ENTRYPOINT runs ${entry%% *}"

# ------------------------------------------------------------ 3. runtime packages vs ldd
step "3. runtime packages vs ldd of the built binary"
PKGS=$(printf '%s\n' "$RT" | awk 'toupper($1) == "RUN" {
	for (i = 2; i <= NF; i++) {
		if ($i == "apt-get" && $(i + 1) == "install") { on = 1; i++; continue }
		if ($i == "&&" || $i == ";" || $i == "|" || $i == "||") on = 0
		else if (on && $i !~ /^-/) { sub(/=.*/, "", $i); print $i }
	} }' | sort -u | tr '\n' ' ')
PKGS=${PKGS% }
[ -n "$PKGS" ] && info "runtime stage installs: $PKGS" || abort "the runtime stage installs no package"
declare -A CAND INST
# shellcheck disable=SC2086
while read -r p c; do CAND[$p]=$c; done < <(apt-cache policy $PKGS $BASE_PKGS 2>/dev/null \
	| awk '/^[^ ].*:$/ { p = substr($0, 1, length($0) - 1) } /^  Candidate:/ { print p, $2 }')
# shellcheck disable=SC2086
while read -r p v; do INST[$p]=$v; done < <(dpkg-query -W -f '${Package} ${Version}\n' $PKGS $BASE_PKGS 2>/dev/null)
for p in $PKGS $BASE_PKGS; do
	c=${CAND[$p]:-}
	if [ -z "$c" ] || [ "$c" = "(none)" ]; then fail "package $p: not in this machine's Debian 12 archive (apt-cache policy)"; continue; fi
	v=${INST[$p]:-}
	if [ -z "$v" ]; then fail "package $p (candidate $c) exists but is not installed here: the later checks need its files"; continue; fi
	pass "package $p: candidate $c, installed $v"
done
# libc6 is in every Debian image: the Essential package dpkg pre-depends on it.
dpkg_rec=$(apt-cache show dpkg 2>/dev/null)
ess=$(printf '%s\n' "$dpkg_rec" | awk '/^Essential:/ { print $2; exit }')
pre=$(printf '%s\n' "$dpkg_rec" | awk '/^Pre-Depends:/ { print; exit }')
[ "$ess" = yes ] && [[ "$pre" == *"libc6 "* ]] && pass "libc6 is in debian:bookworm-slim: the Essential package dpkg has $pre" \
	|| fail "cannot show that libc6 is in the base image (dpkg Essential '$ess', $pre)"

env -u LD_LIBRARY_PATH -u LD_PRELOAD ldd "$BIN" >"$WORK/ldd.txt" 2>&1 || abort "ldd $BIN failed: $(cat "$WORK/ldd.txt")"
# A library's package by dpkg -S, one call for all (merged /usr: the path as ldd shows it, as
# resolved, and with or without /usr).
candidates() { local r; r=$(readlink -f "$1"); printf '%s\n' "$1" "$r" "${1#/usr}" "/usr$1" "${r#/usr}"; }
mapfile -t all_cands < <(awk '/=> \// { print $3 } /^[ \t]*\// { print $1 }' "$WORK/ldd.txt" \
	| while IFS= read -r f; do candidates "$f"; done | sort -u)
declare -A OWNER
while IFS= read -r o; do
	[[ "$o" == *": /"* ]] || continue
	pk=${o%%: /*}; OWNER[/${o#*: /}]=${pk%%:*}
done < <(dpkg -S "${all_cands[@]}" 2>/dev/null)
owner_of() { local c; while IFS= read -r c; do [ -n "${OWNER[$c]:-}" ] && { echo "${OWNER[$c]}"; return 0; }; done < <(candidates "$1"); return 1; }
while IFS= read -r l; do
	l=$(echo "$l" | sed 's/^[[:space:]]*//; s/ (0x[0-9a-f]*)$//')
	case $l in
	linux-vdso.so.*|linux-gate.so.*) continue ;;
	*"not found"*) fail "ldd: $l"; continue ;;
	*" => "*) name=${l%% => *}; path=${l#* => } ;;
	*) name=$l; path=$l ;;
	esac
	if ! pkg=$(owner_of "$path"); then fail "ldd: $name => $path belongs to no package (dpkg -S)"; continue; fi
	if [[ " $PKGS $BASE_PKGS " == *" $pkg "* ]]; then pass "ldd: $name => $path  ($pkg)"
	else fail "ldd: $name => $path is from $pkg, which the runtime stage does not install"; fi
done <"$WORK/ldd.txt"

# ------------------------------------------------------------ 4. root of the runtime packages
step "4. the binary on the runtime packages' files alone (chroot, USER $user)"
ROOT=$WORK/rootfs
mkdir -p "$ROOT/usr/bin" "$ROOT/usr/sbin" "$ROOT/usr/lib" "$ROOT/usr/lib64" "$ROOT/etc" "$ROOT/tmp"
for d in bin sbin lib lib64; do [ -L "/$d" ] && ln -s "usr/$d" "$ROOT/$d"; done   # merged /usr, as bookworm
chmod 1777 "$ROOT/tmp"
# shellcheck disable=SC2086
dpkg -L $PKGS $BASE_PKGS 2>/dev/null | sort -u | while IFS= read -r f; do
	case $f in /bin|/sbin|/lib|/lib64|/lib32|/libx32) continue ;; esac   # the links made above
	[ -d "$f" ] && [ ! -L "$f" ] && continue
	[ -e "$f" ] || [ -L "$f" ] || continue
	printf '%s\0' "${f#/}"
done >"$WORK/rootfs.files"
nfiles=$(tr -cd '\0' <"$WORK/rootfs.files" | wc -c)
# From /, with relative paths: cp --parents then gives the directories it makes their modes.
(cd / && xargs -0 -r cp -a --parents -t "$ROOT" <"$WORK/rootfs.files") || fail "copying the packages' files into $ROOT"
install -D -m 0755 "$BIN" "$ROOT$bin_dst"
printf 'root:x:0:0:root:/root:/bin/sh\nretrygate:x:%s:%s::/nonexistent:/usr/sbin/nologin\n' "${user%%:*}" "${user#*:}" >"$ROOT/etc/passwd"
printf 'root:x:0:\nretrygate:x:%s:\n' "${user#*:}" >"$ROOT/etc/group"
mkdir -p "$ROOT/etc/retrygate" "$ROOT/var/log/retrygate"
chown "$user" "$ROOT/var/log/retrygate"
info "$ROOT: $nfiles files of $PKGS $BASE_PKGS, and $bin_dst"
run_in_root() { chroot --userspec="$user" "$ROOT" "$@"; }
if out=$(run_in_root "$bin_dst" --version 2>&1); then pass "chroot: $bin_dst --version -> $out"
else fail "chroot: $bin_dst --version: $out"; fi
confs=("$REPO"/docker/conf/*.yaml)
[ -e "${confs[0]}" ] || fail "no docker/conf/*.yaml"
for c in "${confs[@]}"; do
	[ -e "$c" ] || continue
	install -m 0644 "$c" "$ROOT/etc/retrygate/$(basename "$c")"
	if run_in_root "$bin_dst" -c "/etc/retrygate/$(basename "$c")" --check >"$WORK/log/check-$(basename "$c").txt" 2>&1; then
		pass "chroot: retrygate -c docker/conf/$(basename "$c") --check -> $(tail -n 1 "$WORK/log/check-$(basename "$c").txt")"
		grep -i '^warning' "$WORK/log/check-$(basename "$c").txt" | sed 's/^/      /'
	else fail "chroot: retrygate -c docker/conf/$(basename "$c") --check:"; sed 's/^/      | /' "$WORK/log/check-$(basename "$c").txt"; fi
done

# ------------------------------------------------------------ 5. compose file and prometheus.yml
step "5. docker/compose.yaml and docker/prometheus.yml"
if command -v docker-compose >/dev/null; then
	if docker-compose -f "$COMPOSE" config -q 2>"$WORK/log/compose.txt"; then pass "docker-compose -f docker/compose.yaml config ($(docker-compose version --short 2>/dev/null))"
	else fail "docker-compose config:"; sed 's/^/      | /' "$WORK/log/compose.txt"; fi
else skip "docker-compose not installed (apt-get install -y docker-compose)"; fi
if docker compose version >/dev/null 2>&1; then
	docker compose -f "$COMPOSE" config -q 2>"$WORK/log/compose2.txt" && pass "docker compose (v2) config" \
		|| { fail "docker compose (v2) config:"; sed 's/^/      | /' "$WORK/log/compose2.txt"; }
fi
if command -v promtool >/dev/null; then
	if promtool check config "$PROMCONF" >"$WORK/log/promtool.txt" 2>&1; then pass "promtool check config docker/prometheus.yml"
	else fail "promtool check config:"; sed 's/^/      | /' "$WORK/log/promtool.txt"; fi
else skip "promtool not installed (apt-get install -y prometheus)"; fi

# Facts from compose.yaml, prometheus.yml and the sidecar config (python3-yaml comes with
# docker-compose): consistency checks, and the example's programs for step 6.
if python3 -c 'import yaml' 2>/dev/null; then
	python3 - "$COMPOSE" "$PROMCONF" "$WORK/example" "${stage_names[*]}" >"$WORK/compose-facts.txt" <<-'EOF'
	import os, sys, yaml
	compose_path, prom_path, out, stages = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
	here = os.path.dirname(compose_path)
	c = yaml.safe_load(open(compose_path))
	svcs = c["services"]
	def say(kind, msg): print("%s\t%s" % (kind, msg))
	for name, s in svcs.items():
	    b = s.get("build")
	    if isinstance(b, dict) and "target" in b:
	        say("PASS" if b["target"] in stages else "FAIL", "compose %s: build target %s is a Dockerfile stage" % (name, b["target"]))
	    for v in s.get("volumes", []):
	        src = v.split(":")[0]
	        if src.startswith("."):
	            p = os.path.normpath(os.path.join(here, src))
	            say("PASS" if os.path.exists(p) else "FAIL", "compose %s: bind mount %s exists" % (name, src))
	    cmd = s.get("command")
	    if isinstance(cmd, list) and cmd[:2] == ["python3", "-c"]:
	        open(os.path.join(out, name + ".py"), "w").write(cmd[2])
	side = [n for n, s in svcs.items() if str(s.get("network_mode", "")).startswith("service:")]
	if not side:
	    say("FAIL", "compose: no sidecar (a service with network_mode: service:APP)"); sys.exit()
	sc = svcs[side[0]]; pod = sc["network_mode"].split(":", 1)[1]
	mount = [v for v in sc.get("volumes", []) if v.split(":")[1] == "/etc/retrygate/retrygate.yaml"]
	if not mount:
	    say("FAIL", "compose %s: nothing mounted at /etc/retrygate/retrygate.yaml" % side[0]); sys.exit()
	conf_path = os.path.normpath(os.path.join(here, mount[0].split(":")[0]))
	conf = yaml.safe_load(open(conf_path))
	admin = conf["admin"]["listen"]; port = admin.rsplit(":", 1)[1]
	say("PASS" if port == "9901" else "FAIL", "sidecar config: admin.listen %s is port 9901, which the HEALTHCHECK asks" % admin)
	targets = [t for sc_ in yaml.safe_load(open(prom_path))["scrape_configs"] if sc_["job_name"] != "prometheus"
	           for st in sc_.get("static_configs", []) for t in st["targets"]]
	for t in targets:
	    ok = t == "%s:%s" % (pod, port) and not admin.startswith("127.")
	    say("PASS" if ok else "FAIL", "prometheus target %s = the sidecar's admin (%s, in %s's network namespace)" % (t, admin, pod))
	grace = sc.get("stop_grace_period", "10s")
	say("FACT", "sidecar=%s pod=%s conf=%s target=%s grace=%s phases=%s" % (
	    side[0], pod, conf_path, targets[0] if targets else "", grace,
	    svcs.get("payments", {}).get("environment", {}).get("FLAKY_PHASES", "")))
	EOF
	while IFS=$'\t' read -r kind msg; do
		case $kind in PASS) pass "$msg" ;; FAIL) fail "$msg" ;; FACT) facts=$msg ;; esac
	done <"$WORK/compose-facts.txt"
else
	skip "python3-yaml missing: compose consistency checks and the example run"; EXAMPLE=0
fi
fact() { printf '%s\n' "${facts:-}" | tr ' ' '\n' | awk -F= -v k="$1" '$1 == k { print $2 }'; }
SIDECAR_CONF=$(fact conf); SIDECAR_CONF=${SIDECAR_CONF:-$REPO/docker/conf/retrygate.yaml}
SCRAPE=$(fact target); SCRAPE=${SCRAPE:-127.0.0.1:9901}
GRACE=$(fact grace); GRACE=${GRACE%s}; GRACE=${GRACE:-10}
POD=$(fact pod); POD=${POD:-app}

# ------------------------------------------------------------ 6. run it (namespace)
if [ "$EXAMPLE" = 1 ]; then
	step "6. the sidecar and the compose example's programs, in a private network namespace"
	for p in app payments client; do
		[ -s "$WORK/example/$p.py" ] || { fail "compose.yaml has no python3 -c command for $p"; EXAMPLE=0; }
	done
	# The tools stage, as its COPY steps lay it out.
	T=$(stage_index tools) || { fail "no 'tools' stage for the example"; EXAMPLE=0; }
	if [ "$EXAMPLE" = 1 ]; then
		TROOT=$WORK/tools-stage; mkdir -p "$TROOT"
		replay_stage "$T" "$TROOT" || EXAMPLE=0
		TOOLS_DIR=$STAGE_WD
		info "tools stage laid out in $TOOLS_DIR: $(cd "$TOOLS_DIR" && ls | tr '\n' ' ')"
	fi
	sed -i 's/host="0\.0\.0\.0"/host="127.0.0.2"/' "$WORK/example/payments.py"
else
	step "6. the sidecar alone, in a private network namespace (--no-example)"
fi
install -m 0644 "$SIDECAR_CONF" "$ROOT/etc/retrygate/retrygate.yaml"
printf '127.0.0.1 localhost %s\n127.0.0.2 payments\n' "$POD" >"$WORK/hosts"
cp "$WORK/hosts" "$ROOT/etc/hosts"
# As Docker writes it for a container on a compose network (its DNS server at 127.0.0.11).
# retrygate's resolver (evdns) reads /etc/hosts only when /etc/resolv.conf exists.
printf 'nameserver 127.0.0.11\noptions ndots:0\n' >"$ROOT/etc/resolv.conf"
NS_EXAMPLE_SECONDS=${CHECK_DOCKER_EXAMPLE_SECONDS:-11} \
NS_PHASES="healthy:2,outage:3,overloaded:2,recovered:60" \
NS_EXAMPLE=$EXAMPLE NS_HOSTS=$WORK/hosts NS_OUT=$WORK/example NS_TOOLS_DIR=${TOOLS_DIR:-/} NS_ROOT=$ROOT \
NS_USER=$user NS_RUN_CMD="$entry $cmd" NS_HEALTH_CMD="$hc_cmd" NS_SCRAPE_TARGET=$SCRAPE \
NS_STOPSIGNAL=${stopsig#SIG} NS_GRACE=$GRACE \
	unshare -n -m --propagation private /bin/bash "$SELF" --in-netns
ns_fails=$?
fails=$((fails + ns_fails))
info "logs: build/docker-check/example/*.log"

finish
