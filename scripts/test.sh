#!/usr/bin/env bash
# The test command: installs what is needed (Debian packages), builds, and runs every test.
#   scripts/test.sh            everything
#   scripts/test.sh -R Parity  only tests matching a ctest regex
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
scripts/build.sh -DSHARDLM_BUILD_TESTS=ON -DSHARDLM_BUILD_BENCH=ON
cd build
# Two parallel tests on a 2-core machine; each test program limits itself to 2 OpenMP threads.
ctest --output-on-failure --timeout 900 -j 2 "$@"
