#!/usr/bin/env bash
# scripts/kx16_ab/run.sh - A/B the AVX-512 K-quant x16 kernels of the working tree against
# those of git revision REV (kx16_ab.c says how), using the objects of a Release build.
# Usage: scripts/kx16_ab/run.sh REV BUILD_DIR [rows cols reps]
#   e.g. scripts/kx16_ab/run.sh main /tmp/build -- prints old (REV) vs new (tree) per token count
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=${1:?usage: run.sh REV BUILD_DIR [rows cols reps]}
build=${2:?usage: run.sh REV BUILD_DIR [rows cols reps]}
shift 2
[ -d "$build/model/CMakeFiles/tp_model_obj.dir" ] || { echo "run.sh: $build is not a built tpserve tree"; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fl=(-std=c11 -O3 -DNDEBUG -D_DEFAULT_SOURCE -Imodel/include -Imodel -Icommon/include)
git show "$rev:model/kernels/kernels_kx16_avx512.c" > "$out/old.c"
cc "${fl[@]}" -Imodel/kernels -Dtp_kern_kx16_avx512_ops=kx16_ab_old_ops -c "$out/old.c" -o "$out/old.o"
cc "${fl[@]}" -c model/kernels/kernels_kx16_avx512.c -o "$out/new.o"
cc "${fl[@]}" -c scripts/kx16_ab/kx16_ab.c -o "$out/ab.o"
objs=$(find "$build/model/CMakeFiles/tp_model_obj.dir" "$build/common/CMakeFiles/tp_common_obj.dir" -name '*.o' \
       ! -name 'kernels_kx16_avx512.c.o')
# shellcheck disable=SC2086
cc -o "$out/kx16_ab" "$out/ab.o" "$out/old.o" "$out/new.o" $objs -lm -lpthread -lopenblas -lcjson
"$out/kx16_ab" "$@"
