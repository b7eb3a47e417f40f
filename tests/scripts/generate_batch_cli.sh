#!/usr/bin/env bash
# `shardlm generate --prompts` (batched generation, docs/generation.md):
#  1. a .txt file of prompts of different lengths, batched 2 at a time at temperature 0, gives
#     each prompt exactly the text `generate --prompt` gives it alone, in f32 and in bf16 (--dtype);
#  2. JSONL rows with per-request options: sampled rows give the same text in a batch as alone
#     (their RNG is keyed by their own seed and step); --stop cuts the text and says "stop";
#     max_new_tokens says "length"; every field of the output is there;
#  3. --chat renders the prompt in the chat format (the JSON "prompt" shows the rendering);
#  4. bad rows fail in one line naming FILE:LINE and the field, with a non-zero exit;
#  5. --load-in-4bit generates from the NF4 round trip of the weights and says so;
#  6. a --kv-cache-memory smaller than the batch needs preempts requests and gives the same texts;
#     one too small for a single sequence is refused in one line;
#  4d. generation_config.json's eos_token_id stops generation; --stop-token-ids replaces the set
#     (none: no stop token); bad ids and a malformed generation_config.json are refused in one line.
# Usage: generate_batch_cli.sh SHARDLM PYTHON WORKDIR
set -euo pipefail
shardlm=$1
py=$2
work=$3
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

"$shardlm" init --preset tiny --set max_position_embeddings=96 --seed 1 --out "$work/m" >/dev/null
m=$work/m

# ---- 1. batched greedy == one at a time ----
printf 'hello\n\nthe quick brown fox\n12+34=\nx\n' > "$work/p.txt"
for dtype in f32 bf16; do
"$shardlm" generate --model "$m" --prompts "$work/p.txt" --batch-size 2 --max-new-tokens 12 --temperature 0 \
  --dtype "$dtype" --output "$work/batch_$dtype.jsonl" 2> "$work/batch.err" ||
  fail "generate --prompts --dtype $dtype failed: $(cat "$work/batch.err")"
[[ $(wc -l < "$work/batch_$dtype.jsonl") -eq 4 ]] || fail "expected 4 result lines (blank lines skipped), got $(wc -l < "$work/batch_$dtype.jsonl")"
i=0
while IFS= read -r p; do
  [[ -z "$p" ]] && continue
  "$shardlm" generate --model "$m" --prompt "$p" --max-new-tokens 12 --temperature 0 --dtype "$dtype" \
    > "$work/alone_${dtype}_$i.txt" 2>/dev/null
  i=$((i + 1))
done < "$work/p.txt"
"$py" - "$work" "$dtype" <<'PY'
import json, sys
work, dtype = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{work}/batch_{dtype}.jsonl")]
for i, r in enumerate(rows):
    assert r["index"] == i, r
    for k in ("prompt", "text", "prompt_tokens", "completion_tokens", "finish_reason", "prefill_seconds", "decode_seconds"):
        assert k in r, (k, r)
    alone = open(f"{work}/alone_{dtype}_{i}.txt", "rb").read().decode("utf-8", "replace")
    want = alone[len(r["prompt"]):-1]  # generate --prompt prints prompt + completion + "\n"
    assert r["text"] == want, f"request {i}: batched {r['text']!r} != alone {want!r}"
    assert r["finish_reason"] in ("stop", "length"), r
print(f"1. {dtype}: {len(rows)} batched completions equal their one-at-a-time runs")
PY
done

# ---- 2. per-request options, sampling, stop ----
cat > "$work/r.jsonl" <<'EOF'
{"prompt": "hello", "temperature": 1.0, "top_k": 20, "seed": 11, "max_new_tokens": 10}
{"prompt": "a much longer prompt than the others", "temperature": 0.7, "top_p": 0.9, "seed": 5, "repetition_penalty": 1.3, "max_new_tokens": 6}
{"prompt": "the quick brown fox", "temperature": 0, "max_new_tokens": 3}
EOF
"$shardlm" generate --model "$m" --prompts "$work/r.jsonl" --batch-size 3 > "$work/r_batch.jsonl" 2>/dev/null
for k in 1 2 3; do
  sed -n "${k}p" "$work/r.jsonl" > "$work/r$k.jsonl"
  "$shardlm" generate --model "$m" --prompts "$work/r$k.jsonl" > "$work/r_alone$k.jsonl" 2>/dev/null
done
"$py" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
batch = [json.loads(l) for l in open(f"{work}/r_batch.jsonl")]
for k in range(3):
    alone = json.loads(open(f"{work}/r_alone{k + 1}.jsonl").read())
    assert batch[k]["text"] == alone["text"], f"request {k}: in a batch {batch[k]['text']!r}, alone {alone['text']!r}"
    assert batch[k]["completion_tokens"] == alone["completion_tokens"]
assert batch[2]["completion_tokens"] == 3 and batch[2]["finish_reason"] == "length", batch[2]
print("2. sampled requests give the same text in a batch of 3 as alone")
PY
# --stop: an ASCII character of a free greedy run's text (random weights: mostly other bytes) ends
# the completion just before it.
"$shardlm" generate --model "$m" --prompt "the quick brown fox" --prompts /dev/null 2>/dev/null && fail "--prompt with --prompts accepted"
printf 'the quick brown fox\n' > "$work/fox.txt"
"$shardlm" generate --model "$m" --prompts "$work/fox.txt" --max-new-tokens 60 --temperature 0 > "$work/free.jsonl" 2>/dev/null
stop=$("$py" -c 'import json,sys; t=json.load(open(sys.argv[1]))["text"]; print(next((c for c in t if c.isascii() and c.isalnum()), ""))' "$work/free.jsonl")
if [[ -n "$stop" ]]; then
  "$shardlm" generate --model "$m" --prompts "$work/fox.txt" --max-new-tokens 60 --temperature 0 --stop "$stop" \
    > "$work/stopped.jsonl" 2>/dev/null
  "$py" - "$work" "$stop" <<'PY'
import json, sys
free = json.loads(open(f"{sys.argv[1]}/free.jsonl").read())
r = json.loads(open(f"{sys.argv[1]}/stopped.jsonl").read())
stop = sys.argv[2]
assert r["finish_reason"] == "stop" and r["text"] == free["text"][: free["text"].index(stop)], (r, free)
assert r["completion_tokens"] < free["completion_tokens"], (r, free)
print(f"   --stop {stop!r}: text {r['text']!r}, finish_reason stop, {r['completion_tokens']} tokens")
PY
else
  echo "   (no ASCII letter or digit in the free run: --stop not checked)"
fi

# ---- 3. chat ----
printf '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "max_new_tokens": 2}\n' \
  > "$work/chat.jsonl"
"$shardlm" generate --model "$m" --prompts "$work/chat.jsonl" --chat-format llama2 > "$work/chat_out.jsonl" 2>/dev/null
"$py" - "$work" <<'PY'
import json, sys
r = json.loads(open(f"{sys.argv[1]}/chat_out.jsonl").read())
want = "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"
assert r["prompt"] == want, r["prompt"]
print("3. the chat row is rendered in the llama2 format")
PY

# ---- 4. bad rows ----
bad() {  # bad NAME CONTENT PATTERN
  printf '%b' "$2" > "$work/$1.jsonl"
  if "$shardlm" generate --model "$m" --prompts "$work/$1.jsonl" > /dev/null 2> "$work/$1.err"; then fail "$1 was accepted"; fi
  [[ $(wc -l < "$work/$1.err") -eq 1 ]] || fail "$1: not one line: $(cat "$work/$1.err")"
  grep -q -- "$3" "$work/$1.err" || fail "$1: expected '$3' in: $(cat "$work/$1.err")"
  echo "4. $1: $(cat "$work/$1.err")"
}
bad bad_top_p '{"prompt": "x"}\n{"prompt": "x", "top_p": 3}\n' "bad_top_p.jsonl:2: key 'top_p'"
bad bad_field '{"prompt": "x", "temprature": 1}\n' "bad_field.jsonl:1: key 'temprature'"
bad bad_json '{"prompt": "x"}\n\n{"prompt": \n' "bad_json.jsonl:3: malformed JSON"
bad bad_both '{"prompt": "x", "messages": []}\n' "bad_both.jsonl:1: key 'prompt'"
bad bad_seed '{"prompt": "x", "seed": -1}\n' "bad_seed.jsonl:1: key 'seed'"
bad bad_stop '{"prompt": "x", "stop": [1]}\n' "bad_stop.jsonl:1: key 'stop'"
bad bad_role '{"messages": [{"role": "assistant", "content": "x"}]}\n' "bad_role.jsonl:1: key 'messages': .*user message"

# ---- 4b. an empty prompt in a batch: generation from BOS alone, as --prompt "" (issue 36) ----
printf '{"prompt": ""}\n{"prompt": "hello"}\n' > "$work/empty.jsonl"
"$shardlm" generate --model "$m" --prompts "$work/empty.jsonl" --max-new-tokens 3 --temperature 0 \
  > "$work/empty_out.jsonl" 2> "$work/empty.err" || fail "an empty prompt in --prompts failed: $(cat "$work/empty.err")"
[[ $(wc -l < "$work/empty_out.jsonl") -eq 2 ]] || fail "expected 2 result lines for the empty-prompt batch"

# ---- 4c. one --prompt ends with a timing line on stderr, none with --quiet (issue 36) ----
"$shardlm" generate --model "$m" --prompt "hello" --max-new-tokens 3 --temperature 0 > /dev/null 2> "$work/timing.err"
grep -Eq "^generate: [0-9]+ prompt tokens in [0-9.]+ s \([0-9.]+ tok/s prefill\), [0-9]+ new tokens in [0-9.]+ s \([0-9.]+ tok/s decode\)$" \
  "$work/timing.err" || fail "no timing line: $(cat "$work/timing.err")"
"$shardlm" generate --model "$m" --prompt "hello" --max-new-tokens 3 --temperature 0 --quiet > /dev/null 2> "$work/quiet.err"
! grep -q "tok/s" "$work/quiet.err" || fail "--quiet still printed the timing line"
echo "4c. $(cat "$work/timing.err")"

# ---- 4d. stop tokens: generation_config.json's eos_token_id, --stop-token-ids (issue 36) ----
# A copy of the model whose generation_config.json lists every id of the vocabulary: the first new
# token stops the completion (not counted), so it is empty with finish_reason "stop"; --stop-token-ids
# none replaces the default set with nothing, and the same prompt runs to max_new_tokens.
cp -r "$m" "$work/m_eos"
"$py" - "$work/m_eos" <<'PY'
import json, sys
d = sys.argv[1]
vocab = json.load(open(f"{d}/config.json"))["vocab_size"]
json.dump({"eos_token_id": list(range(vocab))}, open(f"{d}/generation_config.json", "w"))
PY
printf 'hello\n' > "$work/one.txt"
"$shardlm" generate --model "$work/m_eos" --prompts "$work/one.txt" --max-new-tokens 8 --temperature 0 \
  > "$work/eos_all.jsonl" 2> "$work/eos_all.err" || fail "generate with every id as EOS failed: $(cat "$work/eos_all.err")"
"$shardlm" generate --model "$work/m_eos" --prompts "$work/one.txt" --max-new-tokens 8 --temperature 0 \
  --stop-token-ids none > "$work/eos_none.jsonl" 2> "$work/eos_none.err" || fail "--stop-token-ids none failed: $(cat "$work/eos_none.err")"
"$py" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
r = json.loads(open(f"{work}/eos_all.jsonl").read())
assert r["completion_tokens"] == 0 and r["finish_reason"] == "stop", ("generation_config.json eos ignored", r)
r = json.loads(open(f"{work}/eos_none.jsonl").read())
assert r["completion_tokens"] == 8 and r["finish_reason"] == "length", ("--stop-token-ids none did not run to length", r)
print("4d. generation_config.json eos_token_id (every id): stops at the first new token; --stop-token-ids none: 8 tokens, length")
PY
# Refusals: an id outside the vocabulary, a value that is no id list, a malformed eos_token_id.
for bad in 99999 "1,x" "-1"; do
  if "$shardlm" generate --model "$m" --prompt "hello" --max-new-tokens 2 --stop-token-ids "$bad" > /dev/null 2> "$work/stopbad.err"; then
    fail "--stop-token-ids $bad was accepted"
  fi
  [[ $(wc -l < "$work/stopbad.err") -eq 1 ]] && grep -q -- "--stop-token-ids" "$work/stopbad.err" ||
    fail "--stop-token-ids $bad: expected one line naming the flag, got: $(cat "$work/stopbad.err")"
  echo "   --stop-token-ids $bad: $(cat "$work/stopbad.err")"
done
echo '{"eos_token_id": "2"}' > "$work/m_eos/generation_config.json"
if "$shardlm" generate --model "$work/m_eos" --prompt "hello" --max-new-tokens 2 > /dev/null 2> "$work/gencfg.err"; then
  fail "a string eos_token_id in generation_config.json was accepted"
fi
[[ $(wc -l < "$work/gencfg.err") -eq 1 ]] && grep -q "generation_config.json" "$work/gencfg.err" &&
  grep -q "eos_token_id" "$work/gencfg.err" || fail "expected one line naming generation_config.json and eos_token_id: $(cat "$work/gencfg.err")"
echo "   bad generation_config.json: $(cat "$work/gencfg.err")"

# ---- 5. --load-in-4bit ----
"$shardlm" generate --model "$m" --prompt "hello" --max-new-tokens 4 --temperature 0 --load-in-4bit \
  > /dev/null 2> "$work/nf4.err" || fail "--load-in-4bit failed: $(cat "$work/nf4.err")"
grep -q "quantized to NF4 and dequantized" "$work/nf4.err" || fail "--load-in-4bit did not say what it did"
echo "5. $(cat "$work/nf4.err")"

# ---- 6. the paged KV cache: a --kv-cache-memory that holds fewer than the batch preempts, with
# the same texts; too little for one sequence is refused in one line naming the flag ----
block_bytes=$("$py" -c '
import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))
hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
print(2 * c["num_hidden_layers"] * 4 * c["num_key_value_heads"] * hd * 4)' "$m")  # f32, blocks of 4
for args in "" "--kv-block-size 4 --kv-cache-memory $((24 * block_bytes))"; do
  # shellcheck disable=SC2086
  "$shardlm" generate --model "$m" --prompts "$work/p.txt" --batch-size 4 --max-new-tokens 40 --temperature 0 \
    --prefill-chunk 3 $args --output "$work/paged_${#args}.jsonl" 2> "$work/paged.err" ||
    fail "generate $args failed: $(cat "$work/paged.err")"
done
"$py" - "$work/paged_0.jsonl" "$work"/paged_[1-9]*.jsonl <<'PY'
import json, sys
free, tight = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert [r["text"] for r in free] == [r["text"] for r in tight], (free, tight)
assert sum(r["preemptions"] for r in free) == 0, free
n = sum(r["preemptions"] for r in tight)
assert n > 0, "24 blocks of 4 positions for 4 sequences of up to 46: expected preemptions"
print(f"6. a KV cache of 24 blocks of 4 positions: {n} preemptions, the same {len(tight)} texts")
PY
if "$shardlm" generate --model "$m" --prompt hello --max-new-tokens 40 --kv-block-size 4 \
  --kv-cache-memory $((2 * block_bytes)) > /dev/null 2> "$work/small.err"; then
  fail "a KV cache of 2 blocks for a sequence of 40 was accepted"
fi
[[ $(wc -l < "$work/small.err") -eq 1 ]] && grep -q -- "--kv-cache-memory" "$work/small.err" &&
  grep -q "holds 2 blocks of 4 positions" "$work/small.err" || fail "expected one line naming --kv-cache-memory: $(cat "$work/small.err")"
echo "   $(cat "$work/small.err")"
echo "OK"
