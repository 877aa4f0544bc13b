#!/usr/bin/env bash
# tests/ops/bench_nodes_test.sh REPO TPSERVE - `tpserve bench nodes` on the bundled model at 1 and 2
# nodes (10gbe on simulated hosts where scripts/netsim works, else loopback) writes the CSV, the
# Markdown table, the JSON and the SVG plot, with one row per node count and positive rates; the
# 2-node run sent activations (bytes_per_token > 0), the 1-node run none.
set -uo pipefail
REPO="$1"; TPSERVE="$2"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
MODEL="$REPO/models/stories260K.gguf"
[ -f "$MODEL" ] || { echo "SKIP: $MODEL missing"; exit 77; }
timeout 150 "$TPSERVE" bench nodes -m "$MODEL" --nodes 1,2 --link 10gbe -p 8 -n 8 -t 1 \
  --netsim "$REPO/scripts/netsim" -o "$WORK/bn" >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "bench nodes exited $?"; }
for ext in csv md json svg; do [ -s "$WORK/bn.$ext" ] || fail "bn.$ext missing or empty"; done
[ "$(head -1 "$WORK/bn.csv")" = "nodes,pp_tps,tg_tps,compute_ms,comm_ms,bytes_per_token,rss_bytes_max,projected_tg_tps" ] ||
  fail "CSV header: $(head -1 "$WORK/bn.csv")"
[ "$(wc -l <"$WORK/bn.csv")" -eq 3 ] || fail "CSV rows: $(cat "$WORK/bn.csv")"
grep -q '^| 2 |' "$WORK/bn.md" || fail "Markdown table lacks the 2-node row"
grep -q '<polyline' "$WORK/bn.svg" && grep -q '</svg>' "$WORK/bn.svg" || fail "SVG plot"
python3 - "$WORK/bn.json" <<'PY' || fail "JSON content"
import json, sys
d = json.load(open(sys.argv[1]))
runs = {r["nodes"]: r for r in d["runs"]}
assert set(runs) == {1, 2} and all(r["ok"] for r in runs.values()), runs
for r in runs.values():
    for k in ("pp_tps", "tg_tps", "compute_ms", "comm_ms", "bytes_per_token", "rss_bytes_max", "projected_tg_tps"):
        assert k in r, k
    assert r["pp_tps"] > 0 and r["tg_tps"] > 0 and r["rss_bytes_max"] > 1 << 20 and r["projected_tg_tps"] > 0, r
assert runs[1]["bytes_per_token"] == 0 and runs[1]["comm_ms"] == 0, runs[1]
assert runs[2]["bytes_per_token"] > 0 and runs[2]["comm_ms"] > 0 and runs[2]["allsum_us"] > 0, runs[2]
PY
echo "PASS: $(grep -c '^| [0-9]' "$WORK/bn.md") rows"
