#!/usr/bin/env bash
# `shardlm init --set` and `shardlm generate` at the model's limits (issue 18):
#  1. overriding hidden_size / num_attention_heads without head_dim derives head_dim =
#     hidden_size / num_attention_heads (as transformers does when the key is absent), so the
#     attention projections are [hidden, hidden]; an explicit head_dim is kept; a hidden_size the
#     heads do not divide is refused in one line naming both keys;
#  2. generate with --max-new-tokens past max_position_embeddings says the cap before it starts and
#     says why it stopped; a prompt that fills the context is refused; within the context, no note.
# Usage: init_generate_cli.sh SHARDLM WORKDIR
set -euo pipefail
shardlm=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

# Reads config.json's head_dim and the q_proj shape from the safetensors header.
shape_of() {
  /usr/bin/python3 - "$1" <<'PY'
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(f"{d}/config.json"))
with open(f"{d}/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
q = header["model.layers.0.self_attn.q_proj.weight"]["shape"]
print(f"head_dim {cfg['head_dim']} q_proj {q[0]}x{q[1]}")
PY
}

# ---- 1. init --set and head_dim ----
"$shardlm" init --preset tiny --set hidden_size=256 --set num_attention_heads=8 --out "$work/wide" > "$work/wide.txt"
got=$(shape_of "$work/wide")
echo "hidden_size=256 num_attention_heads=8: $got"
[[ "$got" == "head_dim 32 q_proj 256x256" ]] || fail "expected head_dim 32 and q_proj 256x256, got '$got'"
grep -q "head_dim 32 = hidden_size 256 / num_attention_heads 8" "$work/wide.txt" || fail "init did not say how head_dim was set: $(cat "$work/wide.txt")"
"$shardlm" init --preset tiny --set num_attention_heads=2 --set num_key_value_heads=1 --out "$work/heads" >/dev/null
got=$(shape_of "$work/heads")
[[ "$got" == "head_dim 32 q_proj 64x64" ]] || fail "num_attention_heads=2 alone: expected head_dim 32, got '$got'"
"$shardlm" init --preset tiny --set hidden_size=256 --set num_attention_heads=8 --set head_dim=16 --out "$work/explicit" >/dev/null
got=$(shape_of "$work/explicit")
[[ "$got" == "head_dim 16 q_proj 128x256" ]] || fail "an explicit head_dim=16 must be kept, got '$got'"
if "$shardlm" init --preset tiny --set hidden_size=100 --set num_attention_heads=8 --out "$work/bad" > "$work/bad.txt" 2>&1; then
  fail "hidden_size 100 with 8 heads was accepted"
fi
echo "hidden_size=100 num_attention_heads=8: $(cat "$work/bad.txt")"
[[ $(wc -l < "$work/bad.txt") -eq 1 ]] || fail "the refusal is not one line"
grep -q "hidden_size" "$work/bad.txt" && grep -q "num_attention_heads" "$work/bad.txt" || fail "the refusal does not name both keys"

# ---- 2. generate past the context ----
"$shardlm" init --preset tiny --set max_position_embeddings=24 --seed 0 --out "$work/short" >/dev/null
# A 6-token prompt (BOS + 5 bytes) leaves 18 positions. Greedy decoding of these random weights
# (seed 0) never emits EOS, so it runs into the end of the context, and must say so.
"$shardlm" generate --model "$work/short" --prompt "hello" --max-new-tokens 100 --temperature 0 \
  > "$work/gen.out" 2> "$work/gen.err" || fail "generate failed: $(cat "$work/gen.err")"
cat "$work/gen.err"
grep -q "generate: --max-new-tokens 100 with a 6-token prompt passes the model's max_position_embeddings 24: at most 18 new tokens" \
  "$work/gen.err" || fail "generate did not state the cap"
grep -q "stopped after 18 new tokens: the model's context of 24 positions is full" "$work/gen.err" ||
  fail "generate did not say it stopped at the end of the context"
# --quiet: without the timing line, stderr holds only notes, and within the context there is none.
"$shardlm" generate --model "$work/short" --prompt "hello" --max-new-tokens 4 --temperature 0 --quiet \
  > /dev/null 2> "$work/gen_ok.err" || fail "generate within the context failed"
[[ ! -s "$work/gen_ok.err" ]] || fail "a note within the context: $(cat "$work/gen_ok.err")"
if "$shardlm" generate --model "$work/short" --prompt "a prompt longer than the context of this model" \
  --max-new-tokens 4 > /dev/null 2> "$work/gen_long.err"; then
  fail "a prompt longer than the context was accepted"
fi
cat "$work/gen_long.err"
grep -q "max_position_embeddings is 24: no position is left" "$work/gen_long.err" || fail "wrong refusal of a long prompt"
echo "init_generate_cli: ok"
