#!/usr/bin/env bash
# tests/ops/bench_gen_ranks_test.sh TPSERVE - `tpserve bench gen` reports bytes read per token and
# bandwidth per rank under `tpserve launch`.  Model: a 2-layer synthetic smollm2-135m Q4_0, whose tied
# token embedding (the output head too) is most of its weights.  Oracle: the ranks split the output
# head by vocabulary, so together they read the table once: the bytes the 2 ranks read per token sum
# to the 1-rank figure plus what both hold whole (norms, one embedding row: under 1%), and each reads
# under 60% of it (counting the whole table as every rank's output head would give ~90%).  Every rank
# reports its own probe and fraction.  --depth 0,48: the KV bytes read per step are the model's
# (2 x 2 layers x 3 KV heads x 128-byte f16 rows x the positions read, mean over the 4 steps) at 1 and at 2
# ranks alike (the ranks split the KV heads), and each depth's bound is (weight + KV bytes) / its own
# probe (summed over the ranks).  Then --seqs of a mixture of experts (below).
set -uo pipefail
TPSERVE="$1"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
MODEL="$WORK/model.gguf"
timeout 120 "$TPSERVE" synth --shape smollm2-135m --layers 2 --type q4_0 -q -o "$MODEL" >"$WORK/out" 2>&1 ||
  { cat "$WORK/out"; fail "synth"; }
ARGS=(bench gen -m "$MODEL" -p 0 -n 4 -r 1 -t 1 --bw-mib 64 --depth 0,48 --json)
timeout 120 "$TPSERVE" "${ARGS[@]}" >"$WORK/gen-1.json" 2>"$WORK/err" || { cat "$WORK/err"; fail "bench gen, 1 rank"; }
timeout 120 "$TPSERVE" launch -n 2 -- "$TPSERVE" "${ARGS[@]}" >"$WORK/gen-2.json" 2>"$WORK/err" ||
  { cat "$WORK/err"; fail "bench gen, 2 ranks"; }
python3 - "$WORK/gen-1.json" "$WORK/gen-2.json" <<'PY' || fail "per-rank figures"
import json, sys
def load(path):
    line = [l for l in open(path) if '{' in l][-1]
    return json.loads(line[line.index('{'):])
one, two = load(sys.argv[1]), load(sys.argv[2])
b1, b2 = one["bytes_read_per_token_per_rank"], two["bytes_read_per_token_per_rank"]
print("1 rank:", b1, " 2 ranks:", b2)
assert len(b1) == 1 and b1[0] == one["weight_bytes_per_token"], one
assert len(b2) == 2 and sum(b2) == two["weight_bytes_per_token"], two
assert b1[0] <= sum(b2) <= b1[0] * 1.01, "the ranks together must read the model about once"
assert all(0.4 * b1[0] < b < 0.6 * b1[0] for b in b2), "each rank reads about half"
for k in ("mem_bw_gbs_per_rank", "bw_fraction_per_rank"):
    assert len(two[k]) == 2 and all(v > 0 for v in two[k]), (k, two[k])
assert abs(sum(two["mem_bw_gbs_per_rank"]) - two["mem_bw_gbs"]) <= 0.05 * two["mem_bw_gbs"] + 0.1, two
for run in (one, two):
    d = run["decode_depth"]
    assert [e["depth"] for e in d] == [0, 48], d
    for e in d:
        kv = 2 * 2 * 3 * 128 * (e["depth"] + 2.5)  # positions D+1 .. D+4 read by the 4 steps
        assert e["kv_bytes_per_token"] == kv, (e, kv)
        assert e["mem_bw_gbs"] > 0 and e["ms_per_token"] > 0, e
        bound = (run["weight_bytes_per_token"] + kv) / (e["mem_bw_gbs"] * 1e9) * 1e3
        assert abs(e["bound_ms"] - bound) <= 0.01 * bound + 2e-3, (e, bound)
print("depth rows:", [(e["depth"], e["kv_bytes_per_token"], e["mem_bw_gbs"], e["bound_ms"]) for e in two["decode_depth"]])
PY
# Mixture of experts, --seqs: test-tiny-qwen3moe F32 (8 experts, top 3, 2 layers, each expert 3 matrices of
# 64 x 64 floats = 49152 bytes).  Oracles: one token selects exactly 3 distinct experts per layer; 4 tokens
# at least 3 and at most 8; every row's expert bytes per step are its experts per layer x 2 layers x 49152;
# the predicted ratio is (non-expert bytes + the step's expert bytes) / (the same for one token), the
# non-expert bytes being the decode's active bytes less one token's 3 x 2 x 49152.  Each row's split of rank
# 0's step (rank0_ms) sums to its step time.
MOE="$WORK/moe.gguf"
timeout 120 "$TPSERVE" synth --shape test-tiny-qwen3moe --type f32 -q -o "$MOE" >"$WORK/out" 2>&1 ||
  { cat "$WORK/out"; fail "synth moe"; }
timeout 120 "$TPSERVE" bench gen -m "$MOE" -p 0 -n 4 -r 1 -t 1 --bw-mib 64 --seqs 1,4 --json >"$WORK/moe.json" \
  2>"$WORK/err" || { cat "$WORK/err"; fail "bench gen --seqs, moe"; }
python3 - "$WORK/moe.json" <<'PY' || fail "moe --seqs prediction"
import json, sys
line = [l for l in open(sys.argv[1]) if '{' in l][-1]
r = json.loads(line[line.index('{'):])
one, four = r["seq_steps"]
print(one, four)
per = 3 * 64 * 64 * 4
assert one["seqs"] == 1 and abs(one["experts_per_layer"] - 3.0) < 1e-9, one
assert four["seqs"] == 4 and 3.0 <= four["experts_per_layer"] <= 8.0, four
for s in (one, four):
    assert abs(s["expert_bytes_per_step"] - s["experts_per_layer"] * 2 * per) <= 0.01 * 2 * per, s
other = r["weight_bytes_per_token"] - 3 * 2 * per
want = (other + four["expert_bytes_per_step"]) / (other + 3 * 2 * per)
assert abs(one["bytes_ratio"] - 1.0) < 1e-3 and abs(four["bytes_ratio"] - want) <= 2e-3, (want, four)
# each row's split of rank 0's step: the matmuls ran, the four parts are >= 0 (rest may be a hair
# under 0 from timer rounding), the three timed parts fit in the forward calls and the parts sum to
# the step (rest is the step less the three: a mean of every rep against step_ms' median of 1 rep)
for s in (one, four):
    ph = s["rank0_ms"]
    assert ph["matmul"] > 0 and ph["attn"] >= 0 and ph["prep"] >= 0 and ph["rest"] > -0.01, s
    assert ph["matmul"] + ph["attn"] + ph["prep"] <= ph["forward"] * 1.001 + 1e-3, s
    total = ph["matmul"] + ph["attn"] + ph["prep"] + ph["rest"]
    assert abs(total - s["step_ms"]) <= 0.01 * s["step_ms"] + 1e-3, (total, s)
PY
echo PASS
