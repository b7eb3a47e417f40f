#!/usr/bin/env bash
# Every example configuration under configs/ works from a checkout alone: the files a user gets
# (configs/ and data/, nothing from ../shared) are copied into a fresh directory, and from there,
# for each configs/*.yaml, with a tiny random model written where the config's `model:` points:
#   shardlm data-preview --config configs/X.yaml -n 1
#   shardlm train --config configs/X.yaml max_steps=1 (plus cheap eval settings), through
#   `shardlm launch --nproc-per-node N` when the config's header says to launch it that way.
# Only the step count and the eval/progress settings are overridden: data paths, strategy, batch
# shape and sequence length are the config's own. A new config is covered without editing this.
# Usage: example_configs.sh SHARDLM SOURCE_DIR WORKDIR [mpi|nompi]
set -euo pipefail
shardlm=$1
src=$2
work=$3
mpi=${4:-mpi}
rm -rf "$work" && mkdir -p "$work/checkout"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

# The checkout: what git tracks under configs/ and data/ (everything there, without git).
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$src" && git ls-files -co --exclude-standard configs data) | while read -r f; do
    mkdir -p "$work/checkout/$(dirname "$f")" && cp "$src/$f" "$work/checkout/$f"
  done
else
  cp -r "$src/configs" "$src/data" "$work/checkout/"
fi
cd "$work/checkout"

n=0
for cfg in configs/*.yaml; do
  name=$(basename "$cfg" .yaml)
  model=$(sed -n 's/^model: *\([^ #]*\).*/\1/p' "$cfg")
  [[ -n "$model" ]] || { echo "FAIL $cfg: no model: line"; exit 1; }
  # A stand-in for the model the config names (a real checkpoint where it wants one): tiny, with
  # room for any seq_len an example uses.
  if [[ ! -f "$model/config.json" ]]; then
    "$shardlm" init --preset tiny --out "$model" --set max_position_embeddings=4096 >/dev/null
  fi
  echo "== $cfg (model $model)"
  "$shardlm" data-preview --config "$cfg" -n 1 > "$work/$name.preview.txt" ||
    { cat "$work/$name.preview.txt"; echo "FAIL $cfg: data-preview"; exit 1; }
  head -n 3 "$work/$name.preview.txt"
  overrides=(max_steps=1 eval_every=0 eval_batches=1 accuracy_examples=4 progress=none)
  nproc=$(sed -n 's/^#.*shardlm launch --nproc-per-node \([0-9]*\).*/\1/p' "$cfg" | head -n 1)
  start=$SECONDS
  if [[ -n "$nproc" ]]; then
    if [[ "$mpi" != mpi ]]; then
      echo "   (this build has no MPI: $cfg needs $nproc ranks; data-preview only)"
      n=$((n + 1))
      continue
    fi
    "$shardlm" launch --nproc-per-node "$nproc" --threads-per-rank 1 -- train --config "$cfg" "${overrides[@]}" \
      > "$work/$name.train.txt" 2>&1 || { cat "$work/$name.train.txt"; echo "FAIL $cfg: train on $nproc ranks"; exit 1; }
  else
    "$shardlm" train --config "$cfg" "${overrides[@]}" > "$work/$name.train.txt" 2>&1 ||
      { cat "$work/$name.train.txt"; echo "FAIL $cfg: train"; exit 1; }
  fi
  out=$(sed -n 's/^output_dir: *\([^ #]*\).*/\1/p' "$cfg")
  saved=("$out/config.json")
  # A LoRA run (a lora: section) writes a PEFT adapter in output_dir/adapter, and with
  # merge_on_save: true the merged model in output_dir/merged.
  if grep -q '^lora:' "$cfg"; then
    saved=("$out/adapter/adapter_config.json" "$out/adapter/adapter_model.safetensors")
    grep -q '^ *merge_on_save: *true' "$cfg" && saved+=("$out/merged/config.json")
  fi
  for f in "${saved[@]}" "$out/metrics.jsonl"; do
    [[ -f "$f" ]] || { cat "$work/$name.train.txt"; echo "FAIL $cfg: no $f"; exit 1; }
  done
  echo "   trained 1 step${nproc:+ on $nproc ranks} in $((SECONDS - start)) s, saved $out"
  n=$((n + 1))
done
[[ $n -gt 0 ]] || { echo "FAIL: no configs found"; exit 1; }
echo "all $n example configs work from a checkout"
