#!/usr/bin/env bash
# tests/ops/netsim_test.sh - scripts/netsim end to end: two simulated hosts under the 1gbe
# profile reach each other on their own addresses, the tbf cap is installed on both ends
# of every link and really limits throughput, `up` is idempotent, `down` leaves nothing;
# with --delay 1 (the user-space delaying switch) the round trip is at least 2 ms and the
# switch process goes with `down`.
# Exit 77 (ctest skip) where network namespaces are not permitted.
set -uo pipefail
NETSIM="$1/scripts/netsim"
export TP_NETSIM_PREFIX="tpt$$"       # private set: never touches a user's simulated hosts
export TP_NETSIM_SUBNET="10.77.9"

fail() { echo "FAIL: $*" >&2; "$NETSIM" down >/dev/null 2>&1; exit 1; }
trap '"$NETSIM" down >/dev/null 2>&1' EXIT

"$NETSIM" check || exit $?            # prints "SKIP: reason" and exits 77 when not permitted

"$NETSIM" up 2 --profile 1gbe >/dev/null || fail "up 2 --profile 1gbe"
"$NETSIM" up 2 --profile 1gbe >/dev/null || fail "second up (must be idempotent)"
[ "$(ip netns list | grep -c "^${TP_NETSIM_PREFIX}-")" -eq 3 ] || fail "expected 3 namespaces (2 hosts + switch)"

hosts=$("$NETSIM" hosts)
[ "$hosts" = "h0 10.77.9.1
h1 10.77.9.2" ] || fail "hosts listing: '$hosts'"
addr=$("$NETSIM" exec h1 ip -4 -o addr show dev eth0 | awk '{print $4}')
[ "$addr" = "10.77.9.2/24" ] || fail "h1 address is '$addr'"

# tbf on the host side and on the switch port, 1 Gbit
for h in h0 h1; do
  "$NETSIM" exec "$h" tc qdisc show dev eth0 | grep -q "tbf .*rate 1Gbit" || fail "no 1 Gbit tbf on $h eth0"
done
for p in p0 p1; do
  ip netns exec "${TP_NETSIM_PREFIX}-sw" tc qdisc show dev "$p" | grep -q "tbf .*rate 1Gbit" ||
    fail "no 1 Gbit tbf on switch port $p"
done
"$NETSIM" status | grep -q "h1 .*10.77.9.2/24 .*tbf rate 1Gbit" || fail "status output"

# reachability + the cap really holds (1 Gbit/s plus 10% for the bucket's burst)
out=$("$NETSIM" measure --seconds 1) || fail "measure: h0 cannot reach h1"
echo "$out"
mbit=$(echo "$out" | sed -n 's/.*mbit_s=\([0-9]*\).*/\1/p')
rtt=$(echo "$out" | sed -n 's/.*rtt_us_p50=\([0-9.]*\).*/\1/p')
[ -n "$mbit" ] && [ "$mbit" -gt 0 ] && [ "$mbit" -le 1100 ] || fail "throughput ${mbit:-?} Mbit/s not within (0, 1100]"
[ -n "$rtt" ] || fail "no RTT measured"

# a host outside the set is refused with a clear error
"$NETSIM" exec h5 true 2>/dev/null && fail "exec on a missing host succeeded"
"$NETSIM" up 2 --delay abc >/dev/null 2>&1 && fail "--delay abc accepted"

# one-way delay 1 ms: every round trip crosses the switch twice, so its median is >= 2 ms
if [ -c /dev/net/tun ]; then
  "$NETSIM" up 2 --delay 1 --profile 1gbe >/dev/null || fail "up 2 --delay 1"
  st=$("$NETSIM" status) || fail "status (delay)"
  echo "$st" | grep -q "one-way delay 1000 us" || fail "status does not show the delay: $st"
  "$NETSIM" exec h0 tc qdisc show dev eth0 | grep -q "tbf .*rate 1Gbit" || fail "no 1 Gbit tbf on h0 eth0 (delay)"
  out=$("$NETSIM" measure --seconds 0.3) || fail "measure with --delay: h0 cannot reach h1"
  echo "$out"
  drtt=$(echo "$out" | sed -n 's/.*rtt_us_p50=\([0-9]*\).*/\1/p')
  [ -n "$drtt" ] && [ "$drtt" -ge 2000 ] || fail "round trip ${drtt:-?} us with a 1 ms one-way delay (want >= 2000)"
  "$NETSIM" down >/dev/null || fail "down (delay)"
  pgrep -f "tpserve-netsim-delay-.* tap0 tap1" >/dev/null && fail "the delaying switch outlived down"
else
  echo "note: /dev/net/tun missing: --delay not checked"
fi

"$NETSIM" down >/dev/null || fail "down"
[ "$(ip netns list | grep -c "^${TP_NETSIM_PREFIX}-")" -eq 0 ] || fail "namespaces left after down"
echo "PASS: netsim 2 hosts, 1gbe, ${mbit} Mbit/s, rtt p50 ${rtt} us"
