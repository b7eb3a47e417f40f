#!/usr/bin/env bash
# Outputs that survive a crash and a second run (issue 30), through the command line:
#   1. a second run on a busy output_dir is refused, naming the first run's pid and host;
#   2. a full model save killed between its shard renames: loading the directory fails, naming a
#      shard of the other save, instead of silently mixing two models;
#   3. `convert` killed while writing over an existing model: the old model is intact and loads;
#   4. a stop signal while the data is being tokenized ends the run at once, in one line.
# Usage: publish_cli.sh SHARDLM DATA_DIR WORKDIR
set -euo pipefail
shardlm=$1
data=$(cd "$2" && pwd)
work=$3
rm -rf "$work" && mkdir -p "$work"
work=$(cd "$work" && pwd)
fail() { echo "FAIL: $*"; exit 1; }

"$shardlm" init --preset tiny --out "$work/init" --seed 3 >/dev/null
cat > "$work/run.yaml" <<YAML
model: $work/init
output_dir: $work/out
data: {train: builtin:addition, digits: 2, train_examples: 2000, eval_examples: 32}
seq_len: 16
micro_batch_size: 4
max_steps: 2
eval_every: 0
accuracy_examples: 0
progress: none
max_shard_size: 200KB
YAML

# 1. The lock. A long run holds output_dir; a second run on it is refused while it lives.
"$shardlm" train --config "$work/run.yaml" max_steps=1000000 save_on_signal=false >/dev/null 2>&1 &
first=$!
for _ in $(seq 100); do
  grep -q "pid $first " "$work/out/.shardlm.lock" 2>/dev/null && break
  sleep 0.1
done
grep -q "pid $first " "$work/out/.shardlm.lock" || { kill -9 $first; fail "the first run did not take the lock"; }
set +e
msg=$("$shardlm" train --config "$work/run.yaml" 2>&1)
rc=$?
set -e
kill -9 $first; wait $first 2>/dev/null || true
echo "second run on a busy output_dir: exit $rc: $msg"
[[ $rc -ne 0 && $(printf '%s\n' "$msg" | wc -l) -eq 1 ]] || fail "expected one line and a non-zero exit"
printf '%s' "$msg" | grep -q "output_dir is in use by another run (pid $first on host $(hostname)" || fail "the holder is not named"
# The lock died with its holder (kill -9): the next run takes it.
"$shardlm" train --config "$work/run.yaml" >/dev/null

# 2. The full model in output_dir is sharded (200KB shards); a second save with the same shard
#    names is killed just after its first shard is renamed into place.
ls "$work/out" | grep -q 'model-00001-of-0000[2-9].safetensors' || fail "the model is not sharded: $(ls "$work/out")"
set +e
SHARDLM_TEST_KILL_PUBLISHING=1 "$shardlm" train --config "$work/run.yaml" seed=9 >/dev/null 2>&1
rc=$?
set -e
[[ $rc -eq 137 ]] || fail "the save was not killed (exit $rc)"
set +e
msg=$("$shardlm" generate --model "$work/out" --prompt "1+1=" --max-new-tokens 2 2>&1)
rc=$?
set -e
echo "generate on a directory left by a killed save: exit $rc: $msg"
[[ $rc -ne 0 && $(printf '%s\n' "$msg" | wc -l) -eq 1 ]] || fail "expected one line and a non-zero exit"
printf '%s' "$msg" | grep -Eq "model-0000[0-9]-of-0000[0-9]\.safetensors: belongs to another save" || fail "the mixed shard is not named"
# Saving again repairs it.
"$shardlm" train --config "$work/run.yaml" >/dev/null
"$shardlm" generate --model "$work/out" --prompt "1+1=" --max-new-tokens 2 >/dev/null

# 3. convert over an existing model, killed mid-write: the old model stays whole.
"$shardlm" train --config "$work/run.yaml" output_dir="$work/ck" save_every=2 >/dev/null
"$shardlm" convert "$work/ck/checkpoints" --out "$work/conv" --max-shard-size 200KB >/dev/null
before=$("$shardlm" generate --model "$work/conv" --prompt "1+1=" --max-new-tokens 4 --temperature 0 2>/dev/null)
sum_before=$(cd "$work/conv" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum)
"$shardlm" train --config "$work/run.yaml" output_dir="$work/ck2" save_every=2 seed=11 max_steps=4 >/dev/null
set +e
SHARDLM_TEST_KILL_PUBLISHING=1 "$shardlm" convert "$work/ck2/checkpoints" --out "$work/conv" --max-shard-size 200KB >/dev/null 2>&1
rc=$?
set -e
[[ $rc -eq 137 ]] || fail "convert was not killed (exit $rc)"
sum_after=$(cd "$work/conv" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum)
[[ "$sum_before" == "$sum_after" ]] || fail "the old model changed under a killed convert"
after=$("$shardlm" generate --model "$work/conv" --prompt "1+1=" --max-new-tokens 4 --temperature 0 2>/dev/null)
[[ "$before" == "$after" ]] || fail "the old model generates differently: '$before' vs '$after'"
# The convert that completes replaces it whole.
"$shardlm" convert "$work/ck2/checkpoints" --out "$work/conv" --max-shard-size 200KB >/dev/null
sum_new=$(cd "$work/conv" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum)
[[ "$sum_new" != "$sum_before" ]] || fail "the completed convert did not replace the model"
echo "killed convert: the old model intact; the next convert replaced it"

# 4. SIGINT while a text file is tokenized by Llama 2's SentencePiece (several seconds of work):
#    the run ends promptly, in one line.
"$shardlm" init --preset tiny --out "$work/l2" --seed 3 --set vocab_size=32000 >/dev/null
cp "$data/llama2_tokenizer.model" "$work/l2/tokenizer.model"
for _ in 1 2; do cat "$data/tinyshakespeare_input.txt"; done > "$work/big.txt"  # ~5 s to tokenize here
"$shardlm" train --config "$work/run.yaml" model="$work/l2" output_dir="$work/sig" \
  "data={type: text, train: $work/big.txt}" max_steps=1 >"$work/sig.log" 2>&1 &
pid=$!
sleep 1
kill -INT $pid
t0=$(date +%s%N)
set +e
wait $pid
rc=$?
set -e
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "SIGINT while tokenizing: exit $rc after $ms ms: $(cat "$work/sig.log")"
[[ $rc -eq 130 ]] || fail "expected exit 130 (SIGINT)"
[[ $ms -lt 2000 ]] || fail "took $ms ms to stop"
[[ $(wc -l < "$work/sig.log") -eq 1 ]] && grep -q "stopped by a signal before the first step" "$work/sig.log" ||
  fail "expected one line"
echo "publish checks passed"
