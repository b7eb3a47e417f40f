#!/usr/bin/env bash
# `shardlm validate` checks the first examples of each data file as training loads them (issue 31;
# src/train/sample_check.h), on a tiny Llama with Llama 3's tokenizer and Llama 3 Instruct's chat
# template:
#  A. a good config passes: the examples train <|eot_id|>, the chat format is the one generate and
#     serve use, no warning, and one example is printed with its context in «»;
#  B. seq_len cutting every one of the first examples before its end: no example trains a token
#     generation stops on -> exit 1, one line naming the file and the first example's line;
#  C. data.chat_format llama2 on a model whose template is llama3 -> exit 1, one line naming the
#     key and both formats;
#  D. seq_len cutting 5 of 50 examples (the first 8 whole) -> valid, with a warning giving 10.0%;
#  E. a chat_template of no family shardlm renders (Gemma's markers) -> valid, with a warning that
#     tools applying the template prompt differently.
# Usage: validate_samples_cli.sh SHARDLM DATA_DIR WORKDIR
set -euo pipefail
shardlm=$1
data=$(cd "$2" && pwd)
work=$3
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
[[ -f "$data/llama3_tokenizer.model" ]] || { echo "shared test data not found at $data: skipped"; exit 77; }

"$shardlm" init --preset tiny --set vocab_size=128256 --set max_position_embeddings=512 --seed 0 --out "$work/m" >/dev/null
cp "$data/llama3_tokenizer.model" "$work/m/tokenizer.model"
# meta-llama/Meta-Llama-3-8B-Instruct's template
cat > "$work/m/tokenizer_config.json" <<'JSON'
{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
 "chat_template": "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"}
JSON

short() { echo "{\"messages\": [{\"role\": \"user\", \"content\": \"What is $1 plus $1?\"}, {\"role\": \"assistant\", \"content\": \"$1 plus $1 is $(($1 * 2)).\"}]}"; }
long() { echo "{\"messages\": [{\"role\": \"user\", \"content\": \"Count to $1.\"}, {\"role\": \"assistant\", \"content\": \"$(seq -s ' ' 1 "$1")\"}]}"; }
for i in $(seq 1 50); do short "$i"; done > "$work/short.jsonl"
for i in $(seq 1 10); do long 80; done > "$work/long.jsonl"
{ for i in $(seq 1 45); do short "$i"; done; for i in $(seq 1 5); do long 80; done; } > "$work/some_long.jsonl"

config() {  # NAME TRAIN SEQ_LEN [extra data keys]
  cat > "$work/$1.yaml" <<YAML
model: $work/m
output_dir: $work/out_$1
data: {train: $2, eval_fraction: 0${4:-}}
seq_len: $3
micro_batch_size: 2
max_steps: 1
YAML
}
# validate NAME: runs it, stdout to NAME.out and stderr to NAME.err; prints the exit code
validate() {
  local rc=0
  "$shardlm" validate --config "$work/$1.yaml" > "$work/$1.out" 2> "$work/$1.err" || rc=$?
  echo "$rc"
}

# ---- A ----
config good "$work/short.jsonl" 128
[[ $(validate good) == 0 ]] || fail "a good config was refused: $(cat "$work/good.err")"
[[ ! -s "$work/good.err" ]] || fail "a good config got a warning: $(cat "$work/good.err")"
grep -q "samples: chat format: llama3, as \`generate --chat\` and \`serve\` use it" "$work/good.out" ||
  fail "validate did not say which chat format: $(cat "$work/good.out")"
grep -q "samples: $work/short.jsonl: 8 of the first 8 examples train a token generation stops on (.*<|eot_id|> (128009)" \
  "$work/good.out" || fail "validate did not report the stop tokens trained: $(cat "$work/good.out")"
grep -q "^sample $work/short.jsonl:1 as training sees it" "$work/good.out" || fail "no sample printed: $(cat "$work/good.out")"
grep -qF "«<|begin_of_text|><|start_header_id|>user<|end_header_id|>" "$work/good.out" ||
  fail "the sample does not show its context in «»: $(cat "$work/good.out")"
grep -qF "»1 plus 1 is 2.<|eot_id|>" "$work/good.out" || fail "the sample does not show its trained answer: $(cat "$work/good.out")"

# ---- B ----
config cut "$work/long.jsonl" 24
[[ $(validate cut) == 1 ]] || fail "examples cut before their end passed: $(cat "$work/cut.out" "$work/cut.err")"
[[ $(wc -l < "$work/cut.err") == 1 ]] || fail "not one line: $(cat "$work/cut.err")"
grep -q "$work/long.jsonl:1: none of the first 8 examples (lines 1 to 8) has a token generation stops on .* seq_len 24 cuts 8 of them" \
  "$work/cut.err" || fail "the error does not name the file, line and seq_len: $(cat "$work/cut.err")"

# ---- C ----
config other_format "$work/short.jsonl" 128 ", chat_format: llama2"
[[ $(validate other_format) == 1 ]] || fail "a chat format other than generation's passed: $(cat "$work/other_format.out")"
[[ $(wc -l < "$work/other_format.err") == 1 ]] || fail "not one line: $(cat "$work/other_format.err")"
grep -q "other_format.yaml: .*data.chat_format.*llama2: training renders the conversations in llama2, but \`generate --chat\` and \`serve\` render prompts for this model in llama3 (the chat_template of $work/m/tokenizer_config.json)" \
  "$work/other_format.err" || fail "the error does not name the key and both formats: $(cat "$work/other_format.err")"

# ---- D ----
config some_cut "$work/some_long.jsonl" 64
[[ $(validate some_cut) == 0 ]] || fail "a config truncating 10% was refused: $(cat "$work/some_cut.err")"
grep -q "warning: $work/some_long.jsonl: seq_len 64 truncates 5 of 50 examples (10.0%, the longest has [0-9]* tokens)" \
  "$work/some_cut.err" || fail "no truncation warning: $(cat "$work/some_cut.err")"

# ---- E ----
cp -r "$work/m" "$work/m_other_template"
printf '{"chat_template": "{%% for m in messages %%}<start_of_turn>{{ m.role }}\\n{{ m.content }}<end_of_turn>\\n{%% endfor %%}"}\n' \
  > "$work/m_other_template/tokenizer_config.json"
config other_template "$work/short.jsonl" 128
sed -i "s|^model: .*|model: $work/m_other_template|" "$work/other_template.yaml"
[[ $(validate other_template) == 0 ]] || fail "a template of another family was refused: $(cat "$work/other_template.err")"
grep -q "warning: $work/m_other_template/tokenizer_config.json: its chat_template is none of the formats shardlm renders .*use llama3 (from the tokenizer's special tokens)" \
  "$work/other_template.err" || fail "no warning for a template of another family: $(cat "$work/other_template.err")"
echo "OK"
