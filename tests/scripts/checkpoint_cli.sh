#!/usr/bin/env bash
# Sharded checkpoints end to end through the command line, on CPU ranks (mpirun --oversubscribe):
#  1. resume matrix: a checkpoint saved at step 4 of 8 by 4 ranks with FULL_SHARD is resumed by
#     4 ranks (FULL_SHARD: the final weights are bitwise those of the uninterrupted run), by 2 ranks
#     with SHARD_GRAD_OP and by 1 process (the reduction order differs: losses to 1e-5 relative,
#     weights to 1e-5; 7.5e-9 was measured), and one saved by a 2x2 HYBRID_SHARD mesh resumed by
#     2 NO_SHARD ranks (likewise);
#  2. kill -9 of every rank in the middle of writing the step-6 checkpoint: resume_from: auto skips
#     it with a warning naming it, resumes from step 4, and ends bitwise equal to the uninterrupted run;
#  3. a flipped byte in a shard file: resuming fails before training, in one line naming the file;
#  4. convert: the final model a run with checkpoints writes (converted from its last checkpoint)
#     equals, tensor for tensor, the one a run without checkpoints gathers and saves; a model bigger
#     than the memory cap converts under that cap (peak RSS measured from outside);
#  5. save_every_minutes and keep_last_n: a checkpoint every step by time, only the newest 2 kept.
# Usage: checkpoint_cli.sh SHARDLM WORKDIR
set -euo pipefail
shardlm=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

"$shardlm" init --preset tiny --out "$work/init" --seed 3 >/dev/null
cat > "$work/run.yaml" <<YAML
model: $work/init
output_dir: $work/out
data: {train: builtin:addition, digits: 2, train_examples: 4000, eval_examples: 64}
seq_len: 16
micro_batch_size: 4
max_steps: 8
optimizer: {lr: 1e-3, weight_decay: 0.01}
eval_every: 0
accuracy_examples: 0
progress: none
save_every: 4
YAML
run() { "$shardlm" launch --nproc-per-node "$1" -- train --config "$work/run.yaml" "${@:2}"; }

# Global batch 16 rows: 4 x 4, 2 x 8, 1 x 16.
run 4 output_dir="$work/ref"
run 4 output_dir="$work/gathered" save_every=0
ckpt4="$work/ref/checkpoints/step_00000004"
run 4 output_dir="$work/r4" resume_from="$ckpt4"
run 2 output_dir="$work/r2" resume_from="$ckpt4" micro_batch_size=8 sharding_strategy=SHARD_GRAD_OP
"$shardlm" train --config "$work/run.yaml" output_dir="$work/r1" resume_from="$ckpt4" micro_batch_size=16
# A 2x2 hybrid mesh (replicas split their shard between them when saving) resumed by 2 NO_SHARD ranks.
run 4 output_dir="$work/hybrid" sharding_strategy=HYBRID_SHARD shard_group_size=2
run 2 output_dir="$work/rh" resume_from="$work/hybrid/checkpoints/step_00000004" micro_batch_size=8 \
  sharding_strategy=NO_SHARD

# kill -9 of every rank halfway through writing its file of the step-6 checkpoint.
if SHARDLM_TEST_KILL_DURING_SAVE=6 run 4 output_dir="$work/kill" save_every=2 > "$work/kill1.log" 2>&1; then
  echo "the run meant to be killed during its save exited 0"; exit 1
fi
[[ -d "$work/kill/checkpoints/step_00000006" && ! -e "$work/kill/checkpoints/step_00000006/COMPLETE" ]] ||
  { echo "expected an incomplete step-6 checkpoint"; ls -R "$work/kill/checkpoints"; exit 1; }
run 4 output_dir="$work/kill" save_every=2 resume_from=auto progress=lines > "$work/kill2.log" 2>&1
grep -q "warning: skipping .*step_00000006: no COMPLETE marker" "$work/kill2.log" ||
  { echo "auto did not warn about the incomplete checkpoint:"; cat "$work/kill2.log"; exit 1; }
grep -q "resumed from .*step_00000004" "$work/kill2.log" || { echo "auto did not resume from step 4:"; cat "$work/kill2.log"; exit 1; }

cmp "$work/ref/model.safetensors" "$work/r4/model.safetensors"
cmp "$work/ref/model.safetensors" "$work/kill/model.safetensors"
echo "4 -> 4 ranks and kill -9 during a save + resume_from auto: final weights bitwise equal to the uninterrupted run"

# A flipped byte: caught before training, named.
cp -r "$work/ref/checkpoints/step_00000008" "$work/corrupt"
/usr/bin/python3 - "$work/corrupt/rank_00002.safetensors" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) - 1000] ^= 0x04
open(p, "wb").write(b)
PY
if "$shardlm" train --config "$work/run.yaml" output_dir="$work/rc" resume_from="$work/corrupt" max_steps=9 \
   micro_batch_size=16 > "$work/corrupt.log" 2>&1; then
  echo "training resumed from a corrupt checkpoint"; exit 1
fi
grep -q "rank_00002.safetensors.*checksum mismatch" "$work/corrupt.log" ||
  { echo "the corrupt file is not named:"; cat "$work/corrupt.log"; exit 1; }
[[ $(wc -l < "$work/corrupt.log") -eq 1 ]] || { echo "expected a one-line error:"; cat "$work/corrupt.log"; exit 1; }
echo "corrupt shard: $(cat "$work/corrupt.log")"

# Time-based saves (every step here) and pruning.
run 2 output_dir="$work/timed" save_every=0 save_every_minutes=0.000001 keep_last_n=2 max_steps=4 micro_batch_size=8
[[ "$(ls "$work/timed/checkpoints")" == "$(printf 'step_00000003\nstep_00000004')" ]] ||
  { echo "expected checkpoints 3 and 4 only:"; ls "$work/timed/checkpoints"; exit 1; }
echo "save_every_minutes + keep_last_n 2: $(ls "$work/timed/checkpoints" | tr '\n' ' ')"

"$shardlm" convert "$work/ref/checkpoints" --out "$work/conv" --dtype f32

/usr/bin/python3 - "$work" <<'PY'
import json, struct, sys
import numpy as np
work = sys.argv[1]

def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    head.pop("__metadata__", None)
    out = {}
    for name, t in head.items():
        assert t["dtype"] == "F32", (path, name, t["dtype"])
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(t["shape"])
    return out

def losses(run):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{work}/{run}/metrics.jsonl")) if "loss" in r}

ref, ref_loss = tensors(f"{work}/ref/model.safetensors"), losses("ref")
for run in ("r2", "r1", "rh"):
    got, got_loss = tensors(f"{work}/{run}/model.safetensors"), losses(run)
    assert sorted(got_loss) == [5, 6, 7, 8], (run, sorted(got_loss))
    for s, l in got_loss.items():
        assert abs(l - ref_loss[s]) <= 1e-5 * abs(ref_loss[s]), (run, s, l, ref_loss[s])
    worst = max(float(np.abs(got[k] - ref[k]).max()) for k in ref)
    assert set(got) == set(ref) and worst <= 1e-5, (run, worst)
    print(f"{run}: steps 5-8 losses within 1e-5 of the uninterrupted run, weights within {worst:.2e}")

gathered = tensors(f"{work}/gathered/model.safetensors")
for name, conv in (("the final model converted from the last checkpoint", ref),
                   ("shardlm convert", tensors(f"{work}/conv/model.safetensors"))):
    assert set(conv) == set(gathered) and all(np.array_equal(conv[k], gathered[k]) for k in gathered), name
    print(f"{name}: {len(conv)} tensors equal to the gathered save of a run without checkpoints")
PY

# A model bigger than the cap converts under it: 32.3M parameters = 129 MB in f32 (the checkpoint
# holds 387 MB with the Adam moments); the cap is 64 MB of resident memory (49 MB was measured).
cap_mb=64
"$shardlm" init --preset tiny --out "$work/big" --seed 1 --set hidden_size=384 --set num_hidden_layers=6 \
  --set intermediate_size=1024 --set num_attention_heads=6 --set num_key_value_heads=2 --set vocab_size=32000 >/dev/null
"$shardlm" train --config "$work/run.yaml" model="$work/big" output_dir="$work/bigrun" max_steps=1 save_every=1 \
  micro_batch_size=16 eval_batches=1 >/dev/null
/usr/bin/python3 - "$shardlm" "$work" "$cap_mb" <<'PY'
import os, resource, subprocess, sys
shardlm, work, cap_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
model_mb = os.path.getsize(f"{work}/bigrun/model.safetensors") / 1e6
ckpt = f"{work}/bigrun/checkpoints/step_00000001"
ckpt_mb = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt)) / 1e6
subprocess.run([shardlm, "convert", ckpt, "--out", f"{work}/bigconv", "--dtype", "f32"], check=True)
peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 * 1.048576
assert model_mb > cap_mb, (model_mb, cap_mb)
if os.environ.get("SHARDLM_SANITIZED"):
    # ASan's shadow memory and quarantine are resident too: the bound is the ordinary build's to hold.
    print(f"convert peak RSS {peak_mb:.1f} MB under sanitizers (the {cap_mb} MB cap is checked in the ordinary build)")
    sys.exit(0)
assert peak_mb < cap_mb, f"convert peaked at {peak_mb:.1f} MB, above the {cap_mb} MB cap"
print(f"convert of a {model_mb:.0f} MB model ({ckpt_mb:.0f} MB checkpoint): peak RSS {peak_mb:.1f} MB < cap {cap_mb} MB")
PY
cmp "$work/bigrun/model.safetensors" "$work/bigconv/model.safetensors"
echo "checkpoint CLI checks passed"
