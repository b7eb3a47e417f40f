#!/usr/bin/env bash
# Installs the Debian 12 packages shardlm needs, and only those missing (quiet when all present).
#   scripts/install-deps.sh          build dependencies
#   scripts/install-deps.sh --test   build and test dependencies (PyTorch, SentencePiece, gtest, and
#                                    clang with libFuzzer for scripts/fuzz.sh and scripts/sanitize.sh)
# Debian's packages are the only source of libraries: nothing is downloaded from anywhere else.
set -euo pipefail

BUILD_PACKAGES=(cmake ninja-build g++ pkg-config libopenblas-dev libopenblas-openmp-dev libdnnl-dev libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libfmt-dev libsentencepiece-dev libpcre2-dev zlib1g-dev
  libcpp-httplib-dev libprotobuf-dev protobuf-compiler)
TEST_PACKAGES=(clang libclang-rt-dev libomp-dev libgtest-dev libgmock-dev libbenchmark-dev python3 python3-torch python3-numpy
  python3-sentencepiece python3-regex python3-jinja2 curl
  python3-protobuf chromium iproute2 util-linux)  # curl and Python talk to shardlm serve; python3-protobuf reads the TensorBoard event files, chromium renders report.html; iproute2 and util-linux (ip, tc, nsenter, unshare) emulate nodes (scripts/cluster/)

packages=("${BUILD_PACKAGES[@]}")
if [[ "${1:-}" == "--test" ]]; then
  packages+=("${TEST_PACKAGES[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "installing: ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "error: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
