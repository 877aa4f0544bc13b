#!/usr/bin/env bash
# tests/node/run_structured.sh TPSERVE MODEL RANKS [SCRIPT[,SCRIPT...]]
#   each SCRIPT in turn (structured.mjs: response_format and forced tool calls
#   validated by ajv; clients.mjs: the Vercel AI SDK and LangChain; tools.mjs:
#   tool_choice auto, streamed tool calls; apis.mjs: the Anthropic, OpenAI
#   Responses and Ollama clients) against one fresh tpserve of RANKS ranks on
#   127.0.0.1 (RANKS > 1: under `tpserve launch -n RANKS`); fails when any
#   script fails.
#   MODEL synth:llama3 / synth:qwen3: a random-weight test-tiny model written
#   with ../shared's Llama 3 / Qwen3 tokenizer.json and chat template.
#   TP_SERVE_CHAT_TEMPLATE: serve with --chat-template (e.g. llama3.1).
#   TP_SERVE_ARGS: more serve options (e.g. --logit-bias 151657+100).
#   A SCRIPT under agents/ (the OpenAI Agents SDK, Codex CLI) uses the packages of
#   agents/package.json, installed there on first use; skipped (77) when they cannot be.
# Skips (exit 77 with "SKIP: reason") when node/npm are missing, the packages
# cannot be installed (offline) or a synth: tokenizer is not in ../shared
# (a failure with TP_REQUIRE_SHARED=1).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
tpserve="$1"; model="$2"; ranks="${3:-1}"; script="${4:-structured.mjs}"
command -v node >/dev/null 2>&1 || { echo "SKIP: node not installed"; exit 77; }
command -v npm >/dev/null 2>&1 || { echo "SKIP: npm not installed"; exit 77; }
tmo() { if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi; }
"$here/npm_install.sh" "$here" 300 ajv zod ai @langchain/openai @anthropic-ai/sdk ollama ||
  { echo "SKIP: npm install failed (offline?)"; exit 77; }
case "$script" in
  *agents/*)
    "$here/npm_install.sh" "$here/agents" 400 @openai/agents @openai/codex ||
      { echo "SKIP: npm install in tests/node/agents failed (offline?)"; exit 77; } ;;
esac
out="$(mktemp)"; tmpd="$(mktemp -d)"; ctx=()
trap '[ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; rm -f "$out"; rm -rf "$tmpd"' EXIT
case "$model" in
  synth:*)
    fam="${model#synth:}"
    tj="${TP_SHARED_DIR:-$here/../../../shared}/models/tokenizers/$fam/tokenizer.json"
    if [ ! -f "$tj" ]; then
      if [ -n "${TP_REQUIRE_SHARED:-}" ] && [ "$TP_REQUIRE_SHARED" != 0 ]; then echo "FAIL: $tj missing"; exit 1; fi
      echo "SKIP: $tj not present"; exit 77
    fi
    model="$tmpd/synth-$fam.gguf"
    "$tpserve" synth --shape "test-tiny-$fam" --tokenizer "$tj" -o "$model" -q || { echo "FAIL: tpserve synth"; exit 1; }
    ctx=(-c 2048) # past the tiny shape's 512 training positions: random weights do not care
    [ "$fam" = qwen3 ] && export TP_STRUCT_TOOLS=1 # its template renders tools (Hermes format)
    ;;
esac
[ -n "${TP_SERVE_CHAT_TEMPLATE:-}" ] && ctx+=(--chat-template "$TP_SERVE_CHAT_TEMPLATE")
if [ -n "${TP_SERVE_ARGS:-}" ]; then read -r -a extra <<<"$TP_SERVE_ARGS"; ctx+=("${extra[@]}"); fi
if [ "$ranks" -gt 1 ]; then
  "$tpserve" launch -n "$ranks" -- "$tpserve" serve -m "$model" "${ctx[@]}" --port 0 --threads 1 --parallel 4 \
    --api-key structured-key >"$out" 2>&1 &
else
  "$tpserve" serve -m "$model" "${ctx[@]}" --port 0 --threads 1 --parallel 4 --api-key structured-key >"$out" 2>&1 &
fi
pid=$!
port=""
for _ in $(seq 1 300); do
  port="$(sed -n 's|.*serving on http://[0-9.]*:\([0-9]*\).*|\1|p' "$out" | head -1)"
  [ -n "$port" ] && break
  sleep 0.2
done
[ -n "$port" ] || { echo "FAIL: tpserve serve did not start"; cat "$out"; exit 1; }
rc=0
IFS=, read -r -a scripts <<<"$script"
for s in "${scripts[@]}"; do
  echo "== $s"
  TP_SERVER_LOG="$out" tmo 500 node "$here/$s" "http://127.0.0.1:$port/v1" structured-key || rc=1
done
kill "$pid"; wait "$pid" 2>/dev/null; pid=""
exit $rc
