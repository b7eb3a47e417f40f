#!/usr/bin/env bash
# Runs the tests under sanitizers (clang's, from Debian):
#   address    AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer over every ctest:
#              unit, finite-difference, PyTorch parity, golden models, the command line and the
#              MPI runs at 1, 2 and 4 ranks (whose rank processes are sanitized too)
#   thread     ThreadSanitizer over the threaded parts, the data prefetch thread, the MPI
#              progress thread and the shared-memory collectives' worker: the Sampler tests,
#              training runs on 1 process and 2 ranks, and the collective tests on 2 ranks
#   scripts/sanitize.sh                  both
#   scripts/sanitize.sh address -R Unit  one kind; further arguments go to ctest
#   scripts/sanitize.sh --quick          the unit tests (ctest label "unit") under address (scripts/test.sh --sanitize)
# Builds into build-asan/ and build-tsan/ (scripts/sanitize/build.sh). Any report fails the test
# that produced it (halt_on_error), so a green run means no report.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
kinds=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1; kinds=(address); shift ;;
    address|thread) kinds+=("$1"); shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) break ;;  # the rest goes to ctest
  esac
done
[[ ${#kinds[@]} -gt 0 ]] || kinds=(address thread)

# Open MPI's memory hooks patch malloc, which the sanitizers own.
export OMPI_MCA_memory=^patcher
# The thread pass runs mpirun itself, which refuses root without these (containers run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

for kind in "${kinds[@]}"; do
  case $kind in
    address)
      if [[ $quick == 1 ]]; then  # only what the unit label needs
        mapfile -t replays < <(cd fuzz && ls fuzz_*.cpp | sed -n 's/^\(fuzz_.*\)\.cpp$/\1/p' | sed 's/^fuzz_/fuzz_replay_/')
        scripts/sanitize/build.sh address shardlm_tests "${replays[@]}"
      else
        scripts/sanitize/build.sh address
      fi
      export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1:check_initialization_order=1
      export LSAN_OPTIONS=suppressions=$PWD/scripts/sanitize/lsan.supp:print_suppressions=0
      export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
      # Leaks are checked in the unit tests (one process each). The other tests start MPI ranks or
      # the command line under mpirun, where Open MPI's plugins allocate once and are unloaded
      # before LeakSanitizer looks, leaving reports no suppression can name: there memory errors
      # and undefined behaviour are checked, leaks not.
      (cd build-asan && ctest --output-on-failure --timeout 1800 -j 2 -L '^unit$' "$@")
      if [[ $quick == 0 ]]; then
        (cd build-asan && ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0 ctest --output-on-failure --timeout 1800 -j 2 \
          -LE '^unit$' "$@")
      fi
      unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
      ;;
    thread)
      scripts/sanitize/build.sh thread shardlm_tests shardlm shardlm_comm_tests
      # OpenMP's runtime is not built for ThreadSanitizer, so its own synchronization would be
      # reported: one OpenMP thread leaves only the threads shardlm starts itself.
      export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1 OMP_NUM_THREADS=1
      build-tsan/tests/shardlm_tests --gtest_filter='Sampler.*' --gtest_brief=1
      # The prefetch thread inside a real training run, on one process and on 2 MPI ranks, where
      # each rank's communication progress thread tests the collectives the main thread issues and
      # waits on (Open MPI itself is not instrumented: ignore_noninstrumented_modules leaves its
      # internals out, so what is checked is shardlm's own hand-off between the two threads).
      work=build-tsan/train
      rm -rf "$work"
      build-tsan/shardlm init --preset tiny --out "$work/model" --seed 1 >/dev/null
      build-tsan/shardlm train --config configs/demo-addition.yaml model="$work/model" output_dir="$work/run" \
        max_steps=20 eval_every=10 accuracy_examples=0 progress=none >/dev/null
      mpirun -np 2 --oversubscribe -x TSAN_OPTIONS -x OMP_NUM_THREADS -x OMPI_MCA_memory \
        build-tsan/shardlm train --config configs/demo-addition.yaml model="$work/model" output_dir="$work/run2" \
        max_steps=20 eval_every=10 accuracy_examples=0 progress=none sharding_strategy=FULL_SHARD \
        forward_prefetch=true >/dev/null
      # The collectives, large ones through the shared window: each rank's worker thread runs
      # them and hands completion to the waiting thread through the progress thread's state.
      mpirun -np 2 --oversubscribe -x TSAN_OPTIONS -x OMP_NUM_THREADS -x OMPI_MCA_memory \
        build-tsan/tests/shardlm_comm_tests --gtest_brief=1
      unset TSAN_OPTIONS OMP_NUM_THREADS
      ;;
  esac
done
echo "sanitize.sh: ${kinds[*]}: no reports"
