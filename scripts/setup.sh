#!/usr/bin/env bash
# scripts/setup.sh - install what is missing, then configure and build into build/.
#
#   scripts/setup.sh              deps + Release build in build/
#   scripts/setup.sh --deps-only  only check / install the system packages
#   scripts/setup.sh --test-deps  also the packages only the test suite needs
#
# Idempotent: installs only missing packages, reuses an existing build tree.
# Debian/Ubuntu: apt-get when run as root (or with passwordless sudo), else
# prints the exact command.  macOS: Homebrew packages; BLAS is Accelerate.
set -euo pipefail
cd "$(dirname "$0")/.."

# What tpserve needs to build and run.
DEBIAN_PKGS=(build-essential cmake pkg-config libmicrohttpd-dev libcjson-dev libopenblas-dev libssl-dev
             libopenmpi-dev openmpi-bin libibverbs-dev libcunit1-dev)
# What only the test suite needs (scripts/test.sh passes --test-deps).
DEBIAN_TEST_PKGS=(iproute2 python3-yaml             # ops: scripts/netsim (ip, tc), manifest test (YAML)
                  python3-numpy                       # model.gptoss_ref: the independent NumPy gpt-oss reference
                  openssh-server openssh-client curl  # ops: launch --hostfile test (sshd on simulated hosts)
                  chromium                            # server.web_page: the web page in headless Chromium
                  gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user    # scripts/test-arm64.sh
                  ninja-build)                        # scripts/test.sh builds with Ninja where it is installed
BREW_PKGS=(cmake pkg-config libmicrohttpd cjson open-mpi cunit openssl@3)

deps_only=0
for a in "$@"; do
  case "$a" in
    --deps-only) deps_only=1 ;;
    --test-deps) DEBIAN_PKGS+=("${DEBIAN_TEST_PKGS[@]}") ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$a' (try --help)" >&2; exit 2 ;;
  esac
done

install_debian() {
  local missing=()
  for p in "${DEBIAN_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: all system packages present"
    return
  fi
  echo "setup: installing missing packages: ${missing[*]}"
  local cmd=(apt-get install -y --no-install-recommends "${missing[@]}")
  if [ "$(id -u)" -eq 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${cmd[@]}"
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo DEBIAN_FRONTEND=noninteractive apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive "${cmd[@]}"
  else
    echo "setup: not root; run this, then re-run scripts/setup.sh:" >&2
    echo "  sudo apt-get update && sudo ${cmd[*]}" >&2
    exit 1
  fi
}

install_macos() {
  if ! command -v brew >/dev/null; then
    echo "setup: Homebrew not found; install it from brew.sh, then: brew install ${BREW_PKGS[*]}" >&2
    exit 1
  fi
  local missing=()
  for p in "${BREW_PKGS[@]}"; do brew list --versions "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: brew install ${missing[*]}"
    brew install "${missing[@]}"
  fi
  echo "setup: BLAS is Apple Accelerate; RDMA over Thunderbolt 5 needs macOS 26.2+ (rdma_ctl enable)"
}

case "$(uname -s)" in
  Linux)
    if command -v dpkg-query >/dev/null; then install_debian
    else echo "setup: not a Debian/Ubuntu system; install the equivalents of: ${DEBIAN_PKGS[*]}" >&2; fi ;;
  Darwin) install_macos ;;
  *) echo "setup: unsupported system $(uname -s)" >&2; exit 1 ;;
esac

[ "$deps_only" -eq 1 ] && exit 0

jobs=$( (nproc || sysctl -n hw.ncpu) 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
echo "setup: built build/tpserve"
