#!/usr/bin/env bash
# tests/node/run_structured.sh TPSERVE MODEL RANKS
#   structured.mjs (response_format validated by ajv) against a fresh tpserve
#   of RANKS ranks on 127.0.0.1 (RANKS > 1: under `tpserve launch -n RANKS`).
# Skips (exit 77 with "SKIP: reason") when node/npm are missing or the packages
# cannot be installed (offline).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
tpserve="$1"; model="$2"; ranks="${3:-1}"
command -v node >/dev/null 2>&1 || { echo "SKIP: node not installed"; exit 77; }
command -v npm >/dev/null 2>&1 || { echo "SKIP: npm not installed"; exit 77; }
tmo() { if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi; }
if [ ! -d "$here/node_modules/ajv" ] || [ ! -d "$here/node_modules/openai" ]; then
  (cd "$here" && tmo 300 npm install --no-audit --no-fund --silent >/dev/null 2>&1) ||
    { echo "SKIP: npm install failed (offline?)"; exit 77; }
fi
out="$(mktemp)"
trap '[ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; rm -f "$out"' EXIT
if [ "$ranks" -gt 1 ]; then
  "$tpserve" launch -n "$ranks" -- "$tpserve" serve -m "$model" --port 0 --threads 1 --parallel 4 \
    --api-key structured-key >"$out" 2>&1 &
else
  "$tpserve" serve -m "$model" --port 0 --threads 1 --parallel 4 --api-key structured-key >"$out" 2>&1 &
fi
pid=$!
port=""
for _ in $(seq 1 300); do
  port="$(sed -n 's|.*serving on http://[0-9.]*:\([0-9]*\).*|\1|p' "$out" | head -1)"
  [ -n "$port" ] && break
  sleep 0.2
done
[ -n "$port" ] || { echo "FAIL: tpserve serve did not start"; cat "$out"; exit 1; }
tmo 300 node "$here/structured.mjs" "http://127.0.0.1:$port/v1" structured-key
rc=$?
kill "$pid"; wait "$pid" 2>/dev/null; pid=""
exit $rc
