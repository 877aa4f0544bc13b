#!/usr/bin/env bash
# scripts/read_pattern/run.sh - build and run read_pattern.c (what it measures: see there).
# Usage: scripts/read_pattern/run.sh W [--stride BYTES] S,G,D,H ...
#   e.g. scripts/read_pattern/run.sh 0 4,3360,6720,2 4,576,1152,2   (the K-quant Q6_K and the Q4_0 decode orders)
set -euo pipefail
cd "$(dirname "$0")"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -std=c11 -O2 -Wall -Wextra -Werror -o "$out/read_pattern" read_pattern.c
"$out/read_pattern" "$@"
