#!/usr/bin/env bash
# OpenBLAS's kernels as shardlm picks them (core/platform.h, select_blas_kernels):
#   1. OPENBLAS_CORETYPE given is kept: `shardlm env` reports that core and the variable.
#   2. Without it, on a CPU with AVX2 and FMA, OpenBLAS must not run a pre-AVX core: where
#      OpenBLAS does not recognise the CPU (a model newer than it), shardlm names the core by the
#      CPU's features and re-executes itself. Which of the two happened is printed; on a CPU without
#      AVX2 the check is skipped (exit 77).
#   tests/scripts/blas_core.sh SHARDLM
set -euo pipefail
shardlm=$1
core_of() { sed -n 's/^blas core: //p' <<<"$1"; }

out=$(OPENBLAS_CORETYPE=Prescott "$shardlm" env)
[[ "$(core_of "$out")" == "Prescott (OPENBLAS_CORETYPE=Prescott)" ]] ||
  { echo "FAIL: OPENBLAS_CORETYPE=Prescott was not kept: $(core_of "$out")"; exit 1; }
echo "ok: OPENBLAS_CORETYPE given is kept: $(core_of "$out")"

if ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then
  echo "SKIP: this CPU has no AVX2/FMA, so a generic OpenBLAS core is right here"
  exit 77
fi
out=$(env -u OPENBLAS_CORETYPE "$shardlm" env)
core=$(core_of "$out")
case "${core%% *}" in
  Prescott|Core2|Penryn|Dunnington|Nehalem|Atom|Katmai|Coppermine|Northwood|Banias|Unknown|"")
    echo "FAIL: OpenBLAS runs its generic core '$core' on a CPU with AVX2"; exit 1;;
esac
if [[ "$core" == *OPENBLAS_CORETYPE=* ]]; then
  echo "ok: OpenBLAS did not recognise this CPU; shardlm chose $core and re-executed"
else
  echo "ok: OpenBLAS recognised this CPU itself: $core (the re-execution was not needed here)"
fi
