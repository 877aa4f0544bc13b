#!/usr/bin/env bash
# scripts/test.sh - the whole test suite, as CI runs it (.ci/run calls this).
#
# 1. installs missing system packages, test-only ones too (scripts/setup.sh --deps-only --test-deps)
# 2. Release build with warnings as errors (build/), ctest
# 3. ASan+UBSan build (build-asan/), ctest
# Extra ctest arguments pass through, e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --deps-only --test-deps

jobs=$( (nproc || sysctl -n hw.ncpu) 2>/dev/null || echo 2)
# ctest runs one entry more than there are cores (TP_CTEST_JOBS overrides): the suite waits about as
# much as it computes (op timeouts, restarts, a simulated link: a whole Release ctest keeps its 2
# cores less than half busy), so one more entry fills what the waiting ones leave; the entries whose
# assertion races a timeout are RUN_SERIAL and still run alone.
ctest_jobs=${TP_CTEST_JOBS:-$((jobs + 1))}
export CTEST_OUTPUT_ON_FAILURE=1
# OpenMPI and OpenBLAS keep some memory until exit; suppress only those.
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export OMPI_MCA_plm_rsh_agent=""   # never ssh from tests
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Where ../shared (the test data: tokenizers, models) sits beside the checkout, as in CI, a test
# that needs it must run: a skip for missing shared data becomes a failure (tests/tp_test.h).
if [ -d ../shared/models ]; then
  export TP_REQUIRE_SHARED=1
  echo "test: ../shared found: tests that need its data must run (TP_REQUIRE_SHARED=1)"
else
  echo "test: no ../shared beside this checkout: tests that need its data will show as skipped"
fi

run_build() {
  local dir=$1; shift
  # Ninja where installed: it compiles a target's files without waiting for the libraries the target
  # links (Make's targets build one after another), so both cores stay busy across module boundaries.
  # A tree configured before with another generator keeps it.
  local gen=()
  if command -v ninja >/dev/null &&
     { [ ! -f "$dir/CMakeCache.txt" ] || grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$dir/CMakeCache.txt"; }; then
    gen=(-G Ninja)
  fi
  echo "==== configure $dir (${gen[*]} $*)"
  cmake -S . -B "$dir" "${gen[@]}" "$@" >/dev/null
  echo "==== build $dir"
  cmake --build "$dir" -j "$jobs"
  echo "==== ctest $dir"
  (cd "$dir" && ctest -j "$ctest_jobs" --timeout 600 ${CTEST_ARGS:-} "${EXTRA[@]}")
}

# promtool (the /metrics format check) from Debian's prometheus package, unpacked
# into build-tools/ rather than installed: installing would start a Prometheus service.
tools_dir=$PWD/build-tools
if ! command -v promtool >/dev/null && [ ! -x "$tools_dir/usr/bin/promtool" ] && command -v apt-get >/dev/null; then
  ( mkdir -p "$tools_dir" && cd "$tools_dir" && apt-get download -q prometheus >/dev/null 2>&1 &&
    dpkg -x prometheus_*.deb . && rm -f prometheus_*.deb ) ||
    echo "test: could not fetch promtool (apt-get download prometheus); the metrics format check will skip"
fi
if [ -x "$tools_dir/usr/bin/promtool" ]; then export PATH="$tools_dir/usr/bin:$PATH"; fi

# The npm packages the client and oracle tests use (tests/node/package.json), installed once up
# front so no test depends on another having installed them first.
if command -v npm >/dev/null; then
  (cd tests/node && timeout 600 npm install --no-audit --no-fund --silent >/dev/null 2>&1) ||
    echo "test: npm install failed (offline?): the node client and oracle tests will skip"
  # the Agents SDK and Codex CLI (tests/node/agents: openai 7 and zod 4, kept apart)
  (cd tests/node/agents && timeout 600 npm install --no-audit --no-fund --silent >/dev/null 2>&1) ||
    echo "test: npm install in tests/node/agents failed (offline?): the Agents SDK and Codex tests will skip"
fi

EXTRA=("$@")
start=$(date +%s)
run_build build -DCMAKE_BUILD_TYPE=Release -DTP_FATAL_WARNINGS=ON
scripts/test-arm64.sh   # kernels cross-built for arm64, run under qemu-aarch64
run_build build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTP_FATAL_WARNINGS=ON -DTP_SANITIZE=address,undefined
echo "==== all tests passed in both builds ($(( $(date +%s) - start )) s)"
