#!/usr/bin/env bash
# report_to: tensorboard and report.html (docs/reports.md), end to end through `shardlm train`:
#  1. a tiny model trained for a few steps with report_to: tensorboard writes one event file in
#     output_dir/runs; Python (Debian's python3-protobuf, messages compiled from the same
#     src/report/event.proto by protoc) reads it record by record: both masked CRC-32Cs of every
#     TFRecord (computed by an independent bitwise CRC here) are right, the first event is the file
#     version, and each following event is one metrics.jsonl record: same step, one scalar per number
#     of the record under the documented tag, equal to the record's value rounded to float32;
#  2. report.html is written, one file with nothing fetched from the network;
#  3. on 2 ranks (when MPI is built) only rank 0 writes: one event file, as many events as records;
#     logging_dir and the list form of report_to (accelerate's log_with) are honoured;
#  4. report_to: wandb, and none with tensorboard, fail naming the key; report_to: none writes no
#     event file.
# The run's output_dir stays in WORKDIR/out for the browser check (report_html_browser.sh).
# Usage: tensorboard_cli.sh SHARDLM PYTHON PROTOC SRCDIR WORKDIR [mpi]
set -euo pipefail
shardlm=$1
py=$2
protoc=$3
src=$4
work=$5
mpi=${6:-}
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "FAIL: $*"; exit 1; }

"$shardlm" init --preset tiny --out "$work/init" --seed 3 >/dev/null
cat > "$work/run.yaml" <<YAML
model: $work/init
output_dir: $work/out
data: {train: builtin:addition, digits: 2, train_examples: 2000, eval_examples: 32}
seq_len: 16
micro_batch_size: 8
max_steps: 7
optimizer: {lr: 1e-3}
lr_scheduler: {type: cosine, warmup_steps: 2}
eval_every: 3
accuracy_examples: 8
save_every: 5
progress: lines
report_to: tensorboard
YAML
"$shardlm" train --config "$work/run.yaml" > "$work/train.log" 2>&1 || { cat "$work/train.log"; fail "training failed"; }
grep -q "TensorBoard events: $work/out/runs/events.out.tfevents" "$work/train.log" \
  || { cat "$work/train.log"; fail "the run did not name its event file"; }

# The messages, compiled from the same .proto the product compiles.
mkdir -p "$work/pb"
"$protoc" --python_out="$work/pb" -I"$src/src/report" "$src/src/report/event.proto"

cat > "$work/check_events.py" <<'PY'
import glob, json, math, os, struct, sys
sys.path.insert(0, sys.argv[1])
import event_pb2  # compiled by protoc from src/report/event.proto

def crc32c(data):  # bit by bit, independent of the product's table
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF

def read_records(path):
    buf = open(path, "rb").read()
    pos, out = 0, []
    while pos < len(buf):
        assert pos + 12 <= len(buf), f"{path}: truncated header at byte {pos}"
        header = buf[pos:pos + 8]
        (n,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", buf[pos + 8:pos + 12])
        assert hcrc == masked(header), f"{path}: bad length CRC at byte {pos}"
        data = buf[pos + 12:pos + 12 + n]
        assert len(data) == n, f"{path}: truncated record at byte {pos}"
        (dcrc,) = struct.unpack("<I", buf[pos + 12 + n:pos + 16 + n])
        assert dcrc == masked(data), f"{path}: bad data CRC at byte {pos}"
        out.append(data)
        pos += 16 + n
    return out

def tag_of(key):  # the rule docs/reports.md states
    if key.startswith("eval_"): return "eval/" + key[5:]
    if key.startswith(("mem_", "rss_", "gpu_")): return "memory/" + key
    if key.startswith("checkpoint_"): return "checkpoint/" + key
    return "train/" + key

def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]

logdir, metrics = sys.argv[2], sys.argv[3]
files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
assert len(files) == 1, f"expected one event file in {logdir}, got {files}"
records = [json.loads(l) for l in open(metrics)]
raw = read_records(files[0])
events = []
for data in raw:
    e = event_pb2.Event()
    e.ParseFromString(data)
    assert e.SerializeToString() == data, "the event does not re-encode to the same bytes (unknown fields?)"
    events.append(e)
assert events[0].file_version == "brain.Event:2", events[0]
assert events[0].wall_time > 1.6e9, events[0].wall_time
assert len(events) - 1 == len(records), f"{len(events) - 1} summary events for {len(records)} metrics records"
scalars = 0
tags_seen = set()
for e, r in zip(events[1:], records):
    assert e.WhichOneof("what") == "summary", e
    assert e.step == r["step"], (e.step, r["step"])
    want = {tag_of(k): v for k, v in r.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    got = {v.tag: v.simple_value for v in e.summary.value}
    assert len(got) == len(e.summary.value), "a tag repeated within one event"
    assert set(got) == set(want), f"step {r['step']}: tags {sorted(set(got) ^ set(want))} differ"
    for tag, v in want.items():
        assert math.isclose(got[tag], f32(v), rel_tol=0, abs_tol=0) or (math.isnan(v) and math.isnan(got[tag])), \
            f"step {r['step']} {tag}: event {got[tag]!r}, metrics {v!r}"
    scalars += len(got)
    tags_seen |= set(got)
for t in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "eval/loss", "eval/accuracy",
          "memory/mem_live_parameters", "memory/mem_peak_optimizer", "memory/rss_bytes") + \
        (("checkpoint/checkpoint_bytes",) if any("checkpoint" in r for r in records) else ()):
    assert t in tags_seen, f"no {t} scalar"
steps = sorted({r["step"] for r in records if "lr" in r})
print(f"{len(raw)} TFRecords with correct CRCs in {os.path.basename(files[0])}; {len(records)} events equal the "
      f"{len(records)} metrics records ({scalars} scalars, {len(tags_seen)} tags, steps {steps[0]}..{steps[-1]})")
PY
echo "1. $("$py" "$work/check_events.py" "$work/pb" "$work/out/runs" "$work/out/metrics.jsonl")" \
  || fail "event file check"

# ---- 2. report.html: one self-contained file ----
html=$work/out/report.html
[[ -s "$html" ]] || fail "no report.html"
grep -Eiq '<(script|img|link|iframe)[^>]+(src|href)=' "$html" && fail "report.html loads something from outside"
grep -Eo 'https?://[^"'"'"' )]*' "$html" | grep -v '^http://www.w3.org/2000/svg$' && fail "report.html names a URL"
echo "2. report.html: $(wc -c < "$html") bytes, no external resources"

# ---- 3. rank 0 only, logging_dir, the list form ----
if [[ "$mpi" == mpi ]]; then
  "$shardlm" launch --nproc-per-node 2 -- train --config "$work/run.yaml" output_dir="$work/out2" save_every=0 \
    logging_dir="$work/tb2" 'report_to=[tensorboard]' > "$work/train2.log" 2>&1 \
    || { cat "$work/train2.log"; fail "2-rank training failed"; }
  [[ ! -e "$work/out2/runs" ]] || fail "logging_dir was not used (output_dir/runs exists)"
  "$py" "$work/check_events.py" "$work/pb" "$work/tb2" "$work/out2/metrics.jsonl" > "$work/check2.log" \
    || { cat "$work/check2.log"; fail "2-rank event file"; }
  echo "3. 2 ranks: one event file (rank 0), in logging_dir, equal to metrics.jsonl"
else
  echo "3. skipped: this build has no MPI"
fi

# ---- 4. bad values, none ----
for bad in "report_to=wandb" "report_to=[tensorboard,none]" "report_to={a: 1}"; do
  if "$shardlm" train --config "$work/run.yaml" output_dir="$work/bad" "$bad" > "$work/bad.log" 2>&1; then
    fail "$bad was accepted"
  fi
  grep -q "key 'report_to'" "$work/bad.log" || { cat "$work/bad.log"; fail "$bad: the error does not name report_to"; }
  [[ ! -e "$work/bad" ]] || fail "$bad: output_dir was created"
done
"$shardlm" train --config "$work/run.yaml" output_dir="$work/none" report_to=none save_every=0 max_steps=2 \
  > "$work/none.log" 2>&1 || { cat "$work/none.log"; fail "report_to=none run failed"; }
[[ ! -e "$work/none/runs" ]] || fail "report_to: none wrote event files"
[[ -s "$work/none/report.html" ]] || fail "report_to: none: no report.html"
echo "4. $(grep -o "key 'report_to'.*" "$work/bad.log" | head -c 150); report_to: none writes no events"
echo "PASS"
