#!/usr/bin/env bash
# scripts/core_share/run.sh - build and run core_share.c: do this machine's CPUs share a
# physical core right now (SMT siblings a cloud VM cannot see), and how far apart are they (a cache
# line's round trip between them)?  Run it before a benchmark.
# Usage: scripts/core_share/run.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
march= # x86-64: the widest vectors this CPU has; arm64: NEON as built
[ "$(uname -m)" = x86_64 ] && march=-march=native
cc -std=c11 -O2 ${march:+"$march"} -ffp-contract=fast -Wall -Wextra -Werror -pthread -o "$out/core_share" core_share.c
"$out/core_share" "$@"
