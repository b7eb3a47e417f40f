#!/usr/bin/env bash
# What DPO costs against supervised fine-tuning on the same model and data (issue 31): a Llama of
# the 1B preset's width cut to 2 layers with a 32000-token vocabulary (Llama 2's tokenizer), and
# 512 preference pairs of Alpaca-sample prompts. SFT trains on the prompt + chosen rows only
# (Alpaca records: prompt masked, the chosen answer trained); DPO on the pairs, full fine-tune (a
# frozen sharded reference copy) and LoRA (the base with adapters off), each micro-batch 2 pairs =
# 4 rows against SFT's 4 rows. One process, one after another: tokens/s over the second half
# (tokens of every row DPO computes, policy rows only: the reference forward is the overhead) and
# the tracked peak.
#   bench/dpo.sh [STEPS=20] [WORKDIR=/tmp/shardlm_dpo_bench]
set -euo pipefail
shardlm=$(realpath "${SHARDLM:-$(dirname "$0")/../build/shardlm}")
cd "$(dirname "$0")/.."
steps=${1:-20}
work=${2:-/tmp/shardlm_dpo_bench}
data=$(realpath ../shared/data)
rm -rf "$work" && mkdir -p "$work"
"$shardlm" init --preset llama3.2-1b --out "$work/init" --seed 0 --set num_hidden_layers=2 --set vocab_size=32000 \
  --set tie_word_embeddings=false --set bos_token_id=1 --set eos_token_id=2 >/dev/null
cp "$data/llama2_tokenizer.model" "$work/init/tokenizer.model"
/usr/bin/python3 - "$data/alpaca_en_demo.json" "$work" <<'PY'
import json, sys
recs = json.load(open(sys.argv[1]))[:512]
with open(f"{sys.argv[2]}/pairs.jsonl", "w") as f, open(f"{sys.argv[2]}/sft.jsonl", "w") as g:
    for i, r in enumerate(recs):
        prompt = r["instruction"] + ("\n" + r["input"] if r.get("input") else "")
        rejected = recs[(i + 1) % len(recs)]["output"]  # another record's answer
        f.write(json.dumps({"prompt": prompt, "chosen": r["output"], "rejected": rejected}) + "\n")
        g.write(json.dumps({"instruction": prompt, "output": r["output"]}) + "\n")
PY
echo "dpo: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; OMP_NUM_THREADS=${OMP_NUM_THREADS:-all};" \
  "load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC'); $steps steps, seq_len 256"
common=(model="$work/init" seq_len=256 max_steps="$steps" eval_every=0 eval_batches=1 progress=none
        "optimizer={lr: 1e-5}" "lr_scheduler={type: constant}" data.eval_fraction=0)
run() {  # name, then overrides
  local name=$1
  shift
  cat > "$work/$name.yaml" <<YAML
model: x
output_dir: $work/$name
data: {train: x}
YAML
  "$shardlm" train --config "$work/$name.yaml" "${common[@]}" "$@" >/dev/null 2>"$work/$name.log" ||
    { cat "$work/$name.log"; exit 1; }
  /usr/bin/python3 - "$work/$name/metrics.jsonl" "$name" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "grad_norm" in r]
half = steps[len(steps) // 2:]
tps = sum(r["tokens_per_s"] for r in half) / len(half)
peak = max(r.get("mem_peak_bytes", 0) for r in rows)
print(f"{sys.argv[2]:10s} {tps:8.0f} tok/s (2nd half)  tracked peak {peak / 2**20:7.1f} MiB  last loss {steps[-1]['loss']:.4f}")
PY
}
run sft data.train="$work/sft.jsonl" data.packing=false micro_batch_size=4
run dpo data.train="$work/pairs.jsonl" micro_batch_size=2 "dpo={beta: 0.1}"
run sft-lora data.train="$work/sft.jsonl" data.packing=false micro_batch_size=4 "lora={rank: 16, alpha: 32}"
run dpo-lora data.train="$work/pairs.jsonl" micro_batch_size=2 "dpo={beta: 0.1}" "lora={rank: 16, alpha: 32}"
