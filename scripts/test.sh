#!/usr/bin/env bash
# The test command: installs what is needed (Debian packages), builds, and runs every test.
#   scripts/test.sh              what CI runs: the build and the whole ctest suite (about 20 minutes
#                                on 2 cores)
#   scripts/test.sh --sanitize   the same, then the unit tests again under ASan + UBSan and 10 s of
#                                fuzzing per parser (about 13 minutes more: a second build, with clang)
#   scripts/test.sh -R Parity    only the tests matching a ctest regex
# The sanitizer and fuzzing passes left CI on 2026-11-25 when the suite reached 31 minutes of CI's
# 30-minute budget; the fuzzers' regression inputs still replay in every ctest run (fuzz_replay_*).
# Run --sanitize before landing a change to a parser, to buffers or to threads (docs/fuzzing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=0
if [[ ${1:-} == --sanitize ]]; then
  sanitize=1
  shift
fi
scripts/install-deps.sh --test
scripts/build.sh -DSHARDLM_BUILD_TESTS=ON -DSHARDLM_BUILD_BENCH=ON
cd build
# Two parallel tests on a 2-core machine; each test program limits itself to 2 OpenMP threads.
ctest --output-on-failure --timeout 900 -j 2 "$@"
cd ..
# The unit tests under ASan + UBSan, then every fuzz target for a few seconds from its seeds
# (docs/fuzzing.md; the long runs are scripts/sanitize.sh's and scripts/fuzz.sh's).
if [[ $sanitize == 1 && $# -eq 0 ]]; then
  scripts/sanitize.sh --quick
  scripts/fuzz.sh --seconds 10
fi
