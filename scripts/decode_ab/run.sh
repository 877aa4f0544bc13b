#!/usr/bin/env bash
# scripts/decode_ab/run.sh - A/B the x86 matmul kernels of git revision REV against the working tree's
# for one-token decode from memory, in one process, next to a streaming-read probe of the same bytes
# (decode_ab.c says how), using the objects of a Release build of the tree.
# Usage: scripts/decode_ab/run.sh REV BUILD_DIR ISA TYPE THREADS [reps MB rows cols]
#   ISA: avx512 (kernels_avx512.c + the x16 and K-quant x16 files) or avx2 (kernels_avx2.c + the x16 template)
#   e.g. scripts/decode_ab/run.sh main /tmp/build avx512 q4_0x16 1 15 256
#   PF=l1,l2 in the environment adds the tree at each prefetch level (NTOK=k: k tokens per matmul)
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=${1:?usage: run.sh REV BUILD_DIR ISA TYPE THREADS [reps MB rows cols]}
build=${2:?}; isa=${3:?}; type=${4:?}; threads=${5:?}
reps=${6:-15}; mb=${7:-256}; shift 5; shift $(( $# < 2 ? $# : 2 ))
[ -d "$build/model/CMakeFiles/tp_model_obj.dir" ] || { echo "run.sh: $build is not a built tpserve tree"; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/old/kernels"
for f in kernels_avx512.c kernels_x16_avx512.c kernels_kx16_avx512.c kernels_avx2.c kernels_x16_avx2.c \
         kernels_x86_impl.h kernels_x16_tmpl_impl.h kernels_a8pack_impl.h kernels_impl.h; do
  git show "$rev:model/kernels/$f" > "$out/old/kernels/$f"
done
fl=(-std=c11 -O3 -DNDEBUG -D_DEFAULT_SOURCE -I"$out/old" -Imodel/include -Imodel -Icommon/include)
ren=(-Dtp_kern_avx512_ops=ab_old_avx512_ops -Dtp_kern_x16_avx512_ops=ab_old_x16_avx512_ops
     -Dtp_kern_kx16_avx512_ops=ab_old_kx16_avx512_ops -Dtp_kern_avx2_ops=ab_old_avx2_ops
     -Dtp_kern_x16_avx2_ops=ab_old_x16_avx2_ops)
if [ "$isa" = avx512 ]; then files=(kernels_avx512.c kernels_x16_avx512.c kernels_kx16_avx512.c); fill=avx512
elif [ "$isa" = avx2 ]; then files=(kernels_avx2.c kernels_x16_avx2.c); fill=avx2
else echo "run.sh: ISA is avx512 or avx2"; exit 2; fi
pfv=""; npf=0 # PF=l1,l2: the tree again at each prefetch level (model/kernels.h, tp_kern_force_prefetch)
for l in ${PF:+${PF//,/ }}; do pfv+=", {\"tree pf=$l\", tp_kern_${fill}_ops, \"$l\"}"; npf=$((npf + 1)); done
objs=()
for f in "${files[@]}"; do
  cc "${fl[@]}" "${ren[@]}" -c "$out/old/kernels/$f" -o "$out/old_$f.o"
  objs+=("$out/old_$f.o")
done
cat > "$out/variants.h" <<EOV
void ab_old_${fill}_ops(struct tp_kern_ops *ops);
void tp_kern_${fill}_ops(struct tp_kern_ops *ops);
static const struct variant VARS[] = {{"$rev", ab_old_${fill}_ops, NULL}, {"tree", tp_kern_${fill}_ops, NULL}$pfv};
enum { NV = $((2 + npf)) };
EOV
cc "${fl[@]}" -Imodel/kernels -I"$out" -c scripts/decode_ab/decode_ab.c -o "$out/ab.o"
tree=$(find "$build/model/CMakeFiles/tp_model_obj.dir" "$build/common/CMakeFiles/tp_common_obj.dir" -name '*.o')
# shellcheck disable=SC2086
cc -o "$out/decode_ab" "$out/ab.o" "${objs[@]}" $tree -lm -lpthread -lopenblas -lcjson
"$out/decode_ab" "$type" "$threads" "$reps" "$mb" "$@"
