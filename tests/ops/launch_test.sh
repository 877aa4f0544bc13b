#!/usr/bin/env bash
# tests/ops/launch_test.sh REPO TPSERVE - `tpserve launch --hostfile` (the ssh path) end to end.
#
# ssh is replaced by tests/ops/fake_ssh.sh (TP_LAUNCH_SSH), which takes the launcher's exact ssh
# arguments and runs the remote command with sh: inside the simulated host's network namespace when
# scripts/netsim works here (every rank on its own address, 10.77.8.x), else on 127.0.0.1.
#   1. dry run, environment and "[rank R HOST]" prefixes, exit statuses of the usual mistakes
#      (unreachable host 255, missing program 127, missing model 126), a failing rank stops the
#      others and its status is the launcher's, Ctrl-C (SIGINT) stops every rank;
#   2. 2 and 4 ranks of `tpserve serve` on the bundled model: /health answers and a greedy
#      /v1/completions equals the one-rank answer exactly; then one rank is killed (-9): the
#      launcher stops everything and exits non-zero within 10 s.
# TP_TEST_NO_NETNS=1 forces the 127.0.0.1 variant.
set -uo pipefail
REPO="$1"
TPSERVE="$2"
MODEL="$REPO/models/stories260K.gguf"
export TP_LAUNCH_SSH="$REPO/tests/ops/fake_ssh.sh"
export TP_NETSIM_PREFIX="tpl$$" TP_NETSIM_SUBNET="10.77.8"
WORK=$(mktemp -d)
LPID=""
cleanup() {
  [ -n "$LPID" ] && kill -9 "$LPID" 2>/dev/null
  [ -n "${NETSIM:-}" ] && "$REPO/scripts/netsim" down >/dev/null 2>&1
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [ -f "$WORK/log" ] && tail -20 "$WORK/log" >&2; exit 1; }
# expect STATUS CMD...: run with a 30 s cap, output in $WORK/out
expect() {
  local want="$1"; shift
  timeout 30 "$@" >"$WORK/out" 2>&1
  local got=$?
  [ "$got" -eq "$want" ] || { cat "$WORK/out" >&2; fail "'$*' exited $got, want $want"; }
}

# ---------------------------------------------------------- 1. mechanics ---
cat >"$WORK/hf2.json" <<EOF
{"version": 1, "hosts": [{"host": "alpha", "ips": ["127.0.0.1"], "port": 29611},
                         {"host": "beta", "ips": ["127.0.0.1"], "port": 29612}]}
EOF
expect 0 "$TPSERVE" launch --hostfile "$WORK/hf2.json" --dry-run -- tpserve serve -m "$MODEL"
[ "$(grep -c -- "-tt alpha .*TP_RANK=0 TP_WORLD_SIZE=2 TP_HOSTFILE='$WORK/hf2.json'" "$WORK/out")" -eq 1 ] &&
  grep -q -- "-tt beta .*TP_RANK=1 TP_WORLD_SIZE=2" "$WORK/out" || fail "dry run: $(cat "$WORK/out")"
expect 0 "$TPSERVE" launch --hostfile "$WORK/hf2.json" --backend mpi --dry-run -- tpserve serve -m "$MODEL"
grep -q "^mpirun -np 2 --host alpha,beta .*-x TP_BACKEND=mpi tpserve serve" "$WORK/out" || fail "mpi dry run: $(cat "$WORK/out")"

expect 0 "$TPSERVE" launch --hostfile "$WORK/hf2.json" -- sh -c 'echo "r$TP_RANK/$TP_WORLD_SIZE $TP_BACKEND"; echo e >&2'
grep -qx "\[rank 0 alpha\] r0/2 ring" "$WORK/out" && grep -qx "\[rank 1 beta\] r1/2 ring" "$WORK/out" &&
  grep -qx "\[rank 1 beta\] e" "$WORK/out" || fail "prefixes/environment: $(cat "$WORK/out")"

t0=$(date +%s)
expect 3 "$TPSERVE" launch --hostfile "$WORK/hf2.json" -- sh -c '[ $TP_RANK = 1 ] && { sleep 0.3; exit 3; }; exec sleep 60'
[ $(( $(date +%s) - t0 )) -lt 10 ] || fail "a failed rank did not stop the others within 10 s"
grep -q "rank 1 (beta) exited with status 3; stopping the other ranks" "$WORK/out" || fail "failure message"

expect 127 "$TPSERVE" launch --hostfile "$WORK/hf2.json" -- no-such-program-tp --x
grep -q "'no-such-program-tp' not found on" "$WORK/out" || fail "missing program message"
expect 126 "$TPSERVE" launch --hostfile "$WORK/hf2.json" -- "$TPSERVE" serve -m /nonexistent/model.gguf
grep -q "model '/nonexistent/model.gguf' is missing on" "$WORK/out" || fail "missing model message"
cat >"$WORK/hfbad.json" <<EOF
{"version": 1, "hosts": [{"host": "alpha", "ips": ["127.0.0.1"], "port": 29611},
                         {"host": "unreachable.invalid", "ips": ["10.255.255.1"], "port": 29612}]}
EOF
expect 255 "$TPSERVE" launch --hostfile "$WORK/hfbad.json" -- sleep 60
grep -q "ssh could not reach the host" "$WORK/out" || fail "unreachable host message"
expect 2 "$TPSERVE" launch --hostfile "$WORK/hf2.json" --backend carrier-pigeon -- true
expect 1 "$TPSERVE" launch --hostfile "$WORK/missing.json" -- true

# Ctrl-C: SIGINT to the launcher stops every rank
"$TPSERVE" launch --hostfile "$WORK/hf2.json" -- sh -c 'echo $$ > '"$WORK"'/pid.$TP_RANK; exec sleep 60' >"$WORK/log" 2>&1 &
LPID=$!
for _ in $(seq 100); do [ -f "$WORK/pid.0" ] && [ -f "$WORK/pid.1" ] && break; sleep 0.1; done
kill -INT "$LPID"
t0=$(date +%s)
wait "$LPID"; st=$?; LPID=""
[ "$st" -ne 0 ] && [ $(( $(date +%s) - t0 )) -lt 10 ] || fail "SIGINT: launcher exited $st"
for r in 0 1; do kill -0 "$(cat "$WORK/pid.$r")" 2>/dev/null && fail "rank $r survived SIGINT"; done
echo "ok: launcher mechanics"

# ------------------------------------------------- 2. tpserve serve, N ranks ---
[ -f "$MODEL" ] || { echo "SKIP: $MODEL missing (part 2)"; exit 77; }
if [ -z "${TP_TEST_NO_NETNS:-}" ] && "$REPO/scripts/netsim" check >/dev/null 2>&1 &&
   "$REPO/scripts/netsim" up 4 --profile 10gbe >/dev/null; then
  NETSIM=1
  export FAKE_SSH_NETNS_PREFIX="$TP_NETSIM_PREFIX"
  addr() { echo "10.77.8.$(( $1 + 1 ))"; }
  port_of() { echo 29500; }
  http() { ip netns exec "$TP_NETSIM_PREFIX-h0" curl -s -m 30 "$@"; }
  echo "ranks on simulated hosts 10.77.8.1-4 (10gbe)"
else
  addr() { echo 127.0.0.1; }
  port_of() { echo $(( 20000 + ($$ % 2000) * 5 + $1 )); }   # per-run ports: parallel ctest runs do not collide
  http() { curl -s -m 30 "$@"; }
  echo "network namespaces unavailable: ranks on 127.0.0.1"
fi

# start_serve N: launcher in the background, rank 0's HTTP address in $URL
start_serve() {
  local n=$1 i sep=""
  { printf '{"version": 1, "hosts": ['
    for ((i = 0; i < n; i++)); do
      printf '%s{"host": "%s", "ips": ["%s"], "port": %d}' "$sep" "$(addr $i)" "$(addr $i)" "$(port_of $i)"; sep=", "
    done
    printf ']}\n'; } >"$WORK/hf$n.json"
  "$TPSERVE" launch --hostfile "$WORK/hf$n.json" -- "$TPSERVE" serve -m "$MODEL" --host 0.0.0.0 --port 0 \
    --threads 1 >"$WORK/log" 2>&1 &
  LPID=$!
  URL=""
  for _ in $(seq 600); do
    local port
    port=$(sed -n 's/.*\[rank 0 .*listening on http:\/\/[0-9.]*:\([0-9]*\).*/\1/p' "$WORK/log" | head -1)
    if [ -n "$port" ] && http "http://$(addr 0):$port/health" 2>/dev/null | grep -q ok; then
      URL="http://$(addr 0):$port"; return 0
    fi
    kill -0 "$LPID" 2>/dev/null || fail "$n ranks: launcher exited before /health answered"
    sleep 0.1
  done
  fail "$n ranks: /health did not answer within 60 s"
}
completion() {
  http "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}' |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}
children() { local p; for p in /proc/[0-9]*; do [ "$(awk '{print $4}' "$p/stat" 2>/dev/null)" = "$1" ] && echo "${p#/proc/}"; done; }
stop_serve() { kill -INT "$LPID" 2>/dev/null; wait "$LPID" 2>/dev/null; LPID=""; }

start_serve 1
want=$(completion) || fail "1 rank: completion failed"
stop_serve
[ ${#want} -gt 20 ] || fail "1 rank: completion too short: '$want'"
for n in 2 4; do
  start_serve $n
  got=$(completion) || fail "$n ranks: completion failed"
  [ "$got" = "$want" ] || fail "$n ranks: '$got' != 1 rank '$want'"
  # kill the last rank: everything stops, the launcher exits non-zero within 10 s
  victim=""
  ranks=$(children "$LPID")
  for p in $ranks; do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "TP_RANK=$((n - 1))" && victim=$p
  done
  [ -n "$victim" ] || fail "$n ranks: cannot find rank $((n - 1))"
  kill -9 "$victim"
  t0=$(date +%s%N)
  wait "$LPID"; st=$?; LPID=""
  dt=$(( ($(date +%s%N) - t0) / 1000000 ))
  [ "$st" -ne 0 ] || fail "$n ranks: launcher exited 0 after a rank was killed"
  [ "$dt" -lt 10000 ] || fail "$n ranks: launcher took ${dt} ms to stop after a rank was killed"
  sleep 0.2
  for p in $ranks; do kill -0 "$p" 2>/dev/null && fail "$n ranks: rank process $p survived"; done
  echo "ok: $n ranks: greedy completion equals 1 rank; rank $((n - 1)) killed -> launcher exit $st in ${dt} ms"
done
echo "PASS: '$want'"
