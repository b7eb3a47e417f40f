#!/usr/bin/env bash
# Configures and builds a sanitized build with clang (used by scripts/sanitize.sh and scripts/fuzz.sh,
# which share the address build):
#   scripts/sanitize/build.sh address [TARGET...]   build-asan/: ASan + UBSan, and the libFuzzer targets
#   scripts/sanitize/build.sh thread [TARGET...]    build-tsan/: ThreadSanitizer
# CUDA is off (device code is not sanitized); -march=native too, so findings replay on any x86-64.
set -euo pipefail
cd "$(dirname "$0")/../.."
kind=$1
shift
case $kind in
  address) dir=build-asan flags=(-DSHARDLM_SANITIZE=address,undefined -DSHARDLM_FUZZ=ON) ;;
  thread) dir=build-tsan flags=(-DSHARDLM_SANITIZE=thread) ;;
  *) echo "build.sh: address or thread, not '$kind'" >&2; exit 2 ;;
esac
scripts/install-deps.sh --test
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -O2: at -O1 the ASan engine tests ran past their 300 s timeouts; at -O2 they take 270-390 s (of
# the x10 sanitized timeouts, bench/RESULTS.md 2026-11-24). -Wno-pass-failed: clang may decline
# the `omp simd` loops and would warn about each.
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-g -O2 -Wno-pass-failed" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  "${flags[@]}" "${launcher[@]}" -DSHARDLM_CUDA=OFF -DSHARDLM_NATIVE=OFF -DSHARDLM_BUILD_TESTS=ON \
  -DSHARDLM_BUILD_BENCH=OFF >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$dir" "${targets[@]}"
