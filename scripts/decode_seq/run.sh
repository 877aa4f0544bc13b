#!/usr/bin/env bash
# scripts/decode_seq/run.sh - build decode_seq.c against a Release build's objects and run it: a whole
# synthetic TinyLlama decode step's Q4_0 x16 matmuls on two threads, with and without barriers, against
# a streaming read (decode_seq.c says how).
# Usage: scripts/decode_seq/run.sh BUILD_DIR [reps [SHAPE]]   e.g. scripts/decode_seq/run.sh build 20
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: run.sh BUILD_DIR [reps [SHAPE]]}
shift
[ -d "$build/model/CMakeFiles/tp_model_obj.dir" ] || { echo "run.sh: $build is not a built tpserve tree"; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
objs=$(find "$build/model/CMakeFiles/tp_model_obj.dir" "$build/common/CMakeFiles/tp_common_obj.dir" -name '*.o')
# shellcheck disable=SC2086
cc -std=c11 -O2 -Wall -Wextra -Werror -D_DEFAULT_SOURCE -Imodel/include -Imodel -Icommon/include \
   -o "$out/decode_seq" scripts/decode_seq/decode_seq.c $objs -lm -lpthread -lopenblas -lcjson
"$out/decode_seq" "$@"
