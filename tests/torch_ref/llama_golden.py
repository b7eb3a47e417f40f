#!/usr/bin/python3
"""Golden files for shardlm's end-to-end model tests, computed by the PyTorch reference llama_ref.py.

Usage:
  llama_golden.py make MODEL_DIR OUT_DIR [--seed S] [--batch B] [--seq T] [--steps K] [--lr LR]
                  [--weight-decay WD] [--max-grad-norm G] [--packed] [--threads N]
  llama_golden.py check-logits MODEL_DIR IDS.npy LOGITS.npy [--positions P.npy] [--segments S.npy]
                  [--atol A] [--rtol R]
  llama_golden.py selftest

make: loads MODEL_DIR (a Hugging Face directory shardlm wrote) in float32 and writes to OUT_DIR
  batch{s}_ids.npy, batch{s}_targets.npy [B, T] int32 for s = 0..K (K + 1 batches; targets are the
      next token within the sequence / segment, -100 at the last position of each sequence or
      segment and at a few random places), and with --packed batch{s}_positions.npy and
      batch{s}_segments.npy [B, T] int32 (segment ids 0, 1, ... per row, positions restarting at 0);
  logits.npy [B, T, V]       batch 0 at the initial weights;
  grads/<name>.npy           gradient of batch 0's mean loss at the initial weights, for every
                             parameter (HF names; a tied model has no lm_head.weight, and the
                             embedding's gradient holds both uses);
  final/<name>.npy           the parameters after K AdamW steps on batches 0..K-1;
  golden.json                loss0, step_losses, grad_norms (pre-clip global L2 norms), final_loss
                             (batch K at the final weights), the optimizer settings, decay / no_decay.
  Each step: zero_grad, loss, backward, clip_grad_norm_(params, G) if G > 0, AdamW step, with
  torch.optim.AdamW(foreach=False), betas (0.9, 0.95), eps 1e-8, weight decay only on decay_param_names.

check-logits: runs the model on IDS (and optional positions / segments) and compares with LOGITS;
  prints the max abs diff and exits 0 when allclose(atol, rtol), else 1.

selftest: checks llama_ref itself on tiny random models (a few seconds): a plain independent forward,
  packed segments against separate runs, float64 gradcheck, the llama3 frequencies, state dict names,
  and a save / load round trip when safetensors_check.save is available.
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import llama_ref  # noqa: E402

BETAS = (0.9, 0.95)
EPS = 1e-8
SEGMENT_LENGTHS = [5, 7, 3, 11, 2, 9, 6]


def to_numpy(t):
    t = t.detach().cpu().contiguous()
    if t.dtype.is_floating_point:
        return t.float().numpy()
    return t.to(torch.int32).numpy()


# ---------------------------------------------------------------------------------------------
# Batches


def make_batch(gen, vocab, batch, seq, packed, row_offset=0):
    """ids, targets, positions, segments ([B, T] int64; positions / segments None unless packed)."""
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    targets = torch.full((batch, seq), -100, dtype=torch.int64)
    targets[:, :-1] = ids[:, 1:]
    positions = segments = None
    if packed:
        segments = torch.empty(batch, seq, dtype=torch.int64)
        positions = torch.empty(batch, seq, dtype=torch.int64)
        for b in range(batch):
            t, seg, k = 0, 0, b + row_offset
            while t < seq:
                n = min(SEGMENT_LENGTHS[k % len(SEGMENT_LENGTHS)], seq - t)
                segments[b, t:t + n] = seg
                positions[b, t:t + n] = torch.arange(n)
                t, seg, k = t + n, seg + 1, k + 1
        # The last token of a segment predicts nothing (the next token belongs to another example).
        boundary = segments[:, 1:] != segments[:, :-1]
        targets[:, :-1][boundary] = -100
    # A few extra ignored positions.
    extra = max(1, batch * seq // 10)
    flat = torch.randint(0, batch * seq, (extra,), generator=gen)
    targets.view(-1)[flat] = -100
    return ids, targets, positions, segments


def run_loss(model, batch):
    ids, targets, positions, segments = batch
    logits = model(ids, position_ids=positions, segment_ids=segments)
    return logits, llama_ref.Llama.loss(logits, targets)


def global_grad_norm(params):
    """clip_grad_norm_'s total norm (used when no clipping is asked for)."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.norm(torch.stack([torch.norm(g.detach(), 2.0) for g in grads]), 2.0)


def cmd_make(args):
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.threads)
    model, _ = llama_ref.load_hf_dir(args.model_dir)
    vocab = model.config["vocab_size"]

    out = args.out_dir
    os.makedirs(out, exist_ok=True)
    for sub in ("grads", "final"):
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
        os.makedirs(os.path.join(out, sub))
    for f in os.listdir(out):
        if (f.startswith("batch") and f.endswith(".npy")) or f in ("logits.npy", "golden.json"):
            os.remove(os.path.join(out, f))

    gen = torch.Generator().manual_seed(args.seed)
    batches = [make_batch(gen, vocab, args.batch, args.seq, args.packed, row_offset=s)
               for s in range(args.steps + 1)]
    for s, (ids, targets, positions, segments) in enumerate(batches):
        np.save(os.path.join(out, f"batch{s}_ids.npy"), to_numpy(ids))
        np.save(os.path.join(out, f"batch{s}_targets.npy"), to_numpy(targets))
        if args.packed:
            np.save(os.path.join(out, f"batch{s}_positions.npy"), to_numpy(positions))
            np.save(os.path.join(out, f"batch{s}_segments.npy"), to_numpy(segments))

    named = list(model.named_parameters())
    params = [p for _, p in named]

    # Batch 0 at the initial weights: logits, loss, gradients.
    logits, loss0 = run_loss(model, batches[0])
    loss0.backward()
    np.save(os.path.join(out, "logits.npy"), to_numpy(logits))
    for name, p in named:
        np.save(os.path.join(out, "grads", name + ".npy"), to_numpy(p.grad))

    decay = llama_ref.decay_param_names(model)
    no_decay = [n for n, _ in named if n not in set(decay)]
    opt = torch.optim.AdamW(llama_ref.param_groups(model, args.weight_decay), lr=args.lr, betas=BETAS,
                            eps=EPS, foreach=False)
    step_losses, grad_norms = [], []
    for s in range(args.steps):
        opt.zero_grad(set_to_none=True)
        _, loss = run_loss(model, batches[s])
        loss.backward()
        if args.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        else:
            norm = global_grad_norm(params)
        opt.step()
        step_losses.append(loss.item())
        grad_norms.append(norm.item())
    for name, p in named:
        np.save(os.path.join(out, "final", name + ".npy"), to_numpy(p))
    with torch.no_grad():
        _, final_loss = run_loss(model, batches[args.steps])

    golden = {
        "loss0": loss0.item(), "step_losses": step_losses, "grad_norms": grad_norms,
        "final_loss": final_loss.item(),
        "lr": args.lr, "betas": list(BETAS), "eps": EPS, "weight_decay": args.weight_decay,
        "max_grad_norm": args.max_grad_norm, "steps": args.steps, "batch": args.batch, "seq": args.seq,
        "packed": bool(args.packed), "seed": args.seed, "decay": decay, "no_decay": no_decay,
    }
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
    print(f"wrote golden files to {out}: loss0 {loss0.item():.6f}, "
          f"final step loss {step_losses[-1] if step_losses else float('nan'):.6f}, {len(named)} parameters")


def cmd_check_logits(args):
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, _ = llama_ref.load_hf_dir(args.model_dir)
    ids = torch.from_numpy(np.load(args.ids).astype(np.int64))
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    positions = torch.from_numpy(np.load(args.positions).astype(np.int64)) if args.positions else None
    segments = torch.from_numpy(np.load(args.segments).astype(np.int64)) if args.segments else None
    expected = torch.from_numpy(np.load(args.logits).astype(np.float32))
    with torch.no_grad():
        logits = model(ids, position_ids=positions, segment_ids=segments)
    if tuple(expected.shape) != tuple(logits.shape):
        print(f"check-logits: shape mismatch: given {tuple(expected.shape)}, reference {tuple(logits.shape)}")
        return 1
    diff = (logits - expected).abs()
    max_diff = diff.max().item()
    scale = logits.abs().max().item()
    if torch.allclose(logits, expected, atol=args.atol, rtol=args.rtol) and torch.isfinite(expected).all():
        print(f"check-logits: ok, max abs diff {max_diff:.3e} (max |logit| {scale:.3e}, "
              f"atol {args.atol}, rtol {args.rtol})")
        return 0
    where = np.unravel_index(int(diff.nan_to_num(float("inf")).argmax()), tuple(diff.shape))
    print(f"check-logits: FAIL, max abs diff {max_diff:.3e} (max |logit| {scale:.3e}) beyond atol {args.atol} "
          f"rtol {args.rtol}; worst at {tuple(int(i) for i in where)}: reference {logits[where].item():.6g}, "
          f"given {expected[where].item():.6g}")
    return 1


# ---------------------------------------------------------------------------------------------
# Self-test


def tiny_config(**over):
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": 37, "hidden_size": 32,
           "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": False}
    cfg.update(over)
    return cfg


def plain_forward(model, ids, positions):
    """An independent float64 forward (per head loops, complex-number RoPE, explicit causal softmax)
    to check the HF-style code against; ids, positions [B, T]; no segments."""
    c = model.config
    sd = {k: v.double() for k, v in model.state_dict().items()}
    inv = llama_ref.inv_freq_for(c).double()
    H, Hkv, Dh = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]

    def norm(x, w):
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    def lin(x, name):
        y = x @ sd[name + ".weight"].T
        return y + sd[name + ".bias"] if name + ".bias" in sd else y

    def rope(x, pos):  # x [T, Dh]; pairs (i, i + Dh/2) as complex numbers
        # The angle pos * inv_freq is one float32 product in HF (then cos / sin in float32); the
        # rounding of that product is kept here, or large positions would differ by ~pos * 2^-24.
        angle = (pos.float()[:, None] * inv.float()[None, :]).double()
        z = torch.complex(x[:, : Dh // 2], x[:, Dh // 2:])
        z = z * torch.polar(torch.ones_like(angle), angle)
        return torch.cat([z.real, z.imag], dim=-1)

    B, T = ids.shape
    out = []
    for b in range(B):
        x = sd["model.embed_tokens.weight"][ids[b].long()]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = norm(x, sd[p + "input_layernorm.weight"])
            q, k, v = (lin(h, p + f"self_attn.{n}_proj") for n in "qkv")
            heads = []
            for hh in range(H):
                kv = hh // (H // Hkv)
                qh = rope(q[:, hh * Dh:(hh + 1) * Dh], positions[b])
                kh = rope(k[:, kv * Dh:(kv + 1) * Dh], positions[b])
                vh = v[:, kv * Dh:(kv + 1) * Dh]
                s = qh @ kh.T / math.sqrt(Dh)
                s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), -math.inf)
                heads.append(torch.softmax(s, -1) @ vh)
            x = x + lin(torch.cat(heads, -1), p + "self_attn.o_proj")
            h = norm(x, sd[p + "post_attention_layernorm.weight"])
            g = lin(h, p + "mlp.gate_proj")
            x = x + lin(g * torch.sigmoid(g) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
        x = norm(x, sd["model.norm.weight"])
        w = sd["model.embed_tokens.weight"] if c["tie_word_embeddings"] else sd["lm_head.weight"]
        out.append(x @ w.T)
    return torch.stack(out)


def expected_names(cfg):
    c = llama_ref.normalize_config(cfg)
    names = ["model.embed_tokens.weight"]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for n in "qkvo":
            names.append(p + f"self_attn.{n}_proj.weight")
            if (c["qkv_bias"] if n != "o" else c["o_bias"]):
                names.append(p + f"self_attn.{n}_proj.bias")
        names += [p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    names.append("model.norm.weight")
    if not c["tie_word_embeddings"]:
        names.append("lm_head.weight")
    return names


def packed_vs_alone(model, ids, positions, segments, seg_lens):
    """Max abs difference between each segment's logits in the packed batch and the logits of that
    segment run alone (positions from 0, no segment ids)."""
    packed = model(ids, position_ids=positions, segment_ids=segments)
    worst = 0.0
    for b, lens in enumerate(seg_lens):
        start = 0
        for n in lens:
            alone = model(ids[b:b + 1, start:start + n])
            worst = max(worst, (packed[b:b + 1, start:start + n] - alone).abs().max().item())
            start += n
    return worst


def perturb_norms(model, seed):
    """Random norm weights and biases (init sets them to 1 and 0, which would hide mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif llama_ref.is_norm_param(model, name):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        check.failed += 1


check.failed = 0


def cmd_selftest(args):
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    llama31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    variants = {
        "llama_gqa": tiny_config(),
        "llama_tied_mha_bias": tiny_config(num_key_value_heads=4, tie_word_embeddings=True, attention_bias=True),
        "llama31_rope": tiny_config(rope_theta=500000.0, rope_scaling=dict(llama31, factor=2.0,
                                    original_max_position_embeddings=16)),
        "qwen2_mqa_headdim": tiny_config(architectures=["Qwen2ForCausalLM"], num_key_value_heads=1, head_dim=16,
                                         tie_word_embeddings=True),
        "mistral": tiny_config(architectures=["MistralForCausalLM"], sliding_window=None),
    }
    B, T = 2, 16
    seg_lens = [[5, 7, 4], [3, 13]]
    for vname, cfg in variants.items():
        # Weights large enough that attention is far from uniform (std 0.02 would hide mask or
        # RoPE mistakes behind near-uniform attention and tiny logits).
        model = llama_ref.Llama(cfg, init=False).init_weights(seed=1, std=0.3)
        perturb_norms(model, 2)
        names = [n for n, _ in model.named_parameters()]
        check(names == expected_names(cfg) and list(model.state_dict()) == names,
              f"{vname}: parameter / state_dict names are HF's ({len(names)})")
        decay = llama_ref.decay_param_names(model)
        check(all(not n.endswith(".bias") and "norm" not in n for n in decay)
              and all(n.endswith(".bias") or "norm" in n for n in names if n not in decay),
              f"{vname}: decay names exclude norms and biases")

        ids = torch.randint(0, cfg["vocab_size"], (B, T))
        with torch.no_grad():
            # (a) arange positions, no segments: equal to the plain float64 forward.
            logits = model(ids)
            ref = plain_forward(model, ids, torch.arange(T).repeat(B, 1))
            scale = ref.abs().max().item()
            err32 = (logits.double() - ref).abs().max().item() / scale
            # In float64 only cos / sin stay float32 (as HF computes them), hence not 1e-15.
            err64 = (model.double()(ids) - ref).abs().max().item() / scale
            model.float()
            check(err32 < 1e-5 and err64 < 1e-6,
                  f"{vname}: matches a plain implementation (max |logit| {scale:.2f}, relative error "
                  f"f32 {err32:.1e}, f64 {err64:.1e})")
            # Explicit positions at an offset equal the plain forward with those positions.
            pos = torch.arange(T).repeat(B, 1) + torch.tensor([[3], [1000]])
            err = (model(ids, position_ids=pos).double() - plain_forward(model, ids, pos)).abs().max().item()
            check(err / scale < 1e-5,
                  f"{vname}: position_ids 3.. and 1000.. match the plain implementation (relative {err / scale:.1e})")

            # (b) packed: each segment's logits equal running that segment alone.
            segs = torch.stack([torch.cat([torch.full((n,), i) for i, n in enumerate(r)]) for r in seg_lens])
            poss = torch.stack([torch.cat([torch.arange(n) for n in r]) for r in seg_lens])
            worst = packed_vs_alone(model, ids, poss, segs, seg_lens)
            check(worst < 1e-5 * max(1.0, scale),
                  f"{vname}: packed segments equal separate runs (max abs diff {worst:.1e}, max |logit| {scale:.2f})")
            # The same in float64, where exact masking leaves only ~1e-15 of rounding.
            worst = packed_vs_alone(model.double(), ids, poss, segs, seg_lens)
            model.float()
            check(worst < 1e-12, f"{vname}: packed segments equal separate runs in float64 ({worst:.1e})")

    # Sliding window: Mistral with window 4 equals the plain computation restricted by the mask.
    cfg = tiny_config(architectures=["MistralForCausalLM"], sliding_window=4, num_hidden_layers=1)
    model = llama_ref.Llama(cfg, seed=3)
    ids = torch.randint(0, cfg["vocab_size"], (1, 10))
    with torch.no_grad():
        full = llama_ref.Llama(dict(cfg, sliding_window=None), init=False)
        full.load_state_dict(model.state_dict())
        a, b = model(ids), full(ids)
        # The first 4 positions see the same keys either way; later ones see fewer.
        check((a[:, :4] - b[:, :4]).abs().max().item() == 0 and (a[:, 4:] - b[:, 4:]).abs().max().item() > 1e-4,
              "mistral sliding_window 4 masks keys at distance >= 4")

    # (c) gradcheck in float64 on a very tiny config, packed, with ignored targets.
    for vname, over in [("llama_gqa", {}), ("qwen2_tied", {"architectures": ["Qwen2ForCausalLM"],
                                                           "tie_word_embeddings": True})]:
        cfg = tiny_config(vocab_size=7, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, **over)
        model = llama_ref.Llama(cfg, seed=4, init=True).double()
        model.init_weights(seed=4, std=0.5)
        perturb_norms(model, 5)
        ids = torch.tensor([[1, 4, 6, 0, 2, 5]])
        targets = torch.tensor([[4, 6, -100, 2, 5, -100]])
        segs = torch.tensor([[0, 0, 0, 1, 1, 1]])
        pos = torch.tensor([[0, 1, 2, 0, 1, 2]])
        names = [n for n, _ in model.named_parameters()]
        params = tuple(p.detach().clone().requires_grad_(True) for _, p in model.named_parameters())

        def f(*ps):
            from torch.nn.utils import stateless
            logits = stateless.functional_call(model, dict(zip(names, ps)), (ids,),
                                               {"position_ids": pos, "segment_ids": segs})
            return llama_ref.Llama.loss(logits, targets)

        ok = torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-6, rtol=1e-5)
        check(ok, f"{vname}: float64 gradcheck of the packed loss over all {len(names)} parameters")

    # Loss: mean over non-ignored targets, no shift.
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[1, -100, 4], [0, 2, -100]])
    manual = -torch.stack([torch.log_softmax(logits[b, t], -1)[targets[b, t]]
                           for b in range(2) for t in range(3) if targets[b, t] != -100]).mean()
    check(abs(llama_ref.Llama.loss(logits, targets).item() - manual.item()) < 1e-6,
          "loss is the mean over targets != -100, aligned (no shift)")

    # (d) llama3 inverse frequencies for Llama 3.1 (Dh 128, theta 500000, factor 8, low 1, high 4, 8192).
    base = llama_ref.default_inv_freq(500000.0, 128)
    l3 = llama_ref.llama3_inv_freq(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    wavelen = 2 * math.pi / base
    high = wavelen < 8192 / 4
    low = wavelen > 8192 / 1
    mid = ~high & ~low
    print("      llama3 inv_freq (i: default -> scaled, ratio):")
    for i in [0, 1, 16, 32, 40, 44, 46, 48, 63]:
        print(f"        {i:2d}: {base[i].item():.6e} -> {l3[i].item():.6e}  ratio {base[i].item() / l3[i].item():.4f}")
    ratio = base / l3
    check(torch.equal(l3[high], base[high]) and torch.allclose(ratio[low], torch.full_like(ratio[low], 8.0))
          and bool(((ratio[mid] > 1) & (ratio[mid] < 8)).all()) and bool((ratio[1:] >= ratio[:-1] - 1e-6).all()),
          f"llama3: {int(high.sum())} high-frequency unchanged, {int(low.sum())} low-frequency / 8, "
          f"{int(mid.sum())} smoothed in between, monotone")
    try:
        import ref_rope
        check(torch.equal(l3, ref_rope.llama3_inv_freq(500000.0, 128, 8.0, 1.0, 4.0, 8192)),
              "llama3 inv_freq equals ref_rope.py's")
    except ImportError:
        pass

    # Save / load round trip through safetensors_check (single file and sharded index).
    try:
        st = llama_ref._safetensors()
        has_io = hasattr(st, "save") and hasattr(st, "load")
    except ImportError:
        has_io = False
    if not has_io:
        print("skip  load_hf_dir round trip (safetensors_check.save / load not available)")
    else:
        cfg = variants["llama_tied_mha_bias"]
        model = llama_ref.Llama(cfg, seed=6)
        ids = torch.randint(0, cfg["vocab_size"], (1, 8))
        with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
            single, sharded = os.path.join(tmp, "single"), os.path.join(tmp, "sharded")
            for d in (single, sharded):
                os.makedirs(d)
                with open(os.path.join(d, "config.json"), "w") as f:
                    json.dump(cfg, f)
            state = {k: v.clone() for k, v in model.state_dict().items()}
            st.save(os.path.join(single, "model.safetensors"), state)
            keys = sorted(state)
            halves = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
                      "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
            for shard, ks in halves.items():
                st.save(os.path.join(sharded, shard), {k: state[k] for k in ks})
            with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {}, "weight_map": {k: s for s, ks in halves.items() for k in ks}}, f)
            for d in (single, sharded):
                loaded, _ = llama_ref.load_hf_dir(d)
                check(torch.equal(loaded(ids), model(ids)), f"load_hf_dir round trip ({os.path.basename(d)})")
            st.save(os.path.join(single, "model.safetensors"), dict(state, extra=torch.zeros(1)))
            try:
                llama_ref.load_hf_dir(single)
                check(False, "load_hf_dir rejects an unexpected key")
            except ValueError:
                check(True, "load_hf_dir rejects an unexpected key")

    if check.failed:
        print(f"selftest: {check.failed} check(s) failed")
        return 1
    print("selftest: all checks passed")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="write golden files for a model directory")
    mk.add_argument("model_dir")
    mk.add_argument("out_dir")
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--batch", type=int, default=2)
    mk.add_argument("--seq", type=int, default=16)
    mk.add_argument("--steps", type=int, default=3)
    mk.add_argument("--lr", type=float, default=1e-3)
    mk.add_argument("--weight-decay", type=float, default=0.1)
    mk.add_argument("--max-grad-norm", type=float, default=1.0)
    mk.add_argument("--packed", action="store_true")
    mk.add_argument("--threads", type=int, default=1, help="torch threads (default 1, for reproducibility)")
    ck = sub.add_parser("check-logits", help="compare logits shardlm wrote with the reference")
    ck.add_argument("model_dir")
    ck.add_argument("ids")
    ck.add_argument("logits")
    ck.add_argument("--positions")
    ck.add_argument("--segments")
    ck.add_argument("--atol", type=float, default=1e-4)
    ck.add_argument("--rtol", type=float, default=1e-4)
    sub.add_parser("selftest", help="check the reference itself on tiny random models")
    args = ap.parse_args()
    if args.cmd == "make":
        return cmd_make(args) or 0
    if args.cmd == "check-logits":
        return cmd_check_logits(args)
    return cmd_selftest(args)


if __name__ == "__main__":
    sys.exit(main())
