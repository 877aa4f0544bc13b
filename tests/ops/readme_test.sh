#!/usr/bin/env bash
# tests/ops/readme_test.sh REPO TPSERVE - runs every shell block of README.md as written.
#
# Each ```sh block runs from REPO with `bash -e -o pipefail`, `tpserve` resolving to TPSERVE (its
# folder first on PATH) and the quick start serving with TPSERVE (TPSERVE_BIN, see
# scripts/quickstart.sh); a block fails the test on any non-zero exit or after TP_README_BLOCK_S seconds (default 240).  The HTML
# comment right before a block says how to treat it:
#   <!-- not-run: REASON -->           not run (a second machine, a large download, the suite itself)
#   <!-- run: background port=P -->    starts a server: run in the background until the next such
#                                      block (or the end); the test waits for http://127.0.0.1:P/health
#                                      to answer 200 and fails if it does not within 30 s, or if
#                                      the server does not exit 0 (launch: 130) within 10 s of Ctrl-C
# Paths under /tmp/ in the blocks are moved to a private temporary folder, so runs cannot collide.
# Where unprivileged network namespaces work the whole run is in a fresh one (own loopback: the
# README's fixed port 8080 is free); elsewhere it skips (77) if port 8080 is already taken.
# Also checks that .ci/run executes exactly the README's test command.
set -uo pipefail
REPO=$(cd "$1" && pwd)
TPSERVE=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
README="$REPO/README.md"

if [ -z "${TP_README_NS:-}" ] && command -v unshare >/dev/null && command -v ip >/dev/null &&
   unshare -rn true 2>/dev/null; then
  TP_README_NS=1 exec unshare -rn "$0" "$@"
fi
if [ -n "${TP_README_NS:-}" ]; then
  ip link set lo up 2>/dev/null || { echo "FAIL: cannot bring up loopback in the namespace" >&2; exit 1; }
elif (exec 3<>/dev/tcp/127.0.0.1/8080) 2>/dev/null; then
  echo "SKIP: port 8080 is in use and no network namespace is available"; exit 77
fi
command -v curl >/dev/null || { echo "SKIP: curl not installed (README blocks use it)"; exit 77; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=""
export TPSERVE_BIN="$TPSERVE" PATH="$(dirname "$TPSERVE"):$PATH"
WORK=$(mktemp -d)
SPID=""
stop_server() {
  [ -n "$SPID" ] || return 0
  kill -INT -- "-$SPID" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$SPID" 2>/dev/null
  wait "$SPID" 2>/dev/null
  SRC=$?
  SPID=""
}
# Ctrl-C (SIGINT to the group) is how the README says a server stops: it must exit within 10 s with
# status 0, or 130 (128 + SIGINT), which `tpserve launch` returns after forwarding a Ctrl-C.
stop_checked() {
  [ -n "$SPID" ] || return 0
  stop_server
  [ "$SRC" = 0 ] || [ "$SRC" = 130 ] || { tail -20 "$WORK/server$SLINE.log" >&2; fail "README.md:$SLINE: server exited with status $SRC after Ctrl-C"; }
}
cleanup() { stop_server; rm -rf "$WORK"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Split README.md into $WORK/block<N>.sh plus one line per block in $WORK/index: N|LINE|ANNOTATION.
awk -v dir="$WORK" '
  /^<!-- (run|not-run):.*-->$/ { note = $0; sub(/^<!-- /, "", note); sub(/ -->$/, "", note); next }
  /^```(sh|bash)$/ && !inb { inb = 1; n++; f = dir "/block" n ".sh"; printf "" > f
                             printf "%d|%d|%s\n", n, NR, note > (dir "/index"); note = ""; next }
  /^```/ && inb { inb = 0; close(f); next }
  /^```/ { other = !other; note = ""; next }
  inb { print > f; next }
  /[^[:space:]]/ && !other { note = "" }
' "$README"
[ -s "$WORK/index" ] || fail "no shell blocks found in README.md"

# .ci/run must run exactly the README's test command.
ci_cmd=$(sed -n 's/^exec //p' "$REPO/.ci/run")
grep -q "^$ci_cmd\( \|$\)" "$WORK"/block*.sh || fail ".ci/run runs '$ci_cmd', not a command of README.md"
[ "$(grep -c '^<!-- not-run: it is the test suite' "$README")" -le 1 ] || fail "more than one block marked as the suite"

ran=0; skipped=0
while IFS='|' read -r n line note; do
  blk="$WORK/block$n.sh"
  sed -i "s#/tmp/#$WORK/tmp/#g" "$blk"
  mkdir -p "$WORK/tmp"
  case "$note" in
    not-run:*)
      echo "-- README.md:$line not run (${note#not-run: })"; skipped=$((skipped + 1)); continue ;;
    "run: background port="*)
      port=${note#run: background port=}
      stop_checked
      echo "-- README.md:$line background, waiting for :$port/health"
      (cd "$REPO" && exec setsid bash -e -o pipefail "$blk") </dev/null >"$WORK/server$line.log" 2>&1 &
      SPID=$! SLINE=$line
      up=0
      for _ in $(seq 300); do
        if ! kill -0 "$SPID" 2>/dev/null; then cat "$WORK/server$line.log" >&2; fail "README.md:$line exited early"; fi
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/health")
        [ "$code" = 200 ] && { up=1; break; }
        sleep 0.1
      done
      [ "$up" = 1 ] || { tail -20 "$WORK/server$line.log" >&2; fail "README.md:$line: no 200 from /health in 30 s"; }
      ;;
    "")
      t0=$(date +%s.%N)
      if ! (cd "$REPO" && timeout "${TP_README_BLOCK_S:-240}" bash -e -o pipefail "$blk") </dev/null >"$WORK/out$n" 2>&1; then
        tail -30 "$WORK/out$n" >&2; sed 's/^/   | /' "$blk" >&2
        fail "README.md:$line: the block above exited non-zero"
      fi
      echo "-- README.md:$line ($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }'))"
      tail -n 6 "$WORK/out$n" | sed 's/^/   | /'
      ;;
    *) fail "README.md:$line: unknown annotation '$note'" ;;
  esac
  ran=$((ran + 1))
done <"$WORK/index"
stop_checked
echo "ok - $ran README blocks ran, $skipped marked not-run"
