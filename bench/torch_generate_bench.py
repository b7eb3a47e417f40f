#!/usr/bin/python3
"""PyTorch's eager generation with a KV cache: the baseline of bench/generate_speed.sh.

The reference Llama (tests/torch_ref/llama_ref.py) is loaded from a model directory in float32, or
cast to bfloat16 with --dtype bf16 (weights, activations and KV cache in bf16, softmax in f32, as
transformers' eager path does with torch_dtype=torch.bfloat16), and runs what transformers' eager path runs when it generates greedily (transformers itself is not
installed here): per layer q/k/v projections, rotary embedding, the cache grown by torch.cat of
[B, Hkv, L, Dh] per layer (DynamicCache), repeat_kv, matmul - softmax - matmul attention (a causal
mask in the prefill), o_proj, MLP; final norm and lm_head on the last position only; argmax.

  /usr/bin/python3 bench/torch_generate_bench.py MODEL_DIR --batch B --prompt-tokens P
      --new-tokens N [--threads T] [--dtype f32|bf16]

Like shardlm generate, each of the B prompts (P random ids) is prefilled alone, then the B
sequences decode together, one token per step: the first new token comes from the prefill's
logits, the other N - 1 from decode steps. Prints one JSON line: prefill tokens/s (prompt tokens
over prefill time) and decode tokens/s (B x (N - 1) over the decode steps' time).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "torch_ref"))
import llama_ref  # noqa: E402


def layer_forward(layer, rotary, h, start, cache):
    """h [B, T, d] at positions start..start+T-1; cache [k, v] of [B, Hkv, start, Dh] (or None), grown in place."""
    a = layer.self_attn
    bsz, seq = h.shape[:2]
    x = layer.input_layernorm(h)
    q = a.q_proj(x).view(bsz, seq, -1, a.head_dim).transpose(1, 2)
    k = a.k_proj(x).view(bsz, seq, -1, a.head_dim).transpose(1, 2)
    v = a.v_proj(x).view(bsz, seq, -1, a.head_dim).transpose(1, 2)
    positions = torch.arange(start, start + seq).unsqueeze(0).expand(bsz, seq)
    cos, sin = rotary(x, positions)
    q, k = llama_ref.apply_rotary_pos_emb(q, k, cos, sin)
    if cache[0] is not None:
        k = torch.cat([cache[0], k], dim=2)
        v = torch.cat([cache[1], v], dim=2)
    cache[0], cache[1] = k, v
    k = llama_ref.repeat_kv(k, a.num_key_value_groups)
    v = llama_ref.repeat_kv(v, a.num_key_value_groups)
    scores = torch.matmul(q, k.transpose(2, 3)) * a.scaling
    if seq > 1:
        total = start + seq
        allowed = torch.arange(total)[None, :] <= torch.arange(start, total)[:, None]
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs, v).transpose(1, 2).reshape(bsz, seq, -1)
    h = h + a.o_proj(out)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def forward(model, ids, start, caches):
    """ids [B, T] -> logits of the last position [B, V]."""
    m = model.model
    h = m.embed_tokens(ids)
    for layer, cache in zip(m.layers, caches):
        h = layer_forward(layer, m.rotary_emb, h, start, cache)
    last = m.norm(h[:, -1, :])
    return F.linear(last, model.lm_head_weight())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, config = llama_ref.load_hf_dir(args.model, torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    model.eval()
    layers = len(model.model.layers)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, config["vocab_size"], (args.batch, args.prompt_tokens), generator=gen)
    with torch.inference_mode():
        forward(model, prompts[:1, :8], 0, [[None, None] for _ in range(layers)])  # warm-up
        t0 = time.perf_counter()
        per_seq, first = [], []
        for b in range(args.batch):
            caches = [[None, None] for _ in range(layers)]
            first.append(forward(model, prompts[b:b + 1], 0, caches).argmax(-1))
            per_seq.append(caches)
        prefill_s = time.perf_counter() - t0
        # The batch's cache: the sequences' caches side by side (all P long).
        caches = [[torch.cat([s[l][i] for s in per_seq], dim=0) for i in range(2)] for l in range(layers)]
        token = torch.cat(first).unsqueeze(1)
        t0 = time.perf_counter()
        for step in range(args.new_tokens - 1):
            token = forward(model, token, args.prompt_tokens + step, caches).argmax(-1).unsqueeze(1)
        decode_s = time.perf_counter() - t0
    steps = args.new_tokens - 1
    print(json.dumps({
        "batch": args.batch, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
        "threads": args.threads, "dtype": args.dtype, "torch": torch.__version__,
        "prefill_s": round(prefill_s, 4), "decode_s": round(decode_s, 4),
        "prefill_tokens_per_s": round(args.batch * args.prompt_tokens / prefill_s, 2),
        "decode_tokens_per_s": round(args.batch * steps / decode_s, 2) if steps > 0 else None,
    }))


if __name__ == "__main__":
    main()
