#!/usr/bin/env bash
# Recipes and validate through the command line (docs/recipes.md):
#  1. every built-in recipe validates (`validate --recipe NAME`: its keys as train reads them, and
#     its memory estimate per rank against its max_memory_per_rank, at its world size, with its
#     preset's shape);
#  2. `recipes cp` writes a recipe, refuses to overwrite without --force; the copy validates with
#     --model-preset; an unknown name lists close names;
#  3. validate of a real run (a tiny model, the Alpaca sample): model, tokenizer and data read;
#     failing cases: a missing data file, a budget too small, a bad key — each one line, exit != 0.
# Usage: recipes_cli.sh SHARDLM SOURCE_DIR WORKDIR
set -euo pipefail
shardlm=$1
src=$2
work=$3
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

# 1. Every recipe.
names=$("$shardlm" recipes | awk '$1 ~ /-(single-device|distributed)$/ {print $1}')
n=0
for name in $names; do
  "$shardlm" validate --recipe "$name" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "recipe $name does not validate"; }
  grep -q "fits max_memory_per_rank" "$work/$name.log" || { cat "$work/$name.log"; fail "$name: no memory check"; }
  n=$((n + 1))
done
[[ $n -ge 30 ]] || fail "only $n recipes listed"
echo "$n recipes validate"

# 2. cp.
"$shardlm" recipes cp llama3_1-8b-qlora-single-device "$work/my.yaml" >/dev/null
grep -q "quantize_base: nf4" "$work/my.yaml" || fail "cp wrote the wrong text"
if "$shardlm" recipes cp llama3_1-8b-qlora-single-device "$work/my.yaml" 2> "$work/cp.err"; then fail "cp overwrote"; fi
grep -q "my.yaml exists; pass --force to replace it" "$work/cp.err" || fail "cp error: $(cat "$work/cp.err")"
"$shardlm" recipes cp llama3_1-8b-lora-single-device "$work/my.yaml" --force >/dev/null
grep -q "quantize_base" "$work/my.yaml" && fail "--force did not replace the file"
"$shardlm" validate --config "$work/my.yaml" --model-preset llama3.1-8b | grep -q "valid" || fail "the copy does not validate"
if "$shardlm" recipes cp llama3_1-8b-lora "$work/x.yaml" 2> "$work/unknown.err"; then fail "unknown recipe accepted"; fi
grep -q "unknown recipe 'llama3_1-8b-lora'; close: llama3_1-8b-full-distributed, llama3_1-8b-lora-single-device" "$work/unknown.err" \
  || fail "unknown recipe: $(cat "$work/unknown.err")"

# 3. A real run.
"$shardlm" init --preset tiny --out "$work/tiny" >/dev/null
cat > "$work/run.yaml" <<YAML
model: $work/tiny
output_dir: $work/out
data: {train: $src/data/alpaca_en_demo_sample.json}
seq_len: 256
micro_batch_size: 2
max_memory_per_rank: 1GB
YAML
"$shardlm" validate --config "$work/run.yaml" --world-size 2 > "$work/real.log" || { cat "$work/real.log"; fail "real run"; }
for want in "valid" "tokenizer:" "data:" "FULL_SHARD on 2 ranks" "fits max_memory_per_rank"; do
  grep -q "$want" "$work/real.log" || { cat "$work/real.log"; fail "real run: no '$want'"; }
done
[[ ! -e "$work/out" ]] || fail "validate wrote output_dir"
check_fails() {  # expected message, then validate's arguments
  local want=$1; shift
  if "$shardlm" validate "$@" > /dev/null 2> "$work/err"; then fail "accepted: $*"; fi
  [[ $(wc -l < "$work/err") == 1 ]] || fail "not one line: $(cat "$work/err")"
  grep -qF "$want" "$work/err" || fail "expected '$want', got: $(cat "$work/err")"
}
check_fails "missing.json: cannot open the data file" --config "$work/run.yaml" data.train="$work/missing.json"
check_fails "key 'max_memory_per_rank': 1000 B: the estimated peak per rank" --config "$work/run.yaml" max_memory_per_rank=1KB
check_fails "key 'micro_batch_sizes': unknown key; did you mean 'micro_batch_size'?" --config "$work/run.yaml" micro_batch_sizes=2
check_fails "key 'max_memory_per_rank'" --recipe llama2-70b-full-distributed --world-size 2
echo "recipes and validate CLI checks passed"
