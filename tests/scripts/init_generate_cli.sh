#!/usr/bin/env bash
# `shardlm init --set` (issue 18):
#  1. overriding hidden_size / num_attention_heads without head_dim derives head_dim =
#     hidden_size / num_attention_heads (as transformers does when the key is absent), so the
#     attention projections are [hidden, hidden]; an explicit head_dim is kept; a hidden_size the
#     heads do not divide is refused in one line naming both keys;
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

echo "init_generate_cli: ok"
