#!/usr/bin/env bash
# tests/ops/bench_nodes_test.sh REPO TPSERVE [tinyllama] - `tpserve bench nodes` writes the CSV, the
# Markdown table, the JSON and the SVG plot, one row per node count with positive rates; multi-node
# runs sent activations (bytes_per_token > 0), the 1-node run none.  Default: the bundled model at 1
# and 2 nodes, with --delay 0.1 (the 2-node run's measured round trip >= 0.2 ms on simulated hosts) and
# --verify / --spec passed to bench gen (verify_step_ratio, the speculative decode identical to the
# plain one, in the JSON and the Markdown table); "tinyllama": a synthetic tinyllama-1.1b Q4_0 (6 layers) at 1, 2 and 4 nodes, where per-rank memory
# must also fall with the node count.  10gbe on simulated hosts where scripts/netsim works, else
# loopback.
set -uo pipefail
REPO="$1"; TPSERVE="$2"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
NODES=1,2
if [ "${3:-}" = tinyllama ]; then
  # the reference case: a synthetic tinyllama-1.1b Q4_0 (random weights, real layer shape; 6 of its 22
  # layers, so the weights still dwarf the rest of a rank's memory) at 1, 2 and 4 nodes
  MODEL="$WORK/tinyllama-1.1b-q4_0.gguf"
  NODES=1,2,4
  timeout 300 "$TPSERVE" synth --shape tinyllama-1.1b --layers 6 --type q4_0 -o "$MODEL" >"$WORK/out" 2>&1 ||
    { cat "$WORK/out"; fail "synth tinyllama-1.1b"; }
else
  MODEL="$REPO/models/stories260K.gguf"
  [ -f "$MODEL" ] || { echo "SKIP: $MODEL missing"; exit 77; }
fi
EXTRA=()
[ "${3:-}" = tinyllama ] || EXTRA=(--delay 0.1 --verify 2 --spec ngram --draft-max 2 --text "Once upon a time")
timeout 600 "$TPSERVE" bench nodes -m "$MODEL" --nodes $NODES --link 10gbe -p 8 -n 8 -t 1 "${EXTRA[@]}" \
  --netsim "$REPO/scripts/netsim" -o "$WORK/bn" >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "bench nodes exited $?"; }
N_ROWS=$(( $(echo "$NODES" | tr ',' '\n' | wc -l) + 1 ))
for ext in csv md json svg; do [ -s "$WORK/bn.$ext" ] || fail "bn.$ext missing or empty"; done
[ "$(head -1 "$WORK/bn.csv")" = "nodes,pp_tps,tg_tps,compute_ms,comm_ms,bytes_per_token,rss_bytes_max,projected_tg_tps" ] ||
  fail "CSV header: $(head -1 "$WORK/bn.csv")"
[ "$(wc -l <"$WORK/bn.csv")" -eq "$N_ROWS" ] || fail "CSV rows: $(cat "$WORK/bn.csv")"
grep -q '^| 2 |' "$WORK/bn.md" || fail "Markdown table lacks the 2-node row"
grep -q '<polyline' "$WORK/bn.svg" && grep -q '</svg>' "$WORK/bn.svg" || fail "SVG plot"
[ ${#EXTRA[@]} -eq 0 ] || grep -q '^Speculative decoding (bench gen --verify 2 --spec ngram --draft-max 2)' "$WORK/bn.md" ||
  fail "Markdown lacks the speculative table: $(cat "$WORK/bn.md")"
python3 - "$WORK/bn.json" "$NODES" "${TP_TEST_SANITIZED:-0}" "${#EXTRA[@]}" <<'PY' || fail "JSON content"
import json, sys
d = json.load(open(sys.argv[1]))
runs = {r["nodes"]: r for r in d["runs"]}
assert set(runs) == {int(x) for x in sys.argv[2].split(",")} and all(r["ok"] for r in runs.values()), runs
for r in runs.values():
    for k in ("pp_tps", "tg_tps", "compute_ms", "comm_ms", "bytes_per_token", "rss_bytes_max", "projected_tg_tps"):
        assert k in r, k
    assert r["pp_tps"] > 0 and r["tg_tps"] > 0 and r["rss_bytes_max"] > 1 << 20 and r["projected_tg_tps"] > 0, r
assert runs[1]["bytes_per_token"] == 0 and runs[1]["comm_ms"] == 0, runs[1]
for n, r in runs.items():
    if n > 1:
        assert r["bytes_per_token"] > 0 and r["comm_ms"] > 0 and r["allsum_us"] > 0, r
# Each rank holds a slice: memory per rank falls with the node count.  Not in a sanitizer build, where
# the allocator's quarantine and shadow memory outweigh a 6-layer model's per-rank weights.
if 4 in runs and sys.argv[3] == "0":
    assert runs[4]["rss_bytes_max"] < runs[2]["rss_bytes_max"] < runs[1]["rss_bytes_max"], runs
if sys.argv[4] != "0":  # --delay 0.1 --verify 2 --spec ngram
    for n, r in runs.items():
        assert r["verify_step_ratio"] > 0 and r["step1_ms"] > 0, r
        sp = r["spec"]
        assert sp["identical"] is True and 0 <= sp["acceptance"] <= 1, sp
        assert sp["plain"]["tg_tps"] > 0 and sp["speculative"]["tg_tps"] > 0, sp
        assert sp["speculative"]["tokens_per_step"] >= 1, sp
    if d["link"] != "loopback":  # simulated hosts: the delay is in the measured round trip
        assert d["delay_ms"] == 0.1 and runs[2]["rtt_us"] >= 200, (d.get("delay_ms"), runs[2])
PY
echo "PASS: $(grep -c '^| [0-9]' "$WORK/bn.md") rows"
