#!/usr/bin/env bash
# The test command: installs what is needed (Debian packages), builds, and runs every test; then
# the unit tests again under sanitizers and a short fuzzing pass.
#   scripts/test.sh            everything
#   scripts/test.sh -R Parity  only tests matching a ctest regex
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
scripts/build.sh -DSHARDLM_BUILD_TESTS=ON -DSHARDLM_BUILD_BENCH=ON
cd build
# Two parallel tests on a 2-core machine; each test program limits itself to 2 OpenMP threads.
ctest --output-on-failure --timeout 900 -j 2 "$@"
cd ..
# The whole suite only (not a -R selection): the unit tests under ASan + UBSan, then every fuzz
# target for a few seconds from its seeds (docs/fuzzing.md; the long runs are scripts/fuzz.sh's).
if [[ $# -eq 0 ]]; then
  scripts/sanitize.sh --quick
  scripts/fuzz.sh --seconds 10
fi
