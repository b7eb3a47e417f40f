#!/usr/bin/python3
"""PyTorch baseline for shardlm's training speed: full float32 training steps of the reference
Llama (tests/torch_ref/llama_ref.py) on the CPU.

Usage:
  /usr/bin/python3 bench/torch_train_bench.py [--dim 256] [--layers 4] [--heads 8] [--kv-heads 4]
      [--ffn 688] [--vocab 32000] [--seq 256] [--batch 8] [--steps 10] [--warmup 2] [--threads N]
      [--autocast bf16] [--tie]

A step is: zero_grad, forward, mean cross entropy on next-token targets, backward,
clip_grad_norm_(1.0), AdamW step (lr 3e-4, betas (0.9, 0.95), weight decay 0.1 on
decay_param_names). --autocast bf16 runs the forward and the loss under
torch.autocast('cpu', dtype=torch.bfloat16) (f32 weights and AdamW; matmuls in bf16, their backward
too); --tie ties the head to the input embedding (as the Llama 3.2 presets do). After --warmup untimed steps, --steps steps are timed; prints one JSON line
{"tokens_per_s", "step_ms", "threads", ...} with step_ms the mean over the timed steps.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "torch_ref"))
import llama_ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=688)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none")
    ap.add_argument("--tie", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    config = {
        "architectures": ["LlamaForCausalLM"], "vocab_size": args.vocab, "hidden_size": args.dim,
        "intermediate_size": args.ffn, "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": args.tie,
    }
    model = llama_ref.Llama(config, seed=args.seed)
    params = list(model.parameters())
    opt = torch.optim.AdamW(llama_ref.param_groups(model, 0.1), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            foreach=False)
    gen = torch.Generator().manual_seed(args.seed)

    def batch():
        ids = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen)
        return ids[:, :-1], ids[:, 1:]

    def step(ids, targets):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            loss = llama_ref.Llama.loss(model(ids), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    batches = [batch() for _ in range(args.warmup + args.steps)]
    for ids, targets in batches[:args.warmup]:
        step(ids, targets)
    t0 = time.perf_counter()
    loss = float("nan")
    for ids, targets in batches[args.warmup:]:
        loss = step(ids, targets)
    elapsed = time.perf_counter() - t0
    steps = max(1, args.steps)
    step_s = elapsed / steps
    print(json.dumps({
        "tokens_per_s": round(args.batch * args.seq / step_s, 1) if args.steps else 0.0,
        "step_ms": round(step_s * 1000.0, 3),
        "threads": args.threads,
        "params": sum(p.numel() for p in params),
        "batch": args.batch, "seq": args.seq, "steps": args.steps, "last_loss": round(loss, 6),
        "torch": torch.__version__, "autocast": args.autocast,
    }))


if __name__ == "__main__":
    main()
