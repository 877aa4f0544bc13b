#!/bin/sh
# tests/comm/launch_left_out_test.sh TPSERVE - what `tpserve launch` does with a worker that exits 88
# (left out by rank 0's re-plan, docs/cli.md): not restarted, not a failure, the others go on, the end
# of the run names it; rank 0 exiting 88 is a failure.  Plain sh ranks; exit status 0 only when every
# check passed.
T=$1
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fails=0
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
ok() { echo "ok   $*"; }
export D="$d"

# rank 2 left out at once; rank 1 ends 1.5 s later by itself (proof it was not stopped), rank 0 after 2 s
body='echo x >>"$D/start$TP_RANK"; case $TP_RANK in 2) exit 88;; 1) sleep 1.5; : >"$D/done1"; exit 0;; *) sleep 2; exit 0;; esac'
for restart in "" "--restart 3"; do
  rm -f "$d"/start* "$d"/done1
  # shellcheck disable=SC2086
  out=$("$T" launch -n 3 $restart -- sh -c "$body" 2>&1); rc=$?
  printf '%s\n' "$out"
  what="launch -n 3 ${restart:-without --restart}"
  [ $rc -eq 0 ] && ok "$what: exit 0 with rank 2 left out" || fail "$what: exit $rc, want 0"
  [ -e "$d/done1" ] && ok "$what: rank 1 went on to its end" || fail "$what: rank 1 was stopped"
  n=$(wc -l <"$d/start2" 2>/dev/null || echo 0)
  [ "$n" -eq 1 ] && ok "$what: rank 2 started once (not restarted)" || fail "$what: rank 2 started $n times"
  printf '%s\n' "$out" | grep -q 'rank 2 was left out of the group (rank 0 re-planned without it); not restarting it' &&
    ok "$what: logged when it happened" || fail "$what: no 'left out' line"
  printf '%s\n' "$out" | grep -q 'rank 2 left out by a re-plan; the other 2 ranks exited normally' &&
    ok "$what: named at the end" || fail "$what: no end line naming rank 2"
done

# a left-out rank does not hide a real failure that follows
out=$("$T" launch -n 3 --grace-ms 1000 -- sh -c 'case $TP_RANK in 2) exit 88;; 1) sleep 1; exit 7;; *) sleep 30;; esac' 2>&1)
rc=$?
printf '%s\n' "$out"
[ $rc -eq 7 ] && printf '%s\n' "$out" | grep -q 'rank 1 exited with status 7; stopping the other ranks' &&
  ok "left out, then rank 1 fails with 7: launch exits 7" || fail "left out then a failure: exit $rc, want 7"

# rank 0 is never left out: its 88 is a failure that stops the others
start=$(date +%s)
out=$("$T" launch -n 2 --restart 3 --grace-ms 1000 -- sh -c 'if [ "$TP_RANK" = 0 ]; then exit 88; fi; sleep 30' 2>&1)
rc=$?
secs=$(($(date +%s) - start))
printf '%s\n' "$out"
[ $rc -eq 88 ] && [ $secs -lt 20 ] && printf '%s\n' "$out" | grep -q 'rank 0 exited with status 88' &&
  ok "rank 0 exiting 88: a failure, launch exits 88 after ${secs} s" || fail "rank 0 exiting 88: exit $rc after ${secs} s"

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
