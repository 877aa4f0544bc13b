#!/usr/bin/env bash
# tests/ops/plan_measured_test.sh TPSERVE [SHAPE LAYERS] - `tpserve plan` against a measured run on this
# machine, for 2 and 4 local ranks of a synthetic SHAPE Q4_0 model (default tinyllama-1.1b cut to 2 layers,
# to stay fast): `bench comm --decode N_EMBD --sync` times the collectives of the decode step (the step
# header broadcast, the all_sums, the argmax gather) on those ranks, each rank first reading from memory
# what the plan says it reads between two collectives (--gap-bytes), as the forward pass does; `plan
# --comm-json` predicts from those times; `bench gen --comm-sync` under `tpserve launch` measures.
#  - Bytes sent per token (rank 0): the plan's within 5% of comm/'s byte counters.  Asserted.
#  - Communication time per token, on loopback and on a link whose latency dominates (every rank's
#    messages held TP_PLAN_SIM_LATENCY_US, default 20000, before they are sent: TP_COMM_SIM_LATENCY_US,
#    for bench comm and bench gen alike).  Measured by the collectives' own timers in both: each call from
#    the moment the last rank entered it to the moment the last rank left it (sync_lat_us_mean,
#    comm_sync_ms_per_token), which leaves out the waits for a rank still computing.  Asserted within 25%
#    with TP_PLAN_CHECK_TIME=1 (a check for a quiet machine: on a busy one a rank can be
#    descheduled inside a call for longer than the call takes); reported always.
# TP_PLAN_RANKS: the rank counts to run (default "2 4").  TP_PLAN_GAPS: decode (default): bench comm runs
# the model's step (--layers n_layer), each rank reading the parts of its bytes per token where the
# forward pass reads them (ATTN,FFN,HEAD) with the Q4_0 decode kernel (--gap-type q4_0); mean: every gap
# the mean part, a plain read.
set -uo pipefail
TPSERVE="$1"; SHAPE="${2:-tinyllama-1.1b}"; LAYERS="${3:-2}"
LAT_US="${TP_PLAN_SIM_LATENCY_US:-20000}"
GAPS="${TP_PLAN_GAPS:-decode}"
case "$GAPS" in
  mean) GAP_ARGS=(); STEPS=100 ;;
  decode) GAP_ARGS=(--gap-type q4_0 --layers "$LAYERS"); STEPS=50 ;; # a step reads a token's bytes
  *) echo "TP_PLAN_GAPS must be mean or decode, got '$GAPS'" >&2; exit 2 ;;
esac
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
MODEL="$WORK/model.gguf"
timeout 120 "$TPSERVE" synth --shape "$SHAPE" --layers "$LAYERS" --type q4_0 -q -o "$MODEL" >"$WORK/out" 2>&1 ||
  { cat "$WORK/out"; fail "synth $SHAPE"; }
EMBD=$("$TPSERVE" plan -m "$MODEL" --nodes 8G --json | python3 -c '
import json, sys; print(json.load(sys.stdin)["n_embd"])') || fail "plan --json has no n_embd"
# what each of N ranks reads between two collectives of a decode step: its bytes per token (the plan's)
# over the 2 n_layer + 2 collectives per token; with TP_PLAN_GAPS=decode the busiest rank's bytes where
# the forward pass reads them, ATTN,FFN,HEAD: a layer's attention slice (q, k, v, o) before its first
# all_sum, its FFN slice before the second, the output head's slice and the rest before the gather
gap_bytes() {
  "$TPSERVE" plan -m "$MODEL" --nodes "$1" --json | python3 -c '
import json, sys; p = json.load(sys.stdin); split = sys.argv[1] == "1"
node = max(p["nodes"], key=lambda n: n["read_bytes_per_token"])
total, L, E = node["read_bytes_per_token"], p["n_layer"], p["n_embd"]
if not split:
    print(int(total / (2 * L + 2))); sys.exit(0)
per_elem = {"q4_0": 18 / 32, "q8_0": 34 / 32, "f16": 2, "bf16": 2, "f32": 4}[p["type"]]
hd = E // sum(n["q_heads"] for n in p["nodes"])
attn = (2 * node["q_heads"] + 2 * node["kv_heads"]) * hd * E * per_elem
ffn = 3 * node["ffn_cols"] * E * per_elem
print(f"{int(attn)},{int(ffn)},{int(total - L * (attn + ffn))}")' "$([ "$GAPS" = decode ] && echo 1 || echo 0)"
}

# measure N LATENCY_US ITERS GEN_TOKENS TAG: bench comm, plan from it, bench gen (files $WORK/*-TAG.json)
measure() {
  local n=$1 lat=$2 iters=$3 ntok=$4 tag=$5 nodes gap
  nodes=$(python3 -c "print(','.join(['8G'] * $n))")
  gap=$(gap_bytes "$nodes") || fail "plan at $n nodes has no read_bytes_per_token"
  TP_COMM_SIM_LATENCY_US=$lat timeout 200 "$TPSERVE" launch -n "$n" -- "$TPSERVE" bench comm \
    --decode "$EMBD" --gap-bytes "$gap" ${GAP_ARGS[@]+"${GAP_ARGS[@]}"} --iters "$iters" --sync --json >"$WORK/comm-$tag.json" 2>"$WORK/err" ||
    { cat "$WORK/err"; fail "bench comm at $n ranks ($tag)"; }
  timeout 120 "$TPSERVE" plan -m "$MODEL" --nodes "$nodes" --comm-json "$WORK/comm-$tag.json" --json \
    >"$WORK/plan-$tag.json" 2>"$WORK/err" || { cat "$WORK/err"; fail "plan at $n nodes ($tag)"; }
  TP_COMM_SIM_LATENCY_US=$lat timeout 300 "$TPSERVE" launch -n "$n" -- "$TPSERVE" bench gen -m "$MODEL" -p 0 \
    -n "$ntok" -r 2 -t 1 --bw-mib 64 --comm-sync --json >"$WORK/gen-$tag.json" 2>"$WORK/err" ||
    { cat "$WORK/err"; fail "bench gen at $n ranks ($tag)"; }
}

STATUS=0
for N in ${TP_PLAN_RANKS:-2 4}; do
  measure "$N" 0 "$STEPS" 32 "$N"
  measure "$N" "$LAT_US" 16 16 "$N-lat"
  python3 - "$WORK" "$N" "$LAT_US" "${TP_PLAN_CHECK_TIME:-0}" <<'PY' || STATUS=1
import json, sys
work, n, lat, check_time = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
def gen(tag):
    line = [l for l in open(f"{work}/gen-{tag}.json") if '{' in l][-1]
    return json.loads(line[line.index('{'):])
plan, g = json.load(open(f"{work}/plan-{n}.json")), gen(f"{n}")
plan_l, g_l = json.load(open(f"{work}/plan-{n}-lat.json")), gen(f"{n}-lat")
pb, mb = plan["wire_bytes_per_token"], g["bytes_per_token"]
print(f"{n} ranks: bytes/token plan {pb:.0f} measured {mb:.0f} ({pb / mb - 1:+.2%})")
print(f"  loopback: comm ms/token plan {plan['comm_ms']:.3f} (all_sum {plan['allsum_us_measured']:.1f} us) "
      f"measured {g['comm_sync_ms_per_token']:.3f} after all ranks entered, {g['comm_ms_per_token']:.3f} rank 0's "
      f"wall time in collectives")
assert plan.get("header_us_measured", 0) > 0 and plan.get("gather_us_measured", 0) > 0, \
    "plan --comm-json took no step header / argmax gather time from bench comm --decode"
p0, m0 = plan["comm_ms"], g["comm_sync_ms_per_token"]
print(f"  loopback: plan {p0 / m0 - 1:+.1%} (header {plan['header_us_measured']:.1f} us, gather "
      f"{plan['gather_us_measured']:.1f} us)")
calls = g.get("comm_sync_us_per_call")
if calls:
    per_token = (calls["step header"] + 2 * plan["n_layer"] * calls["all_sum"] + calls["argmax gather"]) / 1e3
    print(f"  per-call means give {per_token:.3f} ms/token")
    print("  loopback, per call (us): " + ", ".join(
        f"{w} plan {plan[k]:.1f} measured {calls[w]:.1f}" for w, k in (
            ("step header", "header_us_measured"), ("all_sum", "allsum_us_measured"),
            ("argmax gather", "gather_us_measured"))) +
        f"; rank 0 waiting for the last rank {g['comm_wait_ms_per_token']:.3f} ms/token")
pt, mt = plan_l["comm_ms"], g_l["comm_sync_ms_per_token"]
print(f"  {lat} us link latency: comm ms/token plan {pt:.3f} ({plan_l['comm_rounds_per_token']} rounds, all_sum "
      f"{plan_l['allsum_us_measured']:.1f} us) measured {mt:.3f} ({pt / mt - 1:+.1%}; rank 0's wall time "
      f"{g_l['comm_ms_per_token']:.3f})")
assert g["ranks"] == n and mb > 0 and mt > 0, g
assert abs(pb / mb - 1) <= 0.05, "bytes per token off by more than 5%"
if check_time:
    assert abs(p0 / m0 - 1) <= 0.25, "communication time on loopback off by more than 25%"
    assert abs(pt / mt - 1) <= 0.25, "communication time off by more than 25%"
PY
done
[ $STATUS -eq 0 ] || fail "plan and measurement disagree"
echo "PASS"
