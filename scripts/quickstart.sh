#!/usr/bin/env bash
# scripts/quickstart.sh - install what is missing, build, and serve the bundled
# model on 127.0.0.1 (the README's first command).
#   scripts/quickstart.sh [--port 8080] [extra tpserve serve flags]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
MODEL=models/stories260K.gguf
PORT=8080
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if ./build/tpserve serve --help >/dev/null 2>&1; then
  echo
  echo "tpserve: serving $MODEL at http://127.0.0.1:$PORT/v1  (Ctrl-C stops)"
  echo "try:  curl http://127.0.0.1:$PORT/v1/completions -H 'Content-Type: application/json' \\"
  echo "        -d '{\"prompt\": \"Once upon a time\", \"max_tokens\": 64}'"
  echo
  exec ./build/tpserve serve -m "$MODEL" --host 127.0.0.1 --port "$PORT" "${args[@]}"
else
  exec ./build/tpserve generate -m "$MODEL" -p "Once upon a time" -n 64
fi
