#!/usr/bin/env bash
# scripts/test-arm64.sh - cross-compile the matrix kernels and their unit test
# for arm64 (aarch64-linux-gnu-gcc) and run them under qemu-aarch64 with three
# CPU models: -cpu max (dot product and int8 matrix multiply: the neon-i8mm,
# neon-dotprod and neon kernels, x16 layouts included, all checked against the
# scalar reference), -cpu cortex-a76 (dot product without i8mm: the choice must
# be neon-dotprod) and -cpu cortex-a53 (neither: plain neon).
# The attention (model/forward/attn.c, attn_amx.c, attn_bf16.c) is compiled for arm64 too (its plain C path; the x86
# and bf16 paths compiled out), not run.
# The tests are tests/model/test_kernels.c and test_kernels_mlx.c unchanged, linked with a tiny CUnit
# stand-in (scripts/arm64/).  Exits 0 with a SKIP line when the cross tools
# are missing and cannot be installed (they are in scripts/setup.sh's list).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${TP_ARM64_BUILD:-build-arm64}
cc=aarch64-linux-gnu-gcc
if ! command -v "$cc" >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null || true
  fi
fi
if ! command -v "$cc" >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  echo "test-arm64: SKIP: needs $cc and qemu-aarch64 (Debian: gcc-aarch64-linux-gnu qemu-user)"
  exit 0
fi

mkdir -p "$out/obj"
start=$(date +%s)
jobs=$( (nproc || sysctl -n hw.ncpu) 2>/dev/null || echo 2)
flags=(-std=c11 -O2 -D_DEFAULT_SOURCE -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes
       -Wmissing-prototypes -Werror -I. -Icommon/include -Imodel/include -Imodel -Itests -Iscripts/arm64)
srcs=(model/kernels/kernels*.c model/forward/wtype.c common/*.c tests/model/test_kernels.c tests/model/test_kernels_mlx.c
      scripts/arm64/shim_main.c)

# run_jobs CMD...: start CMD in the background, at most $jobs at a time; wait_jobs: wait for all, 1 if any failed
pids=()
run_jobs() {
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  "$@" &
  pids+=($!)
}
wait_jobs() {
  local rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  pids=()
  return $rc
}

echo "==== arm64: cross-compiling kernels + tests/model/test_kernels.c, test_kernels_mlx.c ($jobs at a time)"
echo "==== arm64: compiling model/forward/attn.c, attn_amx.c, attn_bf16.c"
objs=()
for src in "${srcs[@]}"; do
  obj="$out/obj/$(printf '%s' "${src%.c}" | tr / _).o"
  objs+=("$obj")
  run_jobs "$cc" "${flags[@]}" -c "$src" -o "$obj"
done
# The attention (plain C there; the x86 paths and the AMX tiles compiled out) must build for arm64 too
for f in attn attn_amx attn_bf16; do run_jobs "$cc" "${flags[@]}" -c "model/forward/$f.c" -o "$out/obj/model_forward_$f.o"; done
wait_jobs || { echo "test-arm64: cross-compilation failed"; exit 1; }
"$cc" "${objs[@]}" -o "$out/test_kernels" -lpthread -lm -static

# The three CPU models run at the same time; each log is shown once all have ended.
cpus=(max cortex-a76 cortex-a53)
for cpu in "${cpus[@]}"; do
  run_jobs sh -c 'qemu-aarch64 -cpu "$1" "$2" >"$3" 2>&1' sh "$cpu" "$out/test_kernels" "$out/test_kernels.$cpu.log"
done
status=()
for p in "${pids[@]}"; do
  if wait "$p"; then status+=(0); else status+=(1); fi
done
pids=()
for i in "${!cpus[@]}"; do
  cpu=${cpus[$i]}
  log="$out/test_kernels.$cpu.log"
  echo "==== arm64: qemu-aarch64 -cpu $cpu"
  if [ "${status[$i]}" -ne 0 ]; then
    cat "$log"
    echo "test-arm64: FAILED under -cpu $cpu"
    exit 1
  fi
  grep -E "kernels: ISA|worst|tests," "$log" | sed 's/^/  /'
  case $cpu in max) want=neon-i8mm ;; cortex-a76) want=neon-dotprod ;; *) want=neon ;; esac
  grep -q "kernels: ISA $want " "$log" || { echo "test-arm64: expected ISA $want under -cpu $cpu"; exit 1; }
done
echo "==== arm64: passed ($(( $(date +%s) - start )) s)"
