#!/usr/bin/env bash
# scripts/quickstart.sh - install what is missing, build, and serve the bundled
# model on 127.0.0.1 (the README's first command).
#   scripts/quickstart.sh [--port 8080] [extra tpserve serve flags]
# TPSERVE_BIN=PATH: check the system packages only and serve with that binary
# instead of building build/tpserve (tests/ops/readme_test.sh uses the build under test).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${TPSERVE_BIN:-}" ]; then
  [ -x "$TPSERVE_BIN" ] || { echo "quickstart: TPSERVE_BIN=$TPSERVE_BIN is not an executable" >&2; exit 2; }
  scripts/setup.sh --deps-only
  BIN=$TPSERVE_BIN
else
  scripts/setup.sh
  BIN=./build/tpserve
fi
MODEL=models/stories260K.gguf
PORT=8080
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if "$BIN" serve --help >/dev/null 2>&1; then
  echo
  echo "tpserve: serving $MODEL at http://127.0.0.1:$PORT/v1  (Ctrl-C stops)"
  echo "try:  curl http://127.0.0.1:$PORT/v1/completions -H 'Content-Type: application/json' \\"
  echo "        -d '{\"prompt\": \"Once upon a time\", \"max_tokens\": 64}'"
  echo
  exec "$BIN" serve -m "$MODEL" --host 127.0.0.1 --port "$PORT" "${args[@]}"
else
  exec "$BIN" generate -m "$MODEL" -p "Once upon a time" -n 64
fi
