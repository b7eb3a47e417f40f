#!/usr/bin/env bash
# Write errors (disk full, a file-size limit) during a checkpoint and during the final save, tested
# with RLIMIT_FSIZE (ulimit -f): the run ends with one line naming the file and the error and a
# non-zero exit; the previous complete checkpoint is untouched and resumable; no partial file is
# left under a final name (checkpoint shards, metadata, model.safetensors).
# Usage: write_errors.sh SHARDLM WORKDIR
set -euo pipefail
shardlm=$1
work=$2
rm -rf "$work" && mkdir -p "$work"

"$shardlm" init --preset tiny --out "$work/init" --seed 3 >/dev/null
cat > "$work/run.yaml" <<YAML
model: $work/init
output_dir: $work/out
data: {train: builtin:addition, digits: 2, train_examples: 2000, eval_examples: 32}
seq_len: 16
micro_batch_size: 4
max_steps: 4
eval_every: 0
accuracy_examples: 0
progress: none
YAML
ckpts=$work/out/checkpoints

# 1. A complete checkpoint at step 2, written without any limit.
"$shardlm" train --config "$work/run.yaml" max_steps=2 save_every=2 >/dev/null
test -f "$ckpts/step_00000002/COMPLETE"
sum_before=$(cd "$ckpts/step_00000002" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum)

# 2. Resumed under a 1 MiB file-size limit: the step-4 checkpoint's shard (~2.4 MB of f32 state)
#    cannot be written.
set +e
msg=$( (ulimit -f 1024; "$shardlm" train --config "$work/run.yaml" save_every=2 resume_from=auto) 2>&1 >/dev/null)
rc=$?
set -e
echo "checkpoint under ulimit -f 1024: exit $rc: $msg"
[[ $rc -ne 0 ]] || { echo "FAIL: the run did not fail"; exit 1; }
[[ $(printf '%s\n' "$msg" | grep -c 'error') -eq 1 ]] || { echo "FAIL: expected one error line"; exit 1; }
printf '%s' "$msg" | grep -q 'step_00000004/rank_00000.safetensors' || { echo "FAIL: the file is not named"; exit 1; }
printf '%s' "$msg" | grep -q 'File too large' || { echo "FAIL: the error is not named"; exit 1; }
[[ ! -e "$ckpts/step_00000004/COMPLETE" ]] || { echo "FAIL: an incomplete checkpoint is marked complete"; exit 1; }
[[ ! -e "$ckpts/step_00000004/rank_00000.safetensors" ]] || { echo "FAIL: a partial shard under its final name"; exit 1; }
if ls "$ckpts/step_00000004" 2>/dev/null | grep -q '\.tmp\.'; then echo "FAIL: a temporary file was left"; exit 1; fi
sum_after=$(cd "$ckpts/step_00000002" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum)
[[ "$sum_before" == "$sum_after" ]] || { echo "FAIL: the step-2 checkpoint changed"; exit 1; }

# 3. The step-2 checkpoint still resumes (the interrupted step-4 directory is skipped).
"$shardlm" train --config "$work/run.yaml" save_every=2 resume_from=auto progress=lines >"$work/resume.log" 2>&1
grep -q "skipping $ckpts/step_00000004: no COMPLETE marker" "$work/resume.log"
grep -q "resumed from $ckpts/step_00000002" "$work/resume.log"
test -f "$ckpts/step_00000004/COMPLETE"
test -f "$work/out/model.safetensors"

# 4. The final save of a run without checkpoints under the limit: one line, no model file left.
set +e
msg=$( (ulimit -f 256; "$shardlm" train --config "$work/run.yaml" output_dir="$work/final" max_steps=1) 2>&1 >/dev/null)
rc=$?
set -e
echo "final save under ulimit -f 256: exit $rc: $msg"
[[ $rc -ne 0 && $(printf '%s\n' "$msg" | grep -c 'error') -eq 1 ]] || { echo "FAIL: expected one error line and a non-zero exit"; exit 1; }
printf '%s' "$msg" | grep -q 'model.safetensors' || { echo "FAIL: the file is not named"; exit 1; }
[[ ! -e "$work/final/model.safetensors" ]] || { echo "FAIL: a partial model.safetensors"; exit 1; }
if ls "$work/final" | grep -q '\.tmp\.'; then echo "FAIL: a temporary file was left"; exit 1; fi
# 5. A real full disk (ENOSPC, not a file-size limit): a 1 MiB tmpfs, where the root may mount one.
#    Filled before the run, at the metrics; with room for the metrics only, at the final model; and
#    with room for neither the step-2 checkpoint. Each: exactly one line in all, naming the file.
disk=$work/disk
mkdir -p "$disk"
if mount -t tmpfs -o size=1m tmpfs "$disk" 2>/dev/null; then
  trap 'umount "$disk" 2>/dev/null || true' EXIT
  full_run() {  # full_run NAME BYTES_LEFT_BEFORE EXPECTED_FILE_REGEX [key=value...]
    local name=$1 left=$2 want=$3
    shift 3
    rm -rf "${disk:?}"/*
    mkdir -p "$disk/$name"
    head -c $((1024 * 1024 - left)) /dev/zero > "$disk/filler" 2>/dev/null || true
    set +e
    msg=$("$shardlm" train --config "$work/run.yaml" output_dir="$disk/$name" max_steps=2 "$@" 2>&1 >/dev/null)
    rc=$?
    set -e
    echo "full disk ($name, $left bytes left): exit $rc: $msg"
    [[ $rc -ne 0 && $rc -lt 128 ]] || { echo "FAIL: expected a non-zero exit, not by a signal"; exit 1; }
    [[ $(printf '%s\n' "$msg" | wc -l) -eq 1 ]] || { echo "FAIL: expected exactly one line"; exit 1; }
    printf '%s' "$msg" | grep -Eq "error: .*$want.*No space left on device" || { echo "FAIL: the file or the error is not named"; exit 1; }
  }
  full_run metrics 0 'metrics\.jsonl'
  full_run model 40000 'model\.safetensors'
  full_run checkpoint 40000 'rank_00000\.safetensors' save_every=2
  umount "$disk"
  trap - EXIT
else
  echo "full-disk checks skipped: cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN)"
fi
echo "write error checks passed"
