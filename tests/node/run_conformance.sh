#!/usr/bin/env bash
# tests/node/run_conformance.sh TPSERVE MODEL [templates|client]
#   templates  the committed chat-template oracle (tests/server/chat_expected.json) is what
#              @huggingface/jinja renders from ../shared's tokenizer_config.json files
#   client     the official openai npm client against a fresh tpserve (the default)
# Skips (exit 77 with "SKIP: reason") when node/npm are missing or the packages cannot be
# installed (offline); "templates" also when ../shared lacks the tokenizers, except that with
# TP_REQUIRE_SHARED=1 missing data is a failure.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
tpserve="$1"; model="$2"; mode="${3:-client}"
command -v node >/dev/null 2>&1 || { echo "SKIP: node not installed"; exit 77; }
command -v npm >/dev/null 2>&1 || { echo "SKIP: npm not installed"; exit 77; }
# bounded waits (coreutils timeout; absent on stock macOS: run unbounded there)
tmo() { if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi; }
"$here/npm_install.sh" "$here" 300 openai @huggingface/jinja || { echo "SKIP: npm install failed (offline?)"; exit 77; }
if [ "$mode" = templates ]; then
  shared="${TP_SHARED_DIR:-$here/../../../shared}/models"
  if [ ! -d "$shared/tokenizers/llama3" ] || [ ! -d "$shared/tokenizers/qwen3" ]; then
    if [ -n "${TP_REQUIRE_SHARED:-}" ] && [ "$TP_REQUIRE_SHARED" != 0 ]; then
      echo "FAIL: $shared/tokenizers/{llama3,qwen3} missing and TP_REQUIRE_SHARED=1"; exit 1
    fi
    echo "SKIP: $shared/tokenizers/{llama3,qwen3} not present"; exit 77
  fi
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  node "$here/render_templates.mjs" "$shared" "$tmp/rendered.json" >/dev/null || { echo "render_templates.mjs failed"; exit 1; }
  if ! cmp -s "$tmp/rendered.json" "$here/../server/chat_expected.json"; then
    echo "FAIL: tests/server/chat_expected.json differs from what @huggingface/jinja renders"; exit 1
  fi
  echo "ok - chat_expected.json matches @huggingface/jinja"
  exit 0
fi
trap '[ -n "${pid:-}" ] && kill "$pid" 2>/dev/null' EXIT
# the openai client against a live server
out="$(mktemp)"
"$tpserve" serve -m "$model" --port 0 --threads 1 --api-key conformance-key >"$out" 2>/dev/null &
pid=$!
port=""
for _ in $(seq 1 150); do
  port="$(sed -n 's|.*serving on http://[0-9.]*:\([0-9]*\).*|\1|p' "$out")"
  [ -n "$port" ] && break
  sleep 0.2
done
rm -f "$out"
[ -n "$port" ] || { echo "FAIL: tpserve serve did not start"; exit 1; }
tmo 120 node "$here/conformance.mjs" "http://127.0.0.1:$port/v1" conformance-key
rc=$?
kill "$pid"; wait "$pid" 2>/dev/null; pid=""
exit $rc
