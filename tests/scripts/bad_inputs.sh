#!/usr/bin/env bash
# The bad-input catalog (issue 14): one table of bad inputs across everything shardlm reads — model
# directories, weights, training YAML and key=value overrides, command-line flags, datasets,
# tokenizers, checkpoints, PEFT adapters, impossible meshes, launch's hostfile. Each row is a name,
# a regular expression and a command; each command must
#   - exit non-zero, and not by a signal (status < 128);
#   - print exactly one line (stdout and stderr together; under `launch`, besides launch's own
#     "shardlm launch: mpirun ..." line), and that line must say "error" and match the expression,
#     which names the file / key / tensor / line / rank at fault;
#   - change nothing that was already there: output_dir (pre-populated with a sentinel file, a model
#     and a complete checkpoint) and every fixture are compared before and after (size, mtime, inode).
# docs/troubleshooting.md is the user's side of this table.
# Usage: bad_inputs.sh SHARDLM DATA_DIR WORKDIR [mpi|nompi]   (nompi: the `launch` rows are skipped)
#        BAD_INPUTS_ONLY=REGEX bad_inputs.sh ...                 (only the rows whose names match)
set -euo pipefail
shardlm=$(realpath "$1")
data=$(cd "$2" && pwd)
work=$3
mpi=${4:-nompi}
rm -rf "$work" && mkdir -p "$work"
work=$(cd "$work" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
start=$SECONDS
S() { timeout 60 "$shardlm" "$@"; }  # a hang is a failure, not a stuck test
py=/usr/bin/python3
fx=$work/fx        # fixtures: every file under it is compared around each row
out=$work/out      # the output_dir of every train row: a previous run's model, checkpoint, sentinel
logs=$work/logs
mkdir -p "$fx" "$logs"

# ---- fixtures ----
m=$fx/tiny                               # the tiny preset (vocab 512, its own tokenizer-free setup)
S init --preset tiny --out "$m" --seed 1 >/dev/null
ml=$fx/tiny_llama2                       # vocab 32000 with Llama 2's tokenizer, for Alpaca data
S init --preset tiny --out "$ml" --seed 1 --set vocab_size=32000 >/dev/null
cp "$data/llama2_tokenizer.model" "$ml/tokenizer.model"
m2=$fx/other                             # another model: 3 layers, hidden 96
S init --preset tiny --out "$m2" --seed 2 --set num_hidden_layers=3 --set hidden_size=96 \
  --set num_attention_heads=6 --set num_key_value_heads=3 >/dev/null

cat > "$fx/run.yaml" <<YAML
model: $m
output_dir: $out
data: {train: builtin:addition, digits: 2, train_examples: 200, eval_examples: 8}
seq_len: 16
micro_batch_size: 4
max_steps: 1
eval_every: 0
accuracy_examples: 0
progress: none
YAML
cat > "$fx/alpaca.yaml" <<YAML
model: $ml
output_dir: $out
data: {type: alpaca, train: $data/alpaca_en_demo.json, eval_fraction: 0.05}
seq_len: 64
micro_batch_size: 2
max_steps: 1
eval_every: 0
progress: none
YAML
cfg=$fx/run.yaml

# output_dir with a model, a complete checkpoint and a sentinel; a checkpoint of the other model.
S train --config "$cfg" save_every=1 >/dev/null 2>&1
echo "do not touch" > "$out/SENTINEL"
ck=$out/checkpoints/step_00000001
[[ -f "$ck/COMPLETE" ]] || { echo "FAIL: fixture checkpoint not written"; ls -R "$out"; exit 1; }
S train --config "$cfg" model="$m2" output_dir="$fx/other_run" save_every=1 >/dev/null 2>&1
ck_other=$fx/other_run/checkpoints/step_00000001
# LoRA adapters of the tiny model and of the other model.
S train --config "$cfg" output_dir="$fx/lora_run" 'lora={rank: 4, alpha: 8}' >/dev/null 2>&1
S train --config "$cfg" model="$m2" output_dir="$fx/lora_other" 'lora={rank: 4, alpha: 8}' >/dev/null 2>&1
adapter=$fx/lora_run/adapter
[[ -f "$adapter/adapter_config.json" && -f "$fx/lora_other/adapter/adapter_config.json" ]] ||
  { echo "FAIL: fixture adapters not written"; exit 1; }

# Bad copies. cfgjson DIR PYTHON-EXPR: edit DIR/config.json (c is the dict).
bad() { rm -rf "$fx/$1" && cp -r "$2" "$fx/$1" && echo "$fx/$1"; }
cfgjson() { "$py" - "$1/config.json" "$2" <<'PY'
import json, sys
p, expr = sys.argv[1], sys.argv[2]
c = json.load(open(p))
exec(expr)
json.dump(c, open(p, "w"), indent=2)
PY
}
# st FILE OP [NAME]: rewrite a safetensors file: drop NAME, add an extra tensor, or NaN into NAME.
st() { "$py" - "$@" <<'PY'
import json, struct, sys
path, op = sys.argv[1], sys.argv[2]
name = sys.argv[3] if len(sys.argv) > 3 else None
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); body = bytearray(raw[8 + n:])
meta = hdr.pop("__metadata__", None)
if op == "drop":  # the tensor and its bytes, the others' offsets moved down
    a, b = hdr.pop(name)["data_offsets"]
    del body[a:b]
    for t in hdr.values():
        if t["data_offsets"][0] >= b: t["data_offsets"] = [o - (b - a) for o in t["data_offsets"]]
elif op == "extra":
    hdr[name] = {"dtype": "F32", "shape": [2], "data_offsets": [len(body), len(body) + 8]}
    body += b"\0" * 8
elif op == "nan":
    a, _ = hdr[name]["data_offsets"]
    body[a:a + 4] = struct.pack("<f", float("nan"))
if meta is not None: hdr["__metadata__"] = meta
h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
open(path, "wb").write(struct.pack("<Q", len(h)) + h + bytes(body))
PY
}

d_noconf=$(bad noconf "$m"); rm "$d_noconf/config.json"
d_badjson=$(bad badjson "$m"); printf '{"hidden_size": 64,\n  "num_hidden_layers": \n' > "$d_badjson/config.json"
d_heads=$(bad heads "$m"); cfgjson "$d_heads" 'c["num_attention_heads"] = 5'
d_kvheads=$(bad kvheads "$m"); cfgjson "$d_kvheads" 'c["num_key_value_heads"] = 3'
d_arch=$(bad arch "$m"); cfgjson "$d_arch" 'c["architectures"] = ["GPT2LMHeadModel"]; c["model_type"] = "gpt2"'
d_layers=$(bad layers "$m"); cfgjson "$d_layers" 'c["num_hidden_layers"] = 0'
d_hidtype=$(bad hidtype "$m"); cfgjson "$d_hidtype" 'c["hidden_size"] = "sixty-four"'
d_noweights=$(bad noweights "$m"); rm "$d_noweights/model.safetensors"
d_trunc=$(bad trunc "$m"); truncate -s $(( $(stat -c %s "$m/model.safetensors") / 2 )) "$d_trunc/model.safetensors"
d_hdr=$(bad hdr "$m"); printf 'garbage!' | dd of="$d_hdr/model.safetensors" bs=1 seek=8 conv=notrunc status=none
d_hdrlen=$(bad hdrlen "$m"); printf '\xff\xff\xff\xff\xff\xff\x00\x00' | dd of="$d_hdrlen/model.safetensors" bs=1 conv=notrunc status=none
d_shape=$(bad shape "$m"); cfgjson "$d_shape" 'c["intermediate_size"] = 176'
d_missing=$(bad missing "$m"); st "$d_missing/model.safetensors" drop model.layers.1.mlp.down_proj.weight
d_extra=$(bad extra "$m"); st "$d_extra/model.safetensors" extra model.layers.0.mlp.surprise.weight
d_nan=$(bad nan "$m"); st "$d_nan/model.safetensors" nan model.layers.0.self_attn.q_proj.weight
d_notok=$(bad notok "$ml"); rm "$d_notok/tokenizer.model"
# A JSONL data file whose second record is 5 MiB (one runaway line).
$py - "$fx/huge_record.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"instruction": "hi", "input": "", "output": "ok"}) + "\n")
    f.write(json.dumps({"instruction": "x" * (5 << 20), "input": "", "output": "ok"}) + "\n")
PY
d_badtok=$(bad badtok "$ml"); head -c 4096 /dev/urandom > "$d_badtok/tokenizer.model"

# Datasets.
printf '[{"instruction": "a", "output": "b"},\n {"instruction": "c", "output": \n' > "$fx/malformed.json"
printf '{"prompt": "a"}\n{"prompt": "b", "temperature": -1}\n' > "$fx/prompts_bad.jsonl"
printf '{"instruction": "a", "input": "", "output": "b"}\n{"instruction": "c", "input": ""}\n{"instruction": "e", "output": "f"}\n' > "$fx/nooutput.jsonl"
printf '[]\n' > "$fx/empty.json"
"$py" -c "import struct; open('$fx/ids.bin','wb').write(struct.pack('<64H', *([5]*40 + [600] + [7]*23)))"

# Checkpoints.
bad_ck() { rm -rf "$fx/$1" && cp -r "$ck" "$fx/$1" && echo "$fx/$1"; }
ck_trunc=$(bad_ck ck_trunc); truncate -s 1000 "$ck_trunc/rank_00000.safetensors"
ck_meta=$(bad_ck ck_meta); printf '{"step": 1, "world_size": ' > "$ck_meta/metadata.json"

# Adapters.
ad_type=$(bad ad_type "$adapter"); "$py" - "$ad_type/adapter_config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["peft_type"] = "PREFIX_TUNING"; json.dump(c, open(sys.argv[1], "w"))
PY

# Launch.
printf 'node-a slots=2\nthis is not a hostfile ===\n' > "$fx/hosts.bad"

# Parsers with limits and absurd numbers (issue 30). deepjson FILE: a JSON array nested 200000
# levels deep (400 KB), which crashed the JSON readers (SIGSEGV) on their first copy or dump of it.
deepjson() { "$py" -c "import sys; n = 200000; open(sys.argv[1], 'w').write('[' * n + ']' * n + '\n')" "$1"; }
d_deepcfg=$(bad deepcfg "$m"); deepjson "$d_deepcfg/config.json"
d_deephdr=$(bad deephdr "$m"); "$py" - "$d_deephdr/model.safetensors" <<'PY'
import struct, sys
h = ('[' * 200000 + ']' * 200000).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h)
PY
d_deepidx=$(bad deepidx "$m"); mv "$d_deepidx/model.safetensors" "$d_deepidx/model-00001-of-00001.safetensors"
deepjson "$d_deepidx/model.safetensors.index.json"
d_deeptok=$(bad deeptok "$m"); deepjson "$d_deeptok/tokenizer.json"
d_deeptc=$(bad deeptc "$m"); deepjson "$d_deeptc/tokenizer_config.json"
ad_deep=$(bad ad_deep "$adapter"); deepjson "$ad_deep/adapter_config.json"
for f in prompts_deep.jsonl deep_record.jsonl charts_deep.json ds_deep.json; do deepjson "$fx/$f"; done
printf '{"prompt": "a", "temperature": 1e400}\n' > "$fx/prompts_overflow.jsonl"
printf '{"instruction": "a", "input": "", "output": "b", "weight": 1e400}\n' > "$fx/overflow_record.jsonl"
d_epsover=$(bad epsover "$m"); "$py" - "$d_epsover/config.json" <<'PY'
import re, sys
p = sys.argv[1]; t = open(p).read()
open(p, "w").write(re.sub(r'"rms_norm_eps": [^,\n]*', '"rms_norm_eps": 1e400', t))
PY
d_vocab=$(bad vocab "$m"); cfgjson "$d_vocab" 'c["vocab_size"] = 2 ** 62'
d_hidden=$(bad hidden "$m"); cfgjson "$d_hidden" 'c["hidden_size"] = 2 ** 40'
d_manylayers=$(bad manylayers "$m"); cfgjson "$d_manylayers" 'c["num_hidden_layers"] = 100000'
d_maxpos=$(bad maxpos "$m"); cfgjson "$d_maxpos" 'c["max_position_embeddings"] = 2 ** 40'
d_params=$(bad params "$m"); cfgjson "$d_params" \
  'c.update(vocab_size=2000000000, hidden_size=2 ** 20, num_attention_heads=8192, num_key_value_heads=8192, head_dim=128)'
# A YAML alias bomb: ten anchors, each a list of ten aliases of the one before (10^10 values).
"$py" - "$fx/bomb.yaml" "$cfg" <<'PY'
import sys
lines = [open(sys.argv[2]).read(), "lol:\n", "  a: &a [x, x, x, x, x, x, x, x, x, x]\n"]
for prev, c in zip("abcdefghi", "bcdefghij"):
    lines.append(f"  {c}: &{c} [" + ", ".join([f"*{prev}"] * 10) + "]\n")
open(sys.argv[1], "w").write("".join(lines))
PY
bomb_flow=$("$py" -c "
print('{a: &a [x, x, x, x, x, x, x, x, x, x]' + ''.join(f', {c}: &{c} [' + ', '.join([f'*{p}'] * 10) + ']' for p, c in zip('abcdefghi', 'bcdefghij')) + '}')")
"$py" -c "import sys; n = 100000; open(sys.argv[1], 'w').write(open(sys.argv[2]).read() + 'x: ' + '[' * n + ']' * n + '\n')" \
  "$fx/deep.yaml" "$cfg"
sed 's/^max_steps: 1/max_steps: 1\noptimizer: {lr: .inf}/' "$cfg" > "$fx/lr_inf.yaml"
printf '{"train_micro_batch_size_per_gpu": 4, "train_batch_size": 400000000000000}\n' > "$fx/ds_tbs.json"

# ---- the table ----
# Every file under fx and out with its size, modification time (ns) and inode (a write changes the
# time, a replacement by rename the inode), then every path. (Hashing the ~100 MB of fixtures twice
# per row took most of this test's time.)
snapshot() {
  (cd "$work" && find fx out -type f -printf '%p %s %T@ %i\n' | sort)
  (cd "$work" && find fx out -print | sort)
}
pass=0 fails=0 skipped=0
findings=()
# row NAME REGEX COMMAND...: see the header.
row() {
  local name=$1 regex=$2
  shift 2
  # BAD_INPUTS_ONLY=REGEX runs only the rows whose names match (to try a few rows by hand).
  [[ -z "${BAD_INPUTS_ONLY:-}" || $name =~ $BAD_INPUTS_ONLY ]] || return 0
  local log=$logs/$name.log before after rc lines
  before=$(snapshot)
  set +e
  ( cd "$work" && "$@" ) > "$log" 2>&1 < /dev/null
  rc=$?
  set -e
  after=$(snapshot)
  local why=""
  # launch's own line (the mpirun command it runs) is not the error
  lines=$(grep -a -v '^shardlm launch: mpirun ' "$log" || true)
  if [[ $rc -eq 0 ]]; then why="exit 0"
  elif [[ $rc -ge 124 ]]; then why="exit $rc (signal or timeout)"
  elif [[ $(printf '%s\n' "$lines" | wc -l) -ne 1 || -z "$lines" ]]; then why="not one line ($(printf '%s\n' "$lines" | wc -l))"
  elif ! grep -q -i 'error' <<< "$lines"; then why="no 'error' in the line"
  elif ! grep -q -E -- "$regex" <<< "$lines"; then why="does not match /$regex/"
  elif [[ "$before" != "$after" ]]; then why="changed files: $(diff <(echo "$before") <(echo "$after") | grep '^[<>]' | head -3 | tr '\n' ' ' || true)"
  fi
  if [[ -z "$why" ]]; then
    pass=$((pass + 1))
    printf 'ok   %-28s %s\n' "$name" "$lines"
  else
    fails=$((fails + 1))
    findings+=("$name")
    printf 'FAIL %-28s %s; exit %s; output:\n' "$name" "$why" "$rc"
    head -20 "$log" | sed 's/^/       | /'
  fi
  # anything a row wrote outside the protected trees goes away
  find "$work" -mindepth 1 -maxdepth 1 ! -name fx ! -name out ! -name logs -exec rm -rf {} +
}
T() { S train --config "$cfg" "$@"; }
TA() { S train --config "$fx/alpaca.yaml" "$@"; }

# model directories
row model_missing_dir       "no_such_model.*(does not exist|not a model directory|cannot open)" T model="$work/no_such_model"
row model_no_config         "noconf.*config\.json|config\.json.*noconf"                T model="$d_noconf"
row model_config_malformed  "badjson/config\.json.*(JSON|json|line)"                   T model="$d_badjson"
row model_heads_not_divide  "heads/config\.json.*num_attention_heads"                  T model="$d_heads"
row model_kv_not_divide     "kvheads/config\.json.*num_key_value_heads"                T model="$d_kvheads"
row model_unsupported_arch  "arch/config\.json.*(GPT2|gpt2)"                           T model="$d_arch"
row model_zero_layers       "layers/config\.json.*num_hidden_layers"                   T model="$d_layers"
row model_key_wrong_type    "hidtype/config\.json.*hidden_size"                        T model="$d_hidtype"
row generate_no_config      "noconf.*config\.json|config\.json.*noconf"                S generate --model "$d_noconf" --prompt hi
# weights
row weights_none                    "noweights.*(safetensors)"                                 T model="$d_noweights"
row weights_truncated       "trunc/model\.safetensors"                                 T model="$d_trunc"
row weights_corrupt_header  "hdr/model\.safetensors.*(header|JSON)"                    T model="$d_hdr"
row weights_header_length   "hdrlen/model\.safetensors.*header"                        T model="$d_hdrlen"
row weights_wrong_shape     "shape.*'model\.layers\.0\.mlp\.(gate|up|down)_proj\.weight'" T model="$d_shape"
row weights_missing_tensor  "missing.*'model\.layers\.1\.mlp\.down_proj\.weight'"      T model="$d_missing"
row weights_extra_tensor    "extra.*'model\.layers\.0\.mlp\.surprise\.weight'"          T model="$d_extra"
row weights_nan             "'model\.layers\.0\.self_attn\.q_proj\.weight'.*(NaN|finite)" T model="$d_nan"
row generate_nan            "'model\.layers\.0\.self_attn\.q_proj\.weight'.*(NaN|finite)" S generate --model "$d_nan" --prompt hi --max-new-tokens 2
row generate_nan_q8_0       "'model\.layers\.0\.self_attn\.q_proj\.weight'.*(NaN|finite)" S generate --model "$d_nan" --prompt hi --max-new-tokens 2 --dtype q8_0
# training YAML
printf 'model: [%s\noutput_dir: %s\n' "$m" "$out" > "$fx/malformed.yaml"
sed 's/^max_steps:/max_stepz:/' "$cfg" > "$fx/unknown_key.yaml"
sed 's/^max_steps: 1/max_steps: many/' "$cfg" > "$fx/wrong_type.yaml"
printf 'sharding_strategy: FULLSHARD\n' | cat "$cfg" - > "$fx/bad_enum.yaml"
grep -v '^output_dir' "$cfg" > "$fx/no_output_dir.yaml"
printf 'lora:\n  rank: 4\n  target_modules: [q_proj, qq_proj]\n' | cat "$cfg" - > "$fx/lora_target.yaml"
row config_missing_file     "no_such\.yaml"                                            S train --config "$work/no_such.yaml"
row yaml_malformed          "malformed\.yaml.*(line|:2)"                               S train --config "$fx/malformed.yaml"
row yaml_unknown_key        "unknown_key\.yaml.*max_stepz"                             S train --config "$fx/unknown_key.yaml"
row yaml_wrong_type         "wrong_type\.yaml.*max_steps"                              S train --config "$fx/wrong_type.yaml"
row yaml_bad_enum           "bad_enum\.yaml.*sharding_strategy.*FULLSHARD"             S train --config "$fx/bad_enum.yaml"
row yaml_missing_required   "no_output_dir\.yaml.*output_dir"                          S train --config "$fx/no_output_dir.yaml"
row value_zero_batch        "micro_batch_size"                                         T micro_batch_size=0
row value_negative_steps    "max_steps"                                                T max_steps=-5
row value_negative_lr       "optimizer\.lr"                                            T optimizer.lr=-1
row value_zero_seq_len      "seq_len"                                                  T seq_len=0
row value_bad_dtype         "compute_dtype.*f8"                                        T compute_dtype=f8
row override_no_equals      "max_steps"                                                T max_steps
row override_unknown_key    "max_stepz"                                                T max_stepz=1
row override_unknown_dotted "optimizer\.lrr"                                           T optimizer.lrr=1
row override_bad_yaml       "optimizer"                                                T 'optimizer={lr: [1'
row lora_rank_zero          "lora\.(rank|r)"                                           T 'lora={rank: 0}'
row lora_unknown_module     "lora_target\.yaml.*target_modules.*qq_proj"               S train --config "$fx/lora_target.yaml"
row lora_dropout_range      "lora\.(lora_)?dropout"                                    T 'lora={dropout: 1.5}'
# DeepSpeed configs (docs/deepspeed.md), recipes and validate (docs/recipes.md)
printf '{"zero_optimization": {"stage": 3}, "fp16": {"enabled": true}}\n' > "$fx/ds_fp16.json"
printf '{\n  "train_micro_batch_size_per_gpu": 2\n}\n' > "$fx/ds_micro.json"
row ds_missing_file         "key 'deepspeed_config': cannot read the DeepSpeed config .*no_such_ds\.json" T deepspeed_config="$work/no_such_ds.json"
row ds_fp16_refused         "ds_fp16\.json:1: key 'fp16\.enabled'"                       T deepspeed_config="$fx/ds_fp16.json"
row ds_conflicts_with_yaml  "ds_micro\.json:2: key 'train_micro_batch_size_per_gpu'.*micro_batch_size: 4 at .*run\.yaml" T deepspeed_config="$fx/ds_micro.json"
row validate_over_budget    "key 'max_memory_per_rank'.*does not fit"                   S validate --config "$cfg" max_memory_per_rank=1KB
row validate_unknown_recipe "unknown recipe 'llama3_1-8b-lora'; close: "                S validate --recipe llama3_1-8b-lora
row recipes_cp_exists       "run\.yaml exists; pass --force"                           S recipes cp qwen2-0_5b-lora-single-device "$fx/run.yaml"
# command line
row cli_unknown_command     "frobnicate"                                               S frobnicate
row cli_unknown_flag        "--frobnicate"                                             S train --config "$cfg" --frobnicate
row cli_missing_required            "--config"                                                 S train
row cli_init_bad_dtype              "--dtype.*f8"                                    S init --preset tiny --out "$work/newinit" --dtype f8
row cli_init_bad_preset     "llama9"                                                   S init --preset llama9 --out "$work/newinit"
row cli_init_bad_set        "--set.*frobs|frobs"                                       S init --preset tiny --out "$work/newinit" --set frobs=1
row cli_convert_bad_dtype           "--dtype.*int3"                                       S convert "$ck" --out "$work/conv" --dtype int3
row cli_generate_bad_topp           "--top-p"                                                  S generate --model "$m" --prompt hi --top-p 2
row generate_prompts_missing        "no_such_prompts\.txt"                                      S generate --model "$m" --prompts "$work/no_such_prompts.txt"
row generate_prompts_bad_row        "prompts_bad\.jsonl:2: key 'temperature'"                   S generate --model "$m" --prompts "$fx/prompts_bad.jsonl"
row generate_chat_format            "--chat-format.*vicuna"                                    S generate --model "$m" --prompt hi --chat --chat-format vicuna
row generate_prefill_text           "--prefill-chunk.*lots"                                    S generate --model "$m" --prompt hi --prefill-chunk lots
row generate_kv_block_zero          "--kv-block-size"                                          S generate --model "$m" --prompt hi --kv-block-size 0
row generate_kv_memory_text         "--kv-cache-memory.*lots"                                  S generate --model "$m" --prompt hi --kv-cache-memory lots
row generate_prompt_and_prompts     "--prompt.*--prompts"                                      S generate --model "$m" --prompt hi --prompts "$fx/prompts_bad.jsonl"
row cli_generate_bad_dtype          "--dtype foo: expected f32, bf16 or q8_0"                    S generate --model "$m" --prompt hi --dtype foo
row cli_generate_bad_device         "'--device': expected cpu or cuda, not 'tpu'"                 S generate --model "$m" --prompt hi --device tpu
row generate_cuda_q8_0              "'--device': cuda: q8_0 weights are read by a CPU kernel" S generate --model "$m" --prompt hi --device cuda --dtype q8_0
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then  # where there is no GPU to find
  row generate_cuda_no_gpu          "'--device': cuda: (built without CUDA|no (usable )?CUDA device)" S generate --model "$m" --prompt hi --device cuda
fi
row mem_world_size_zero     "--world-size 0"                                           S estimate-memory --model tiny --world-size 0
row mem_world_size_text             "--world-size.*abc|abc.*world-size"                        S estimate-memory --model tiny --world-size abc
row mem_bad_param_dtype     "--param-dtype f16"                                        S estimate-memory --model tiny --param-dtype f16
row mem_bad_model           "--model.*nosuchpreset"                                    S estimate-memory --model nosuchpreset
row mem_hybrid_group        "HYBRID_SHARD.*shard group of 4.*world of 6"                               S estimate-memory --model tiny --world-size 6 --shard-group-size 4 --sharding-strategy HYBRID_SHARD
row mem_nproc_not_divide    "--nproc-per-node 4 does not divide --world-size 6"        S estimate-memory --model tiny --world-size 6 --nproc-per-node 4
row time_no_tflops          "--tflops"                                                 S estimate-time --model tiny --world-size 4
row time_bad_bandwidth      "--inter-node-bandwidth 10 furlongs"                       S estimate-time --model tiny --world-size 4 --nproc-per-node 2 --tflops 1 --inter-node-bandwidth "10 furlongs"
row time_no_link_figure     "inter-node bandwidth must be > 0.*world size 4"           S estimate-time --model tiny --world-size 4 --nproc-per-node 2 --tflops 1 --intra-node-bandwidth 1GB/s --sharding-strategy FULL_SHARD
row time_bad_memory_bw       "--memory-bandwidth fast"                                  S estimate-time --model tiny --world-size 4 --tflops 1 --memory-bandwidth fast
row time_bad_world_sizes    "--world-sizes 8,x"                                        S estimate-time --model tiny --tflops 1 --world-sizes 8,x
# datasets
row data_missing_file       "no_such_data\.json"                                       TA data.train="$work/no_such_data.json"
row data_malformed_json     "malformed\.json:[0-9]+: .*JSON"                               TA data.train="$fx/malformed.json"
row data_row_no_output      "nooutput\.jsonl:2.*output|nooutput\.jsonl.*line 2.*output" TA data.train="$fx/nooutput.jsonl"
row data_empty              "empty\.json"                                              TA data.train="$fx/empty.json"
row data_token_id_range     "ids\.bin.*600"                                            T data.train="$fx/ids.bin" data.type=tokens
row data_bad_type           "data\.type.*csv"                                          T data.type=csv
row data_preview_missing    "no_such_data\.json"                                       S data-preview --config "$fx/alpaca.yaml" data.train="$work/no_such_data.json"
row validate_answers_cut    "alpaca_en_demo\.json:2: none of the first 8 examples \(lines 2 to 77\) has a token generation stops on .*seq_len 48 cuts 8 of them" S validate --config "$fx/alpaca.yaml" seq_len=48
# tokenizers
row tokenizer_missing       "notok.*tokenizer"                                                    TA model="$d_notok"
row tokenizer_corrupt       "badtok/tokenizer\.model"                                  TA model="$d_badtok"
row tokenize_corrupt        "badtok/tokenizer\.model"                                  S tokenize --model "$d_badtok" --text hi
# checkpoints
row resume_not_checkpoint   "$m"                                                       T resume_from="$m"
row resume_missing_dir      "no_such_ckpt"                                             T resume_from="$work/no_such_ckpt"
row resume_truncated_rank   "ck_trunc/rank_00000\.safetensors"                         T resume_from="$ck_trunc"
row resume_corrupt_metadata "ck_meta/metadata\.json"                                   T resume_from="$ck_meta"
row resume_other_model      "other_run.*(hidden_size|num_hidden_layers|config|model)"  T resume_from="$ck_other"
row convert_not_checkpoint  "$m"                                                       S convert "$m" --out "$work/conv"
row convert_truncated_rank  "ck_trunc/rank_00000\.safetensors"                         S convert "$ck_trunc" --out "$work/conv"
# PEFT adapters
row merge_wrong_peft_type   "ad_type/adapter_config\.json.*peft_type"                  S merge --base "$m" --adapter "$ad_type" --out "$work/merged"
row merge_other_model       "lora_other/adapter/adapter_model\.safetensors: tensor 'base_model\.model\.model\.layers\.[0-9]+\.self_attn\.(q|v)_proj\.lora_[AB]\.weight'" S merge --base "$m" --adapter "$fx/lora_other/adapter" --out "$work/merged"
row generate_other_adapter  "lora_other/adapter.*lora_[AB]"                            S generate --model "$m" --adapter "$fx/lora_other/adapter" --prompt hi
row merge_missing_adapter   "no_such_adapter"                                          S merge --base "$m" --adapter "$work/no_such_adapter" --out "$work/merged"
row merge_into_unknown      "key '--merge-into': 'nf4': expected dequantized"          S merge --base "$m" --adapter "$adapter" --out "$work/merged" --merge-into nf4
row merge_verify_no_out     "give --out DIR \(to merge\) or --merged DIR \(to verify\)"   S merge --base "$m" --adapter "$adapter" --verify
# parsers with limits (issue 30): nesting, alias expansion, numbers past a double, sizes past 64 bits
row model_config_deep       "deepcfg/config\.json: invalid JSON: .*nested deeper than 128" T model="$d_deepcfg"
row weights_header_deep     "deephdr/model\.safetensors: header is not valid JSON: .*nested deeper" T model="$d_deephdr"
row weights_index_deep      "deepidx/model\.safetensors\.index\.json: .*nested deeper"  T model="$d_deepidx"
row tokenizer_json_deep     "deeptok/tokenizer\.json: .*nested deeper"                 S tokenize --model "$d_deeptok" --text hi
row chat_template_deep      "deeptc/tokenizer_config\.json: .*nested deeper"           S generate --model "$d_deeptc" --prompt hi --chat --max-new-tokens 2
row adapter_config_deep     "ad_deep/adapter_config\.json: .*nested deeper"            S merge --base "$m" --adapter "$ad_deep" --out "$work/merged"
row generate_prompts_deep   "prompts_deep\.jsonl:1: .*nested deeper"                   S generate --model "$m" --prompts "$fx/prompts_deep.jsonl"
row data_record_deep        "deep_record\.jsonl:1: .*nested deeper"                    TA data.train="$fx/deep_record.jsonl"
row report_charts_deep      "charts_deep\.json"                                        S report --charts "$fx/charts_deep.json" --out "$work/r.html"
row ds_config_deep          "ds_deep\.json.*nested deeper"                            T deepspeed_config="$fx/ds_deep.json"
row yaml_deep               "deep\.yaml:[0-9]+: invalid YAML: nested deeper"         S train --config "$fx/deep.yaml"
row yaml_alias_bomb         "bomb\.yaml:[0-9]+: key 'lol.*more than 100000 values"     S train --config "$fx/bomb.yaml"
row override_alias_bomb     "command line: key 'lol.*more than 100000 values"          T "lol=$bomb_flow"
row model_number_overflow   "epsover/config\.json: invalid JSON: .*1e400.*rms_norm_eps" T model="$d_epsover"
row generate_prompts_overflow "prompts_overflow\.jsonl:1: .*1e400.*temperature"        S generate --model "$m" --prompts "$fx/prompts_overflow.jsonl"
row data_record_overflow    "overflow_record\.jsonl:1: .*1e400"                        TA data.train="$fx/overflow_record.jsonl"
row model_vocab_huge        "vocab/config\.json: key 'vocab_size': must be at most"    T model="$d_vocab"
row generate_vocab_huge     "vocab/config\.json: key 'vocab_size'"                     S generate --model "$d_vocab" --prompt hi
row mem_vocab_huge          "vocab.*key 'vocab_size'"                                  S estimate-memory --model "$d_vocab"
row cli_init_vocab_huge     "vocab_size.*must be at most"                              S init --preset tiny --out "$work/newinit" --set vocab_size=4611686018427387904
row model_hidden_huge       "hidden/config\.json: key 'hidden_size': must be at most"  T model="$d_hidden"
row model_layers_huge       "manylayers/config\.json: key 'num_hidden_layers'"         T model="$d_manylayers"
row model_positions_huge    "maxpos/config\.json: key 'max_position_embeddings'"       T model="$d_maxpos"
row model_parameters_huge   "params/config\.json: key 'vocab_size': the model would have" T model="$d_params"
# absurd numbers, refused where they are written
row yaml_lr_inf             "lr_inf\.yaml:[0-9]+: key 'optimizer\.lr': expected a finite number" S train --config "$fx/lr_inf.yaml"
row value_lr_inf            "command line: key 'optimizer\.lr': expected a finite number" T optimizer.lr=.inf
row value_lr_nan            "command line: key 'optimizer\.lr'"                        T optimizer.lr=.nan
row value_lr_overflow       "key 'optimizer\.lr': number 1e400 is out of range"        T optimizer.lr=1e400
row value_grad_norm_inf     "key 'max_grad_norm': expected a finite number"            T max_grad_norm=.inf
row value_eps_inf           "key 'optimizer\.eps': expected a finite"                  T optimizer.eps=.inf
row value_weight_decay_inf  "key 'optimizer\.weight_decay': expected a finite"         T optimizer.weight_decay=.inf
row value_timeout_inf       "key 'collective_timeout': expected a finite"              T collective_timeout=.inf
row value_save_minutes_inf  "key 'save_every_minutes': expected a finite"               T save_every_minutes=.inf
row value_peak_flops_inf    "key 'peak_flops': expected a finite"                      T peak_flops=.inf
row value_peak_flops_huge   "key 'peak_flops': number 1e999 is out of range"           T peak_flops=1e999
row value_accum_huge        "key 'gradient_accumulation_steps': must be at most"       T gradient_accumulation_steps=4611686018427387904
row value_batch_huge        "key 'micro_batch_size': must be at most"                  T micro_batch_size=1e12
row value_seq_len_huge      "key 'seq_len': must be at most"                           T seq_len=1e9
row value_batch_tokens      "key 'micro_batch_size': micro_batch_size 1048576 x seq_len 16777216" T micro_batch_size=1048576 seq_len=16777216
row value_max_steps_huge    "key 'max_steps': must be at most"                         T max_steps=1e15
row value_eval_batches_huge "key 'eval_batches': must be at most"                      T eval_batches=1e10
row ds_batch_huge           "ds_tbs\.json:1: key 'train_batch_size'.*more than"       T deepspeed_config="$fx/ds_tbs.json"
# outputs that would overwrite inputs or another run's work; inputs that are not files (issue 30)
row output_is_model         "key 'output_dir'.*output_dir is the model directory it reads" T output_dir="$m"
row init_over_model         "tiny: --out exists and is not empty.*--force replaces it" S init --preset tiny --out "$m"
row convert_over_checkpoint "--out is the checkpoint it reads"                         S convert "$ck" --out "$ck"
row merge_over_adapter      "--out is the adapter directory it reads"                 S merge --base "$m" --adapter "$ad_type" --out "$ad_type"
row convert_over_non_model  "out: --out already holds '.*', which is not a model file" S convert "$ck" --out "$out"
row data_is_directory       "fx: is a directory, not a data file"                      TA data.train="$fx"
row data_is_device          "/dev/zero: is not a regular file"                         TA data.train=/dev/zero
row data_text_is_directory  "fx: is a directory, not a text file"                      T "data={type: text, train: $fx}"
row data_record_huge        "huge_record\.jsonl:2: the record is 5\.0 MiB, above the 4\.0 MiB" TA data.train="$fx/huge_record.jsonl"
row generate_no_tokenizer   "notok: no tokenizer .* for a vocabulary of 32000 ids"     S generate --model "$d_notok" --prompt hi --max-new-tokens 1
row lr_weights_nonfinite    "step 1: .*the optimizer step made the weights non-finite" T optimizer.lr=1e300 output_dir="$work/lr_run"
# serve: flags that size threads and buffers are bounded
row serve_max_batch_huge    "--max-batch"                                              S serve --model "$m" --port 0 --max-batch 1000000
row serve_connections_zero  "--max-connections"                                        S serve --model "$m" --port 0 --max-connections 0
row serve_max_body_huge     "--max-body.*1GiB"                                         S serve --model "$m" --port 0 --max-body 10TB
row serve_max_body_text     "--max-body.*lots"                                         S serve --model "$m" --port 0 --max-body lots
row serve_bad_dtype         "--dtype f16: expected f32, bf16 or q8_0"                    S serve --model "$m" --port 0 --dtype f16
row serve_cuda_split        "'--device': cuda: a model split over ranks"                 S serve --model "$m" --port 0 --device cuda --tensor-parallel 2
row serve_timeout_zero      "--request-timeout"                                        S serve --model "$m" --port 0 --request-timeout 0
row serve_prefill_negative  "--prefill-chunk"                                          S serve --model "$m" --port 0 --prefill-chunk -1
row serve_kv_memory_small   "--kv-cache-memory.*fewer than"                            S serve --model "$m" --port 0 --kv-cache-memory 1KiB
row serve_bad_device_map    "--device-map.*balance"                                    S serve --model "$m" --port 0 --device-map balance
row serve_tp_device_map     "--tensor-parallel.*--device-map"                          S serve --model "$m" --port 0 --tensor-parallel 2 --device-map auto
# --tensor-parallel: impossible splits (tests/scripts/tensor_parallel_cli.sh has more)
row generate_tp_one_rank    "--tensor-parallel.*needs 2 ranks"                         S generate --model "$m" --prompt hi --tensor-parallel 2
row generate_tp_device_map  "--tensor-parallel.*--device-map"                          S generate --model "$m" --prompt hi --tensor-parallel 2 --device-map auto
row serve_tp_one_rank       "--tensor-parallel.*needs 2 ranks"                         S serve --model "$m" --port 0 --tensor-parallel 2
# launch
row launch_nnodes_no_hosts  "--hostfile"                                               S launch --nproc-per-node 1 --nnodes 2 -- train --config "$cfg"
row launch_hostfile_missing "no_such_hosts"                                            S launch --nnodes 2 --hostfile "$work/no_such_hosts" -- train --config "$cfg"
if [[ $mpi == mpi ]]; then
  row launch_hybrid_group     "rank 0: .*shard_group_size.*(2|3)"                        S launch --nproc-per-node 3 -- train --config "$cfg" sharding_strategy=HYBRID_SHARD shard_group_size=2
  row launch_bad_key          "rank 0: .*max_stepz"                                      S launch --nproc-per-node 2 -- train --config "$cfg" max_stepz=1
  row launch_resume_trunc     "rank [01]: .*ck_trunc/rank_00000\.safetensors"            S launch --nproc-per-node 2 -- train --config "$cfg" resume_from="$ck_trunc"
  row launch_tp_kv_heads      "rank [0-3]: .*num_key_value_heads"                        S launch --nproc-per-node 4 -- generate --model "$m" --prompt hi --tensor-parallel 4
  row launch_tp_ranks         "rank [01]: .*--tensor-parallel 3 needs 3 ranks"           S launch --nproc-per-node 2 -- serve --model "$m" --port 0 --tensor-parallel 3
else
  skipped=5
fi

echo "bad_inputs: $pass passed, $fails failed, $skipped launch rows skipped (no MPI), $((SECONDS - start)) s"
[[ $fails -eq 0 ]] || { echo "FAIL: ${findings[*]}"; exit 1; }
