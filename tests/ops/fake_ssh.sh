#!/bin/sh
# tests/ops/fake_ssh.sh - stand-in for ssh in the launcher tests (TP_LAUNCH_SSH): takes the same
# arguments as the launcher gives ssh (-o OPT ... -tt HOST COMMAND) and runs COMMAND with sh.
# HOST "unreachable.invalid" behaves like an unreachable host (ssh's exit status 255), and so does
# any HOST while the file "$FAKE_SSH_DOWN.HOST" exists (a host that goes down during a test).
# With FAKE_SSH_NETNS_PREFIX set and HOST an address of a scripts/netsim host, COMMAND runs inside
# that host's network namespace, so every rank has its own address.
while [ $# -gt 0 ]; do
  case "$1" in
    -o) shift 2 ;;
    -tt|-t|-T) shift ;;
    *) break ;;
  esac
done
host="$1"; cmd="$2"
if [ "$host" = "unreachable.invalid" ] || { [ -n "${FAKE_SSH_DOWN:-}" ] && [ -e "$FAKE_SSH_DOWN.$host" ]; }; then
  echo "ssh: Could not resolve hostname $host: Name or service not known" >&2
  exit 255
fi
if [ -n "${FAKE_SSH_NETNS_PREFIX:-}" ]; then
  i=$(( ${host##*.} - 1 ))
  exec ip netns exec "${FAKE_SSH_NETNS_PREFIX}-h$i" sh -c "$cmd"
fi
exec sh -c "$cmd"
