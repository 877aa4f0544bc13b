#!/usr/bin/env bash
# tests/node/run_harmony.sh TPSERVE
#   The harmony format end to end (harmony_e2e.mjs) against a fresh tpserve running a
#   random-weight test-tiny model whose vocabulary is o200k with the harmony tokens
#   (built from the tiktoken package's ranks by o200k_oracle.mjs) and whose chat
#   template is the real gpt-oss one (tests/data/chat/openai-gpt-oss-120b.jinja); first, the
#   committed tests/server/harmony_expected.json must be what render_harmony.mjs writes.
# Skips (exit 77 with "SKIP: reason") when node/npm are missing or the packages cannot
# be installed (offline).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
tpserve="$1"
command -v node >/dev/null 2>&1 || { echo "SKIP: node not installed"; exit 77; }
command -v npm >/dev/null 2>&1 || { echo "SKIP: npm not installed"; exit 77; }
tmo() { if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi; }
"$here/npm_install.sh" "$here" 300 tiktoken @huggingface/jinja || { echo "SKIP: npm install failed (offline?)"; exit 77; }
out="$(mktemp)"; tmpd="$(mktemp -d)"
trap '[ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; rm -f "$out"; rm -rf "$tmpd"' EXIT
# the committed rendering oracle is what @huggingface/jinja renders now
tmo 120 node "$here/render_harmony.mjs" "$tmpd/harmony_expected.json" >/dev/null || { echo "FAIL: render_harmony.mjs"; exit 1; }
cmp -s "$tmpd/harmony_expected.json" "$here/../server/harmony_expected.json" ||
  { echo "FAIL: tests/server/harmony_expected.json differs from what @huggingface/jinja renders"; exit 1; }
tmo 120 node "$here/o200k_oracle.mjs" "$tmpd" 1 >/dev/null || { echo "FAIL: o200k_oracle.mjs"; exit 1; }
node -e 'const fs = require("fs");
fs.writeFileSync(process.argv[2], JSON.stringify({ bos_token: "<|startoftext|>", eos_token: "<|return|>",
  pad_token: "<|endoftext|>", add_bos_token: false, chat_template: fs.readFileSync(process.argv[1], "utf8") }));' \
  "$here/../data/chat/openai-gpt-oss-120b.jinja" "$tmpd/tokenizer_config.json" || { echo "FAIL: tokenizer_config.json"; exit 1; }
"$tpserve" synth --shape test-tiny --tokenizer "$tmpd/tokenizer.json" -o "$tmpd/gpt-oss-vocab.gguf" -q ||
  { echo "FAIL: tpserve synth"; exit 1; }
"$tpserve" serve -m "$tmpd/gpt-oss-vocab.gguf" -c 2048 --port 0 --threads 1 --parallel 2 --api-key harmony-key >"$out" 2>&1 &
pid=$!
port=""
for _ in $(seq 1 300); do
  port="$(sed -n 's|.*serving on http://[0-9.]*:\([0-9]*\).*|\1|p' "$out" | head -1)"
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
[ -n "$port" ] || { echo "FAIL: tpserve serve did not start"; cat "$out"; exit 1; }
grep -q "harmony" "$out" || { echo "FAIL: the server did not pick the harmony format"; cat "$out"; exit 1; }
tmo 300 node "$here/harmony_e2e.mjs" "http://127.0.0.1:$port/v1" harmony-key
rc=$?
kill "$pid"; wait "$pid" 2>/dev/null; pid=""
exit $rc
