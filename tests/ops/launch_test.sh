#!/usr/bin/env bash
# tests/ops/launch_test.sh REPO TPSERVE - `tpserve launch --hostfile` (the ssh path) end to end.
#
# Where scripts/netsim works, 4 simulated hosts (10.77.8.1-4, 10gbe profile) each run a real sshd
# (openssh-server; root login with a throw-away key, config in a temporary directory) and the launcher
# runs on h0 with `ssh -i KEY` (TP_LAUNCH_SSH), so every rank is started by sshd on its own address.
# Without sshd, tests/ops/fake_ssh.sh stands in for ssh (same arguments, runs the command with sh in
# the host's namespace); without namespaces, on 127.0.0.1.  Part 1 always uses the stand-in.
#   1. dry run, environment and "[rank R HOST]" prefixes, the cluster token (random or given, through
#      stdin, never on a command line), exit statuses of the usual mistakes
#      (unreachable host 255, missing program 127, missing model 126), a failing rank stops the
#      others and its status is the launcher's, Ctrl-C (SIGINT) stops every rank;
#   2. 2 and 4 ranks of `tpserve serve` on the bundled model: /health answers and a greedy
#      /v1/completions equals the one-rank answer exactly; then one rank is killed (-9): the
#      launcher stops everything and exits non-zero within 10 s, and no rank process is left.
# TP_TEST_NO_SSHD=1 / TP_TEST_NO_NETNS=1 force the stand-in / the 127.0.0.1 variants.
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

# the cluster token: random (64 hex digits, the same on every rank) when none is given, passed through
# ssh's stdin (never in the remote command line), or the caller's TP_CLUSTER_TOKEN as it is
grep -q "TP_CLUSTER_TOKEN=" <("$TPSERVE" launch --hostfile "$WORK/hf2.json" --dry-run -- true) &&
  fail "dry run shows a token on the command line"
expect 0 "$TPSERVE" launch --hostfile "$WORK/hf2.json" -- sh -c 'echo "tok=$TP_CLUSTER_TOKEN"; ps -o args= -p $PPID $$'
t0=$(sed -n 's/^\[rank 0 alpha\] tok=\([0-9a-f]\{64\}\)$/\1/p' "$WORK/out")
t1=$(sed -n 's/^\[rank 1 beta\] tok=\([0-9a-f]\{64\}\)$/\1/p' "$WORK/out")
[ -n "$t0" ] && [ "$t0" = "$t1" ] || fail "random token: $(cat "$WORK/out")"
[ "$(grep -c -- "$t0" "$WORK/out")" -eq 2 ] || fail "the token shows in a command line: $(cat "$WORK/out")"
TP_CLUSTER_TOKEN="mine 'quoted'" expect 0 "$TPSERVE" launch --hostfile "$WORK/hf2.json" -- sh -c 'echo "tok=$TP_CLUSTER_TOKEN"'
[ "$(grep -c "^\[rank [01] [a-z]*\] tok=mine 'quoted'$" "$WORK/out")" -eq 2 ] || fail "given token: $(cat "$WORK/out")"

t0=$(date +%s)
expect 4 "$TPSERVE" launch --hostfile "$WORK/hf2.json" -- sh -c '[ $TP_RANK = 1 ] && { sleep 0.3; exit 4; }; exec sleep 60'
[ $(( $(date +%s) - t0 )) -lt 10 ] || fail "a failed rank did not stop the others within 10 s"
grep -q "rank 1 (beta) exited with status 4; stopping the other ranks" "$WORK/out" || fail "failure message"

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
MODE=local
LAUNCH_NS=()   # the launcher runs here (inside h0 when ssh must reach the simulated hosts)
if [ -z "${TP_TEST_NO_NETNS:-}" ] && "$REPO/scripts/netsim" check >/dev/null 2>&1 &&
   "$REPO/scripts/netsim" up 4 --profile 10gbe >/dev/null; then
  NETSIM=1
  MODE=netns
  addr() { echo "10.77.8.$(( $1 + 1 ))"; }
  port_of() { echo 29500; }
  http() { ip netns exec "$TP_NETSIM_PREFIX-h0" curl -s -m 30 "$@"; }
  SSHD=$(command -v sshd || echo /usr/sbin/sshd)
  if [ -z "${TP_TEST_NO_SSHD:-}" ] && [ -x "$SSHD" ] && command -v ssh >/dev/null && command -v ssh-keygen >/dev/null
  then
    # a real sshd on every simulated host: root login with a throw-away key only
    MODE=sshd
    mkdir -p /run/sshd
    ssh-keygen -q -t ed25519 -N "" -f "$WORK/id" && ssh-keygen -q -t ed25519 -N "" -f "$WORK/hostkey" ||
      fail "ssh-keygen"
    cp "$WORK/id.pub" "$WORK/authorized_keys"
    for i in 0 1 2 3; do
      printf '%s\n' "ListenAddress $(addr $i)" "Port 22" "HostKey $WORK/hostkey" "PidFile $WORK/sshd.$i.pid" \
        "AuthorizedKeysFile $WORK/authorized_keys" "StrictModes no" "UsePAM no" \
        "PermitRootLogin prohibit-password" "PasswordAuthentication no" "KbdInteractiveAuthentication no" \
        >"$WORK/sshd_config.$i"
      ip netns exec "$TP_NETSIM_PREFIX-h$i" "$SSHD" -f "$WORK/sshd_config.$i" -E "$WORK/sshd.$i.log" ||
        fail "sshd on h$i: $(cat "$WORK/sshd.$i.log")"
    done
    printf '%s\n' '#!/bin/sh' \
      "exec ssh -i '$WORK/id' -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR \"\$@\"" \
      >"$WORK/ssh.sh"
    chmod +x "$WORK/ssh.sh"
    export TP_LAUNCH_SSH="$WORK/ssh.sh"
    LAUNCH_NS=(ip netns exec "$TP_NETSIM_PREFIX-h0")
    echo "ranks on simulated hosts 10.77.8.1-4 (10gbe), each started by a real sshd"
  else
    export FAKE_SSH_NETNS_PREFIX="$TP_NETSIM_PREFIX"
    echo "ranks on simulated hosts 10.77.8.1-4 (10gbe); no sshd (openssh-server): ssh stand-in"
  fi
else
  addr() { echo 127.0.0.1; }
  port_of() { echo $(( 20000 + ($$ % 2000) * 5 + $1 )); }   # per-run ports: parallel ctest runs do not collide
  http() { curl -s -m 30 "$@"; }
  echo "network namespaces unavailable: ranks on 127.0.0.1 (ssh stand-in)"
fi

# start_serve N: launcher in the background, rank 0's HTTP address in $URL
start_serve() {
  local n=$1 i sep=""
  { printf '{"version": 1, "hosts": ['
    for ((i = 0; i < n; i++)); do
      printf '%s{"host": "%s", "ips": ["%s"], "port": %d}' "$sep" "$(addr $i)" "$(addr $i)" "$(port_of $i)"; sep=", "
    done
    printf ']}\n'; } >"$WORK/hf$n.json"
  "${LAUNCH_NS[@]}" "$TPSERVE" launch --hostfile "$WORK/hf$n.json" -- "$TPSERVE" serve -m "$MODEL" --host 0.0.0.0 --port 0 \
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
# rank_pids HOSTFILE [RANK]: live rank processes started with that hostfile (and rank), whoever their parent
rank_pids() {
  local f p
  for f in $(grep -lzx "TP_HOSTFILE=$1" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}; p=${p%/environ}
    [ -z "${2:-}" ] || grep -qzx "TP_RANK=$2" "$f" 2>/dev/null || continue
    [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = Z ] && continue
    echo "$p"
  done
}
stop_serve() { kill -INT "$LPID" 2>/dev/null; wait "$LPID" 2>/dev/null; LPID=""; }

start_serve 1
want=$(completion) || fail "1 rank: completion failed"
stop_serve
[ ${#want} -gt 20 ] || fail "1 rank: completion too short: '$want'"
for n in 2 4; do
  start_serve $n
  got=$(completion) || fail "$n ranks: completion failed"
  [ "$got" = "$want" ] || fail "$n ranks: '$got' != 1 rank '$want'"
  # the launcher's token reached the ranks without showing in the output (no terminal echo) or in
  # any process's command line
  r0=$(rank_pids "$WORK/hf$n.json" 0)
  tok=$(tr '\0' '\n' <"/proc/$r0/environ" 2>/dev/null | sed -n 's/^TP_CLUSTER_TOKEN=//p')
  [ ${#tok} -eq 64 ] || fail "$n ranks: rank 0 has no 64-digit TP_CLUSTER_TOKEN ('$tok')"
  ! grep -q -- "$tok" "$WORK/log" || fail "$n ranks: the cluster token shows in the launcher's output"
  ! grep -lq -- "$tok" /proc/[0-9]*/cmdline 2>/dev/null || fail "$n ranks: the cluster token is on a command line"
  # kill the last rank: everything stops, the launcher exits non-zero within 10 s
  victim=$(rank_pids "$WORK/hf$n.json" $((n - 1)))
  [ -n "$victim" ] || fail "$n ranks: cannot find rank $((n - 1))"
  kill -9 "$victim"
  t0=$(date +%s%N)
  wait "$LPID"; st=$?; LPID=""
  dt=$(( ($(date +%s%N) - t0) / 1000000 ))
  [ "$st" -ne 0 ] || fail "$n ranks: launcher exited 0 after a rank was killed"
  [ "$dt" -lt 10000 ] || fail "$n ranks: launcher took ${dt} ms to stop after a rank was killed"
  for _ in $(seq 50); do [ -z "$(rank_pids "$WORK/hf$n.json")" ] && break; sleep 0.1; done
  [ -z "$(rank_pids "$WORK/hf$n.json")" ] || fail "$n ranks: rank processes survived: $(rank_pids "$WORK/hf$n.json")"
  echo "ok: $n ranks ($MODE): greedy completion equals 1 rank; rank $((n - 1)) killed -> launcher exit $st in ${dt} ms"
done
echo "PASS: '$want'"
