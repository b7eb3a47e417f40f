#!/usr/bin/env bash
# `shardlm merge --verify` (issue 31; src/infer/merge_check.h): the merged model's logits against
# the base's with the adapter unmerged, on a tiny random Llama and a random adapter (non-zero B).
#  A. merges in f32 and bf16 pass with the default tolerances; --prompts FILE is read;
#  B. a merged directory given with --merged whose one adapted weight was left unmerged (its bytes
#     copied from the base) fails, exit 1, one line naming the directory and the largest
#     difference; so do the base itself and a bf16 merge held to --tolerance 1e-9;
#  C. QLoRA on a dense base: --merge-into dequantized merges into the base rounded through NF4 and
#     passes; the dense merge checked against the NF4 base fails, and the reverse; `shardlm eval`
#     of the adapter on the NF4 base through the training engine has the loss of that merge;
#  D. a bitsandbytes 4-bit base (tests/bnb_dir.h): merged into its dequantization, passes;
#     --merge-into dense is refused naming its quantization_config; a bad --merge-into is refused.
# Usage: merge_verify_cli.sh SHARDLM PEFT_TOOL PYTHON WORKDIR
set -euo pipefail
shardlm=$1
tool=$2
py=$3
work=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
# must_fail NAME CMD...: CMD exits 1 with one line on stderr (kept in NAME.err)
must_fail() {
  local name=$1 rc=0
  shift
  "$@" > "$work/$name.out" 2> "$work/$name.err" || rc=$?
  [[ $rc == 1 ]] || fail "$name: exit $rc, expected 1: $(cat "$work/$name.out" "$work/$name.err")"
  [[ $(wc -l < "$work/$name.err") == 1 ]] || fail "$name: not one line: $(cat "$work/$name.err")"
}

"$shardlm" init --preset tiny --set initializer_range=0.1 --seed 3 --dtype f32 --out "$work/base" >/dev/null
"$tool" make-adapter "$work/base" "$work/lora" --rank 4 --alpha 8 --targets q_proj,v_proj,down_proj --seed 1 >/dev/null
m=("$shardlm" merge --base "$work/base" --adapter "$work/lora")

# ---- A ----
"${m[@]}" --out "$work/m32" --dtype f32 --verify > "$work/m32.txt"
grep -q "^verify: $work/m32 computes what $work/base as stored with the adapter $work/lora unmerged computes: 4 prompts, [0-9]* positions: largest |logit difference| .* --tolerance 0.0001 (the default for f32 weights)" \
  "$work/m32.txt" || fail "f32 merge --verify: $(cat "$work/m32.txt")"
"${m[@]}" --out "$work/m16" --dtype bf16 --verify > "$work/m16.txt"
grep -q "^verify: .* --tolerance 0.03 (the default for bf16 weights)" "$work/m16.txt" || fail "bf16: $(cat "$work/m16.txt")"
printf 'Hello there\n\nA second prompt\n' > "$work/prompts.txt"
"${m[@]}" --merged "$work/m32" --prompts "$work/prompts.txt" > "$work/prompts.out"
grep -q ": 2 prompts, " "$work/prompts.out" || fail "--prompts: $(cat "$work/prompts.out")"

# ---- B ----
cp -r "$work/m32" "$work/bad"
"$py" - "$work/base/model.safetensors" "$work/bad/model.safetensors" model.layers.1.self_attn.v_proj.weight <<'PY'
import json, struct, sys
def where(path, name):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        begin, end = json.loads(f.read(n))[name]["data_offsets"]
        return 8 + n + begin, end - begin
src, dst, name = sys.argv[1:]
(s, size), (d, size2) = where(src, name), where(dst, name)
assert size == size2
with open(src, "rb") as f:
    f.seek(s)
    data = f.read(size)
with open(dst, "r+b") as f:
    f.seek(d)
    f.write(data)
PY
must_fail unmerged "${m[@]}" --merged "$work/bad"
grep -q "^shardlm: error: $work/bad: not the base with the adapter $work/lora unmerged ($work/base as stored): 4 prompts, [0-9]* positions: largest |logit difference| [0-9.e-]* at prompt [0-9] position [0-9]* token [0-9]*, .* of the largest |logit| .*; --tolerance 0.0001 (the default for f32 weights)$" \
  "$work/unmerged.err" || fail "an unmerged weight: $(cat "$work/unmerged.err")"
must_fail base_as_merged "${m[@]}" --merged "$work/base"
must_fail tight "${m[@]}" --merged "$work/m16" --tolerance 1e-9
grep -q -- "--tolerance 1e-09$" "$work/tight.err" || fail "--tolerance: $(cat "$work/tight.err")"

# ---- C ----
"${m[@]}" --out "$work/q32" --dtype f32 --merge-into dequantized --verify > "$work/q32.txt"
grep -q "^base: $work/base's 14 decoder Linear weights rounded through NF4" "$work/q32.txt" ||
  fail "--merge-into dequantized did not say it rounded the base: $(cat "$work/q32.txt")"
grep -q "^verify: $work/q32 computes what $work/base with its decoder Linear weights rounded through NF4 with the adapter" \
  "$work/q32.txt" || fail "--merge-into dequantized --verify: $(cat "$work/q32.txt")"
must_fail dense_vs_nf4 "${m[@]}" --merged "$work/m32" --merge-into dequantized
must_fail nf4_vs_dense "${m[@]}" --merged "$work/q32" --merge-into dense
# The base QLoRA training sees: `shardlm eval` through the training engine with the base in NF4
# (lora.quantize_base: nf4) and the adapter unmerged has the loss of the --merge-into dequantized
# merge, and plain LoRA's is the dense merge's.
seq 1 600 | tr '\n' ' ' > "$work/text.txt"
loss() { "$shardlm" eval --data "$work/text.txt" --data-type text --seq-len 64 "$@" 2>/dev/null | sed -n 's/^eval: loss \([0-9.]*\),.*/\1/p'; }
same() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; exit !(a != "" && (d < 0 ? -d : d) < 1e-5) }'; }
qlora=$(loss --model "$work/base" --adapter "$work/lora" lora.quantize_base=nf4)
lora=$(loss --model "$work/base" --adapter "$work/lora")
q32=$(loss --model "$work/q32")
m32=$(loss --model "$work/m32")
same "$qlora" "$q32" || fail "QLoRA's eval loss $qlora is not the --merge-into dequantized merge's $q32"
same "$lora" "$m32" || fail "LoRA's eval loss $lora is not the dense merge's $m32"
! same "$qlora" "$m32" || fail "QLoRA's eval loss $qlora equals the dense merge's $m32: the test cannot tell them apart"

# ---- D ----
"$tool" bnb-dir "$work/base" "$work/bnb"
b=("$shardlm" merge --base "$work/bnb" --adapter "$work/lora")
"${b[@]}" --out "$work/b16" --verify > "$work/b16.txt"
grep -q "^verify: $work/b16 computes what $work/bnb's NF4 weights dequantized as bitsandbytes does with the adapter .* (the default for bf16 weights)" \
  "$work/b16.txt" || fail "a bitsandbytes base: $(cat "$work/b16.txt")"
"${b[@]}" --merged "$work/b16" --merge-into dequantized >/dev/null
must_fail bnb_dense "${b[@]}" --out "$work/b_dense" --merge-into dense
grep -q "$work/bnb/config.json: key 'quantization_config': a bitsandbytes 4-bit model holds no dense weights" \
  "$work/bnb_dense.err" || fail "--merge-into dense on a bitsandbytes base: $(cat "$work/bnb_dense.err")"
[[ ! -e "$work/b_dense" ]] || fail "a refused merge wrote its output"
must_fail bad_into "${m[@]}" --out "$work/x" --merge-into nf4
grep -q "key '--merge-into': 'nf4': expected dequantized" "$work/bad_into.err" || fail "bad --merge-into: $(cat "$work/bad_into.err")"
echo "OK"
