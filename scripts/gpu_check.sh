#!/usr/bin/env bash
# Every GPU check of the project in one prepared run, for a session that is lent a GPU (issue 33):
# the machine is lent for minutes, so what it must run is decided here, in one command.
#
#   scripts/gpu_check.sh --bundle .device-bundle OUTDIR   on the GPU machine: programs from the bundle
#                                                         that ../shared/tools/device-bundle.sh packs
#   scripts/gpu_check.sh --build build OUTDIR             programs from a build directory (here: every
#                                                         step is then reported skipped, no GPU)
#
# Steps, each under its own time limit, in this order (cheapest and most basic first):
#   env           `shardlm env`: the GPU, CUDA, cuBLASLt and NCCL as shardlm sees them
#   allocator     DeviceMemory.CachingAllocatorAccountingAndReuse (the caching allocator)
#   backend_ops   every CUDA op against the CPU reference (backend_ops_test cuda)
#   nccl_np1      the NCCL collectives on the device, one rank
#   gpu_generate  generation on the GPU against the CPU, logit by logit (tests/gpu_generate_test.cpp)
#   gpu_train     training with device: cuda against the CPU, loss by loss (tests/gpu_train_test.cpp)
#   generate_cli  `generate --device cuda` on a tiny model, greedy, f32: the CPU's text
# OUTDIR gets summary.txt (one line per step: ok, FAIL or skipped, its seconds and exit status) and
# gpu_check.log (every step's output, headed by its command). A step that exits 77 (no GPU) is
# skipped. Exit status: 0 when no step failed.
set -uo pipefail
mode=${1:-}
where=${2:-}
out=${3:-gpu_check_out}
case "$mode" in
  --bundle) run=(bash "$(cd "$where" && pwd)/run.sh"); bin="" ;;
  --build) run=(); bin="$(cd "$where" && pwd)/" ;;
  *) echo "usage: scripts/gpu_check.sh --bundle DIR|--build DIR [OUTDIR]" >&2; exit 2 ;;
esac
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary=$out/summary.txt log=$out/gpu_check.log
: > "$summary"
: > "$log"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# prog NAME: how to run program NAME (the bundle puts every program on PATH; a build has them in
# its root and under tests/).
prog() {
  if [ -z "$bin" ]; then echo "$1"
  elif [ -x "$bin$1" ]; then echo "$bin$1"
  else echo "${bin}tests/$1"; fi
}

# step NAME SECONDS COMMAND...: runs it, logs it, and records ok / FAIL / skipped.
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS rc
  echo "==== $name: $*" >> "$log"
  if declare -F "$1" > /dev/null; then
    "$@" "$limit" >> "$log" 2>&1  # a function of this script: it limits each command it runs
  else
    timeout "$limit" "$@" >> "$log" 2>&1
  fi
  rc=$?
  local verdict=ok
  if [ $rc -eq 77 ]; then verdict=skipped
  elif [ $rc -ne 0 ]; then verdict=FAIL; failures=$((failures + 1)); fi
  [ $rc -eq 124 ] && verdict="FAIL (timed out after ${limit} s)"
  printf '%-13s %-8s %4d s  exit %d\n' "$name" "$verdict" $((SECONDS - t0)) $rc | tee -a "$summary"
}

# gtest PROGRAM ARGS... LIMIT: a GoogleTest program whose tests all report GTEST_SKIP is skipped
# (77), not passed.
gtest() {
  local limit=${*: -1} rc
  timeout "$limit" "${@:1:$#-1}" > "$work/gtest.txt" 2>&1
  rc=$?
  cat "$work/gtest.txt"
  if [ $rc -eq 0 ] && grep -q "^\[  SKIPPED \] [1-9]" "$work/gtest.txt" && ! grep -q "^\[  PASSED  \] [1-9]" "$work/gtest.txt"; then
    return 77
  fi
  return $rc
}

# generate_cli SHARDLM LIMIT: a tiny model's greedy continuation on the GPU and on the CPU, f32: the
# same text. 77 where `--device cuda` says there is no GPU.
generate_cli() {
  local shardlm=$1 limit=$2
  local t=(timeout "$limit" "${run[@]}" "$shardlm")
  "${t[@]}" init --preset tiny --out "$work/tiny" --seed 3 > /dev/null || return 1
  local args=(generate --model "$work/tiny" --prompt "1 2 3 4" --max-new-tokens 24 --temperature 0)
  "${t[@]}" "${args[@]}" --dtype f32 --device cpu > "$work/cpu.txt" 2> "$work/cpu.err" || return 1
  if ! "${t[@]}" "${args[@]}" --dtype f32 --device cuda > "$work/cuda.txt" 2> "$work/cuda.err"; then
    cat "$work/cuda.err"
    grep -q -E "no (usable )?CUDA device|built without CUDA" "$work/cuda.err" && return 77
    return 1
  fi
  cat "$work/cuda.err"
  echo "cpu:  $(cat "$work/cpu.txt")"
  echo "cuda: $(cat "$work/cuda.txt")"
  cmp -s "$work/cpu.txt" "$work/cuda.txt" || { echo "the GPU's greedy text is not the CPU's"; return 1; }
  "${t[@]}" "${args[@]}" --dtype bf16 --device cuda || return 1  # bf16 runs (its text is not checked)
}

step env 60 "${run[@]}" "$(prog shardlm)" env
step allocator 120 gtest "${run[@]}" "$(prog shardlm_tests)" --gtest_filter=DeviceMemory.CachingAllocatorAccountingAndReuse
step backend_ops 600 "${run[@]}" "$(prog backend_ops_test)" cuda
step nccl_np1 120 "${run[@]}" "$(prog shardlm_nccl_tests)" --gpu
step gpu_generate 300 "${run[@]}" "$(prog gpu_generate_test)"
step gpu_train 300 "${run[@]}" "$(prog gpu_train_test)"
step generate_cli 120 generate_cli "$(prog shardlm)"
echo "gpu_check: $failures failed; summary in $summary, output in $log"
[ $failures -eq 0 ]
