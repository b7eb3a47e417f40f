#!/usr/bin/env bash
# Fuzzes every file parser shardlm has with libFuzzer under AddressSanitizer, UndefinedBehavior-
# Sanitizer and LeakSanitizer (clang from Debian), from the seed corpora in fuzz/corpus/.
#   scripts/fuzz.sh                       each target for 1,000,000 executions or 10 minutes
#   scripts/fuzz.sh --seconds 20          each target for 20 s (what CI runs)
#   scripts/fuzz.sh --runs 5000 tiktoken  one target, 5000 executions
# Builds into build-asan/ (scripts/sanitize/build.sh, shared with scripts/sanitize.sh). Inputs that
# grew coverage collect in build-asan/corpus/TARGET; a finding (crash, sanitizer report, leak,
# escaped exception, timeout) is written to build-asan/findings/TARGET/ and the script fails; copy it into fuzz/regressions/TARGET/, where
# the fuzz_replay_TARGET ctest replays it in every build from then on. The last lines are a table
# of targets, executions and results (docs/fuzzing.md).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=1000000
seconds=600
targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done

all=()
mapfile -t all < <(cd fuzz && ls fuzz_*.cpp | sed -n 's/^fuzz_\(.*\)\.cpp$/\1/p')
[[ ${#targets[@]} -gt 0 ]] || targets=("${all[@]}")
# The checkpoint below is trained by the ordinary build's shardlm when there is one (the format is
# the same), which spares compiling the command line under the sanitizers.
cli=build/shardlm
extra=()
[[ -x $cli ]] || { cli=build-asan/shardlm; extra=(shardlm); }
scripts/sanitize/build.sh address "${extra[@]}" "${targets[@]/#/fuzz_}"

# A real checkpoint for the checkpoint_metadata target: its shard files stay fixed while the
# metadata is mutated (see fuzz/fuzz_checkpoint_metadata.cpp); its metadata.json is a seed.
work=build-asan/work
ckpt=$work/run/checkpoints/step_00000002
if [[ ! -f $ckpt/COMPLETE ]]; then
  rm -rf "$work" && mkdir -p "$work"
  export ASAN_OPTIONS=detect_leaks=0
  "$cli" init --preset tiny --out "$work/model" --seed 1 >/dev/null
  "$cli" train --config configs/demo-addition.yaml model="$work/model" output_dir="$work/run" \
    max_steps=2 save_every=2 eval_every=0 accuracy_examples=0 progress=none sharding_strategy=NO_SHARD >/dev/null
  unset ASAN_OPTIONS
fi
export SHARDLM_FUZZ_CHECKPOINT=$PWD/$ckpt

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMP_NUM_THREADS=1
summary=()
failed=0
for t in "${targets[@]}"; do
  corpus=build-asan/corpus/$t findings=build-asan/findings/$t
  mkdir -p "$corpus" "$findings"
  seeds=(fuzz/corpus/"$t")
  [[ $t == checkpoint_metadata ]] && seeds+=("$work/seed") && mkdir -p "$work/seed" && cp "$ckpt/metadata.json" "$work/seed/"
  log=build-asan/$t.log
  status=ok
  build-asan/fuzz/fuzz_"$t" "$corpus" "${seeds[@]}" -runs="$runs" -max_total_time="$seconds" -timeout=20 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$findings/" >"$log" 2>&1 || status=FINDING
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  secs=$(sed -n 's/.*Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\) .*/\1/p' "$log" | tail -1)
  [[ $status == ok ]] || { failed=1; echo "fuzz.sh: $t: finding, see $log and $findings/" >&2; tail -30 "$log" >&2; }
  summary+=("$(printf '%-22s %12s %8s %8s  %s' "$t" "${execs:-?}" "${secs:-$seconds}" "${cov:-?}" "$status")")
done
printf '%-22s %12s %8s %8s  %s\n' target executions seconds coverage result
printf '%s\n' "${summary[@]}"
exit $failed
