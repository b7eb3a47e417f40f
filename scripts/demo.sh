#!/usr/bin/env bash
# The main job: a tiny Llama learns multi-digit addition, from scratch, in a few minutes on a
# laptop-class CPU. shardlm generates the problems itself (no downloads); the held-out problems
# never appear in training. Shows generations before and after, and held-out accuracy.
#   scripts/demo.sh                 (outputs under runs/demo)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
echo "building shardlm ..."
scripts/build.sh -DSHARDLM_BUILD_TESTS=OFF -DSHARDLM_BUILD_BENCH=OFF >/dev/null

shardlm=build/shardlm
out=runs/demo
rm -rf "$out"
$shardlm init --preset tiny --out "$out/init" --seed 0

ask() {  # model dir, then prompts: prints "prompt -> answer (right|wrong)"
  local model=$1
  shift
  for p in "$@"; do
    local got want
    got=$($shardlm generate --model "$model" --prompt "$p" --temperature 0 --max-new-tokens 6 | head -n 1)
    got=${got#"$p"}
    got=$(printf "%s" "$got" | LC_ALL=C tr -cd "[:print:]")  # random weights emit arbitrary bytes
    want=$(( ${p%%+*} + $(echo "${p#*+}" | tr -d '=') ))
    printf '  %-9s -> %-6s %s\n' "$p" "$got" "$([[ "$got" == "$want" ]] && echo right || echo "wrong (want $want)")"
  done
}
questions=("123+456=" "709+218=" "66+934=" "500+500=" "87+9=" "312+699=")

echo
echo "== before training (random weights) =="
ask "$out/init" "${questions[@]}"
echo
echo "== training on 2 ranks, FULL_SHARD (configs/demo-addition.yaml) =="
# Two MPI ranks on this machine, each holding half of the parameters, gradients and optimizer state;
# 32 rows each = the same 64-row global batch as one process.
$shardlm launch --nproc-per-node 2 -- train --config configs/demo-addition.yaml model="$out/init" \
  output_dir="$out/trained" micro_batch_size=32 sharding_strategy=FULL_SHARD progress=lines
echo
echo "== after training =="
ask "$out/trained" "${questions[@]}"
echo
echo "The trained model is a Hugging Face directory: $out/trained (config.json, model.safetensors)."
echo "Try: $shardlm generate --model $out/trained --prompt \"12+34=\" --temperature 0"
