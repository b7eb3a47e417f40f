#!/usr/bin/env python3
"""Training throughput of Hugging Face LlamaForCausalLM on one GPU, as the baseline for
bench/gpu_train.sh (which runs shardlm on the same shape and batch and prints both side by side).

What runs: PyTorch eager (no torch.compile), attn_implementation="sdpa", full fine-tuning with
torch.optim.AdamW. Precision: f32 weights (the master copy) and f32 AdamW state, forward and
backward under torch.autocast(bfloat16) -- the same policy as shardlm's
mixed_precision {param_dtype: bf16, reduce_dtype: f32}, which keeps f32 master weights and
computes in bf16. The model is built from a config (random weights, nothing is downloaded);
the default shape is Llama 3.2 1B.

MFU uses the PaLM formula (Chowdhery et al. 2022, appendix B): training FLOPs per token
6 N + 12 L H Q T, N = parameters (tied embeddings counted once: the lm_head matmul is real, the
embedding lookup is free), L layers, H heads, Q head dim, T sequence length; peak 989 TFLOP/s
(H100 SXM dense bf16) unless --peak-tflops says otherwise.

Prints one line starting with "hf:" that gpu_train.sh parses. NOT YET RUN ON A GPU.
"""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def llama32_1b(seq_len):
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=max(131072, seq_len),
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()

    assert torch.cuda.is_available(), "hf_llama_bench.py needs a CUDA GPU"
    torch.manual_seed(0)
    dev = torch.device("cuda")
    cfg = llama32_1b(a.seq)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", torch_dtype=torch.float32).to(dev)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())  # tied: the shared tensor once
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.0)

    # Random token ids: throughput does not depend on the text.
    B, T = a.micro_batch, a.seq
    ids = torch.randint(0, cfg.vocab_size, (B, T), device=dev)

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0

    tokens_per_s = B * T * a.steps / seconds
    L, H, Q = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim
    flops_per_token = 6 * n_params + 12 * L * H * Q * T
    mfu = tokens_per_s * flops_per_token / (a.peak_tflops * 1e12)
    res = {
        "impl": "hf",
        "params": n_params,
        "micro_batch": B,
        "seq": T,
        "steps": a.steps,
        "tokens_per_s": tokens_per_s,
        "mfu": mfu,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "last_loss": float(loss),
        "precision": "f32 weights + AdamW, bf16 autocast",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
    }
    print("hf: tokens/s {:.0f} MFU {:.1f}% peak_allocated {:.2f} GiB peak_reserved {:.2f} GiB ({}; {} params; {})".format(
        tokens_per_s, 100 * mfu, res["peak_allocated_bytes"] / 2**30, res["peak_reserved_bytes"] / 2**30,
        res["precision"], n_params, res["gpu"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
