#!/usr/bin/env bash
# Configures and builds shardlm into build/ (Release). Extra arguments go to CMake, e.g.
#   scripts/build.sh -DSHARDLM_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build
