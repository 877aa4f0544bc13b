#!/usr/bin/env bash
# tests/node/run_web.sh TPSERVE REPO - the web page (GET /) in headless
# Chromium (Debian's chromium package) driven by puppeteer-core against real
# servers on 127.0.0.1 (tests/node/web_test.mjs).  Exit 77 (skipped, with the
# reason) when node, npm, Chromium or the npm packages are not available.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
tpserve="$1"; repo="$2"
chromium="${CHROMIUM:-/usr/bin/chromium}"
command -v node >/dev/null 2>&1 || { echo "SKIP: node not installed"; exit 77; }
command -v npm >/dev/null 2>&1 || { echo "SKIP: npm not installed"; exit 77; }
[ -x "$chromium" ] || { echo "SKIP: $chromium missing (apt-get install chromium, or set CHROMIUM)"; exit 77; }
[ -f "$repo/models/stories260K.gguf" ] || { echo "SKIP: models/stories260K.gguf missing"; exit 77; }
tmo() { if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi; }
PUPPETEER_SKIP_DOWNLOAD=1 "$here/npm_install.sh" "$here" 300 puppeteer-core ||
  { echo "SKIP: npm install failed (offline?)"; exit 77; }
CHROMIUM="$chromium" tmo 280 node "$here/web_test.mjs" "$tpserve" "$repo"
