#!/usr/bin/env bash
# tests/node/npm_install.sh DIR TIMEOUT_S PACKAGE... - make sure DIR/node_modules holds every PACKAGE:
# when one is missing, run `npm install` in DIR (bounded by TIMEOUT_S where coreutils timeout exists).
# ctest runs the node tests in parallel and several of them share DIR, so installs into one folder take
# turns: an exclusive flock on DIR/package.json (util-linux; where there is no flock, as on stock macOS,
# no lock), and the check is made again once the lock is held, so a test that waited for another's
# install does not install again.  The environment passes through (PUPPETEER_SKIP_DOWNLOAD=1).
# Exit status 0 when every PACKAGE is there, else npm's (the caller skips with "npm install failed").
set -u
dir="$1"; tmo_s="$2"; shift 2
missing() {
  local p
  for p in "$@"; do [ -d "$dir/node_modules/$p" ] || return 0; done
  return 1
}
missing "$@" || exit 0
if command -v flock >/dev/null 2>&1; then
  exec 9<"$dir/package.json" || exit 1
  flock 9 || exit 1
  missing "$@" || exit 0
fi
cd "$dir" || exit 1
if command -v timeout >/dev/null 2>&1; then
  timeout "$tmo_s" npm install --no-audit --no-fund --silent >/dev/null 2>&1
else
  npm install --no-audit --no-fund --silent >/dev/null 2>&1
fi
