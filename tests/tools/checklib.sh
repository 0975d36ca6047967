# tests/tools/checklib.sh — the reporting shared by the check-*.sh scripts (sourced, not run).
#
# Each check prints one line, PASS / FAIL / SKIP; `finish` prints the time taken and exits 1
# if any check failed. Before sourcing, set CHECK_NAME (the prefix of the last line); a
# script that defines check_cleanup gets it called by finish first.

fails=0
pass() { printf 'PASS  %s\n' "$*"; }
fail() { printf 'FAIL  %s\n' "$*"; fails=$((fails + 1)); }
skip() { printf 'SKIP  %s\n' "$*"; }
info() { printf '      %s\n' "$*"; }
step() { printf '\n== %s   [%ss]\n' "$*" "$SECONDS"; }
finish() {
	if declare -F check_cleanup >/dev/null; then check_cleanup; fi
	printf '\n(%ss)\n' "$SECONDS"
	if [ "$fails" -eq 0 ]; then echo "$CHECK_NAME: all checks passed"; exit 0; fi
	echo "$CHECK_NAME: $fails check(s) FAILED"; exit 1
}
abort() { fail "$*"; info "(later checks depend on this one: stopping)"; finish; }
