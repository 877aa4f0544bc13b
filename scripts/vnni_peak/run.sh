#!/usr/bin/env bash
# scripts/vnni_peak/run.sh - build and run vnni_peak.c: one core's zmm vpdpbusd rate, alone and
# beside the scale products and unpacking of the x16 batch passes (their arithmetic ceiling), and its
# zmm vdpbf16ps rate where it has AVX512_BF16 (the bf16 attention tile's ceiling).
# Usage: scripts/vnni_peak/run.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -std=c11 -O2 -march=native -Wall -Wextra -Werror -o "$out/vnni_peak" vnni_peak.c
"$out/vnni_peak" "$@"
