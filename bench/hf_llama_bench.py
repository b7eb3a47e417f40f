#!/usr/bin/env python3
"""Training throughput of Hugging Face LlamaForCausalLM on one GPU, as the baseline for
bench/gpu_train.sh (which runs shardlm on the same shape and batch and prints both side by side).

What runs: PyTorch eager (no torch.compile), attn_implementation="sdpa", full fine-tuning with
torch.optim.AdamW. The model is built from a config (random weights, nothing is downloaded); the
default shape is Llama 3.2 1B. Works with transformers 4.4x (torch_dtype=, rope_theta +
rope_scaling) and 5.x (dtype=, rope_parameters): the version decides which spelling is used.

Precision policy, as it really is on this side (torch.autocast(bfloat16) over f32 weights):
  - weights, gradients and AdamW state f32 (the master copy is the model itself);
  - every nn.Linear (q/k/v/o, gate/up/down, lm_head) casts its f32 weight and its input to bf16
    and runs a bf16 GEMM with f32 accumulation and a bf16 output; the weight's gradient comes out
    of a bf16 GEMM and is accumulated into the f32 .grad;
  - LlamaRMSNorm computes in f32 (it upcasts) and returns its input dtype; residual adds follow
    type promotion (f32 residual stream: the embedding output is f32);
  - attention: SDPA on bf16 q/k/v (FlashAttention-2 kernel where it applies);
  - the loss: the lm_head's bf16 logits for all B x T tokens are upcast to f32 and fed to
    cross_entropy (transformers' ForCausalLMLoss): an N x V f32 logits tensor exists.
shardlm's policy (bench/gpu_train.sh's header) differs in where the master weights live (its
optimizer shard) and in keeping activations bf16 and the lm_head + loss in chunks.

Peak memory: torch.cuda.max_memory_allocated / max_memory_reserved, reported twice: over the whole
process (model construction, warm-up and timed steps: what shardlm's allocator peak covers, since
its trainer does not reset the peak after warm-up) and over the timed steps only (reset after the
warm-up). gpu_train.sh compares the whole-run figures.

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
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])


def llama32_1b(seq_len):
    rope = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    theta = 500000.0
    if TRANSFORMERS_MAJOR >= 5:  # rope_theta and rope_scaling were folded into rope_parameters
        rope_kwargs = {"rope_parameters": dict(rope, rope_theta=theta)}
    else:
        rope_kwargs = {"rope_theta": theta, "rope_scaling": rope}
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
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        **rope_kwargs,
    )


def build_model(cfg):
    # transformers 5 (and 4.56+) spell the dtype argument dtype=; older versions torch_dtype=.
    dtype_kw = "dtype" if TRANSFORMERS_MAJOR >= 5 else "torch_dtype"
    return LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", **{dtype_kw: torch.float32})


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
    torch.cuda.reset_peak_memory_stats()
    model = build_model(cfg).to(dev)
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
    # Whole-run peaks so far (construction + warm-up); the timed steps' own peaks start here.
    run_allocated, run_reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    timed_allocated, timed_reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    run_allocated, run_reserved = max(run_allocated, timed_allocated), max(run_reserved, timed_reserved)

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
        "peak_allocated_bytes": run_allocated,  # whole run: construction, warm-up, timed steps
        "peak_reserved_bytes": run_reserved,
        "timed_peak_allocated_bytes": timed_allocated,  # timed steps only (reset after warm-up)
        "timed_peak_reserved_bytes": timed_reserved,
        "last_loss": float(loss),
        "precision": "f32 weights + grads + AdamW; bf16 autocast GEMMs (f32 accumulation), f32 RMSNorm, "
                     "bf16 SDPA, f32 N x V logits for the loss",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(),
    }
    gib = 2**30
    print("hf: tokens/s {:.0f} MFU {:.1f}% peak_allocated {:.2f} GiB peak_reserved {:.2f} GiB (whole run; timed steps "
          "only: {:.2f} / {:.2f} GiB) ({} params; torch {}, transformers {}; {})".format(
              tokens_per_s, 100 * mfu, run_allocated / gib, run_reserved / gib, timed_allocated / gib,
              timed_reserved / gib, n_params, res["torch"], res["transformers"], res["gpu"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
