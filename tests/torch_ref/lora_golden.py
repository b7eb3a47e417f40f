#!/usr/bin/python3
"""Golden files for shardlm's LoRA training, from the PyTorch Llama (llama_ref.py) with PEFT's LoRA
(peft_reference.py) attached: the LoRA counterpart of llama_golden.py (tests/golden_lora.cpp reads them).

Usage:
  lora_golden.py make MODEL_DIR ADAPTER_DIR OUT_DIR [--seed S] [--batch B] [--seq T] [--steps K]
                 [--lr LR] [--weight-decay WD] [--max-grad-norm G] [--packed] [--threads N]
  lora_golden.py selftest

make: loads the base MODEL_DIR in float32, freezes every base parameter, and replaces each target
  Linear of the PEFT adapter in ADAPTER_DIR (e.g. written by `peft_tool make-adapter`, whose A and B
  are random and non-zero) by PEFT's unmerged lora.Linear: y = base(x) + lora_B(lora_A(x)) * scaling,
  scaling = lora_alpha / r (alpha / sqrt(r) with use_rslora); with use_dora, PEFT's DoRA layer
  (peft_reference.py: the magnitude m trains too, the weight norm is detached). lora_dropout must be
  0 (a dropout mask cannot be matched; with p = 0 PEFT's dropout is the identity). Only A and B (and
  m) train. Writes to OUT_DIR:
  batch{s}_ids.npy, batch{s}_targets.npy [, batch{s}_positions.npy, batch{s}_segments.npy]
                             as llama_golden.py make writes them (same generator, same batches);
  logits.npy [B, T, V]       batch 0 at the adapter's initial A and B;
  grads/<PEFT name>.npy      the gradient of batch 0's mean loss for every lora_A / lora_B, named as
                             in adapter_model.safetensors (base_model.model.model.layers.0.self_attn.
                             q_proj.lora_A.weight); the frozen base has none;
  final/<PEFT name>.npy      every A and B after K AdamW steps on batches 0..K-1;
  golden.json                loss0, step_losses, grad_norms (pre-clip L2 norm over the LoRA
                             parameters), final_loss (batch K at the final A and B), the optimizer
                             settings, the adapter (r, lora_alpha, use_rslora, scaling, targets,
                             lora_names in adapter order), base_dir, adapter_dir, base_loss0 (batch 0
                             without the adapter) and the self-checks' numbers.
  Each step: zero_grad, loss, backward, clip_grad_norm_(LoRA params, G) if G > 0, then
  torch.optim.AdamW(LoRA params only, betas (0.9, 0.95), eps 1e-8, foreach=False) with weight decay WD
  on every A and B (they are Linear weights; PEFT under HF Trainer decays them too).
  Before writing, make checks the reference on this very model and exits 1 if a check fails:
  the frozen base gets no gradient; every dA and dB is non-zero; with every B zeroed the logits equal
  the base model's bit for bit (DoRA: with m = ||W|| too, within 1e-5); the adapter moves the logits;
  and one dA element and one dB element (and one dm element) of the float64 model equal central
  finite differences of the float64 loss (DoRA: with the weight norm held constant, as autograd
  treats it).

selftest: the same checks on tiny in-memory models (three target sets, rsLoRA, packed batches),
  plus an unmerged-vs-merged gradient identity: dA = scaling * B^T dW and dB = scaling * dW A^T,
  where dW is the gradient of the merged weight W + scaling B A.

Independent of shardlm: the base and the adapter are read with safetensors_check.py.
"""
import argparse
import copy
import json
import os
import shutil
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import llama_golden  # noqa: E402
import llama_ref  # noqa: E402
import peft_reference  # noqa: E402

PREFIX = peft_reference.PREFIX  # "base_model.model."


# ---------------------------------------------------------------------------------------------
# The model with LoRA


def attach_lora(model, adapter_cfg, tensors):
    """Freezes `model`'s parameters, applies the adapter (peft_reference.apply_adapter, strict) and
    returns [(PEFT name, parameter)] of every lora_A / lora_B, in the model's (= the adapter file's)
    order: layer by layer, q k v o gate up down, A then B."""
    dropout = adapter_cfg.get("lora_dropout", 0.0) or 0.0
    if dropout != 0.0:
        raise ValueError(f"lora_dropout {dropout}: golden files need dropout 0 (a dropout mask cannot be matched)")
    for p in model.parameters():
        p.requires_grad_(False)
    peft_reference.apply_adapter(model, adapter_cfg, tensors)
    lora = trainable(model)
    names = [n for n, _ in lora]
    if not all(n.endswith(SUFFIXES) for n in names):
        raise ValueError(f"trainable parameters other than LoRA's: {names[:4]}")
    if set(names) != set(tensors):
        raise ValueError(f"LoRA parameters {sorted(set(names) ^ set(tensors))[:4]} differ from the adapter's tensors")
    return lora


SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".lora_magnitude_vector")


def trainable(model):
    """[(PEFT name, parameter)] of the trained parameters, in the adapter file's order: module by
    module, A, B, then DoRA's magnitude (named_parameters lists a module's own magnitude before its
    children's A and B)."""
    named = [(PREFIX + n, p) for n, p in model.named_parameters() if p.requires_grad]
    modules = []
    for n, _ in named:
        mod = next((n[: -len(sfx)] for sfx in SUFFIXES if n.endswith(sfx)), n)
        if mod not in modules:
            modules.append(mod)

    def key(item):
        n = item[0]
        sfx = next((i for i, x in enumerate(SUFFIXES) if n.endswith(x)), len(SUFFIXES))
        mod = n[: -len(SUFFIXES[sfx])] if sfx < len(SUFFIXES) else n
        return (modules.index(mod), sfx)

    return sorted(named, key=key)


def loss_of(model, batch):
    return llama_golden.run_loss(model, batch)


def save_batches(out, batches, packed):
    for s, (ids, targets, positions, segments) in enumerate(batches):
        np.save(os.path.join(out, f"batch{s}_ids.npy"), llama_golden.to_numpy(ids))
        np.save(os.path.join(out, f"batch{s}_targets.npy"), llama_golden.to_numpy(targets))
        if packed:
            np.save(os.path.join(out, f"batch{s}_positions.npy"), llama_golden.to_numpy(positions))
            np.save(os.path.join(out, f"batch{s}_segments.npy"), llama_golden.to_numpy(segments))


def lora_grads(model, lora, batch):
    """(logits, loss, {PEFT name: gradient}) of one batch; clears the gradients first."""
    for _, p in lora:
        p.grad = None
    logits, loss = loss_of(model, batch)
    loss.backward()
    return logits, loss, {n: p.grad.detach().clone() for n, p in lora}


def adamw_steps(model, lora, batches, steps, lr, weight_decay, max_grad_norm):
    """K AdamW steps over the LoRA parameters (llama_golden.py's loop): (losses, pre-clip norms)."""
    params = [p for _, p in lora]
    opt = torch.optim.AdamW([{"params": params, "weight_decay": weight_decay}], lr=lr,
                            betas=llama_golden.BETAS, eps=llama_golden.EPS, foreach=False)
    losses, norms = [], []
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        _, loss = loss_of(model, batches[s])
        loss.backward()
        if max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        else:
            norm = llama_golden.global_grad_norm(params)
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
    return losses, norms


# ---------------------------------------------------------------------------------------------
# Self-checks of the reference (run by make on the golden model and by selftest on tiny ones)


class Checks:
    def __init__(self):
        self.failed = 0
        self.numbers = {}

    def __call__(self, cond, what):
        print(("ok    " if cond else "FAIL  ") + what)
        if not cond:
            self.failed += 1


def check_reference(checks, base_model, adapter_cfg, tensors, batch, label):
    """base_model: the float32 model without the adapter (left unchanged)."""
    model = copy.deepcopy(base_model)
    lora = attach_lora(model, adapter_cfg, tensors)
    logits, loss, grads = lora_grads(model, lora, batch)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad and p.grad is not None]
    checks(not frozen, f"{label}: the frozen base gets no gradient ({len(lora)} LoRA tensors train)")
    zero = [n for n, g in grads.items() if not bool((g != 0).any())]
    checks(not zero, f"{label}: every dA and dB is non-zero" + (f" (zero: {zero[:3]})" if zero else ""))

    dora = bool(adapter_cfg.get("use_dora", False))
    with torch.no_grad():
        base_logits = base_model(batch[0], position_ids=batch[2], segment_ids=batch[3])
        zero_b = {k: (torch.zeros_like(v) if ".lora_B." in k else v) for k, v in tensors.items()}
        for k in tensors:  # DoRA starts at m = ||W|| (PEFT's init)
            if k.endswith(".lora_magnitude_vector"):
                w = base_model.get_submodule(k[len(PREFIX):-len(".lora_magnitude_vector")]).weight
                zero_b[k] = torch.linalg.norm(w, dim=1)
        m0 = copy.deepcopy(base_model)
        attach_lora(m0, adapter_cfg, zero_b)
        logits_b0 = m0(batch[0], position_ids=batch[2], segment_ids=batch[3])
    if dora:
        checks(torch.allclose(logits_b0, base_logits, atol=1e-5, rtol=0),
               f"{label}: with every B = 0 and m = ||W|| the logits equal the base's (within 1e-5)")
    else:
        checks(torch.equal(logits_b0, base_logits), f"{label}: with every B = 0 the logits equal the base's bit for bit")
    effect = (logits.detach() - base_logits).abs().max().item()
    checks(effect > 1e-3, f"{label}: the adapter moves the logits (by up to {effect:.3g})")
    checks.numbers[label + " adapter_effect"] = effect

    # Finite differences in float64 on the element of largest |gradient| of the first A and of the
    # last B (through the whole model: embedding, attention, MLP, head, loss).
    m64 = copy.deepcopy(model).double()
    lora64 = trainable(m64)
    _, _, g64 = lora_grads(m64, lora64, batch)
    # DoRA's weight norm is a constant to autograd (PEFT detaches it): the differences hold it at
    # its current value too.
    for mod in m64.modules():
        if isinstance(mod, peft_reference.LoraLinear) and mod.lora_magnitude_vector is not None:
            mod.frozen_norm = mod.weight_norm()
    worst_rel = max(((g64[n].float() - grads[n]).abs().max() / g64[n].abs().max()).item() for n in grads)
    checks(worst_rel < 1e-3, f"{label}: float32 gradients equal float64's (worst relative {worst_rel:.1e})")
    params64 = dict(lora64)
    fd_names = [lora64[0][0], lora64[-1][0]]
    if dora:  # A, B and m of the first module, and the last module's B
        fd_names = [lora64[0][0], lora64[1][0], lora64[2][0], lora64[-2][0]]
    for name in fd_names:
        p, g = params64[name], g64[name]
        idx = np.unravel_index(int(g.abs().argmax()), tuple(g.shape))
        h = 1e-6
        with torch.no_grad():
            old = p[idx].item()
            p[idx] = old + h
            lp = loss_of(m64, batch)[1].item()
            p[idx] = old - h
            lm = loss_of(m64, batch)[1].item()
            p[idx] = old
        fd = (lp - lm) / (2 * h)
        rel = abs(fd - g[idx].item()) / max(abs(fd), 1e-30)
        short = name[len(PREFIX):]
        checks(rel < 1e-6, f"{label}: float64 d{short}{list(idx)} = {g[idx].item():.10g}, central difference "
               f"{fd:.10g} (relative {rel:.1e})")
        checks.numbers[f"{label} fd_rel {short}"] = rel
    return logits, loss, grads


# ---------------------------------------------------------------------------------------------
# make


def cmd_make(args):
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.threads)
    base_model, _ = llama_ref.load_hf_dir(args.model_dir)
    for p in base_model.parameters():
        p.requires_grad_(False)
    adapter_cfg, tensors = peft_reference.read_adapter(args.adapter_dir)
    tensors = {k: v.float() for k, v in tensors.items()}
    vocab = base_model.config["vocab_size"]

    out = args.out_dir
    os.makedirs(out, exist_ok=True)
    for sub in ("grads", "final"):
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
        os.makedirs(os.path.join(out, sub))
    for f in os.listdir(out):
        if (f.startswith("batch") and f.endswith(".npy")) or f in ("logits.npy", "golden.json"):
            os.remove(os.path.join(out, f))

    # The batches of llama_golden.py make with the same arguments.
    gen = torch.Generator().manual_seed(args.seed)
    batches = [llama_golden.make_batch(gen, vocab, args.batch, args.seq, args.packed, row_offset=s)
               for s in range(args.steps + 1)]

    checks = Checks()
    logits, loss0, grads = check_reference(checks, base_model, adapter_cfg, tensors, batches[0], "golden model")
    if checks.failed:
        print(f"lora_golden: {checks.failed} self-check(s) failed; nothing written")
        return 1
    with torch.no_grad():
        base_loss0 = loss_of(base_model, batches[0])[1].item()

    save_batches(out, batches, args.packed)
    np.save(os.path.join(out, "logits.npy"), llama_golden.to_numpy(logits))
    for name, g in grads.items():
        np.save(os.path.join(out, "grads", name + ".npy"), llama_golden.to_numpy(g))

    model = copy.deepcopy(base_model)
    lora = attach_lora(model, adapter_cfg, tensors)
    step_losses, grad_norms = adamw_steps(model, lora, batches, args.steps, args.lr, args.weight_decay,
                                          args.max_grad_norm)
    for name, p in lora:
        np.save(os.path.join(out, "final", name + ".npy"), llama_golden.to_numpy(p))
    with torch.no_grad():
        final_loss = loss_of(model, batches[args.steps])[1].item()
    moved = max((p.detach() - tensors[n]).abs().max().item() for n, p in lora)

    golden = {
        "loss0": loss0.item(), "step_losses": step_losses, "grad_norms": grad_norms, "final_loss": final_loss,
        "lr": args.lr, "betas": list(llama_golden.BETAS), "eps": llama_golden.EPS,
        "weight_decay": args.weight_decay, "max_grad_norm": args.max_grad_norm, "steps": args.steps,
        "batch": args.batch, "seq": args.seq, "packed": bool(args.packed), "seed": args.seed,
        "base_dir": os.path.abspath(args.model_dir), "adapter_dir": os.path.abspath(args.adapter_dir),
        "r": adapter_cfg["r"], "lora_alpha": adapter_cfg["lora_alpha"],
        "use_rslora": bool(adapter_cfg.get("use_rslora", False)), "scaling": peft_reference.scaling_of(adapter_cfg),
        "use_dora": bool(adapter_cfg.get("use_dora", False)),
        "target_modules": adapter_cfg["target_modules"], "lora_names": [n for n, _ in lora],
        "base_loss0": base_loss0, "self_checks": checks.numbers,
    }
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
    print(f"wrote LoRA golden files to {out}: {len(lora)} LoRA tensors (scaling {golden['scaling']:g}), "
          f"loss0 {loss0.item():.6f} (base {base_loss0:.6f}), step losses "
          f"{' '.join(f'{x:.6f}' for x in step_losses)}, grad norms {' '.join(f'{x:.4g}' for x in grad_norms)}; "
          f"A and B moved by up to {moved:.3g}")
    return 0


# ---------------------------------------------------------------------------------------------
# selftest


def cmd_selftest(args):
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    checks = Checks()
    config = {"vocab_size": 41, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
              "initializer_range": 0.3, "tie_word_embeddings": False}
    cases = [("q_proj,v_proj r4 a8", ["q_proj", "v_proj"], 4, 8, False, False, False),
             ("all-linear r3 a5 rslora, qkv bias, packed", "all-linear", 3, 5, True, True, False),
             ("o/down/up r2 a2", ["o_proj", "down_proj", "up_proj"], 2, 2, False, False, False),
             ("DoRA q/o/down r3 a6, qkv bias, packed", ["q_proj", "o_proj", "down_proj"], 3, 6, False, True, True)]
    for label, targets, r, alpha, rslora, packed, dora in cases:
        cfg = dict(config, attention_bias=packed)
        base = llama_ref.Llama(cfg, seed=1)
        for p in base.parameters():
            p.requires_grad_(False)
        adapter_cfg = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": targets,
                       "use_rslora": rslora, "lora_dropout": 0.0, "use_dora": dora}
        gen = torch.Generator().manual_seed(2)
        tensors = {}
        for name, lin in peft_reference.targets_of(base, adapter_cfg):
            tensors[f"{PREFIX}{name}.lora_A.weight"] = 0.3 * torch.randn(r, lin.weight.shape[1], generator=gen)
            tensors[f"{PREFIX}{name}.lora_B.weight"] = 0.3 * torch.randn(lin.weight.shape[0], r, generator=gen)
            if dora:
                norms = torch.linalg.norm(lin.weight, dim=1)
                tensors[f"{PREFIX}{name}.lora_magnitude_vector"] = norms * (1 + 0.2 * torch.randn(norms.shape, generator=gen))
        bgen = torch.Generator().manual_seed(3)
        batch = llama_golden.make_batch(bgen, cfg["vocab_size"], 2, 12, packed)
        _, _, grads = check_reference(checks, base, adapter_cfg, tensors, batch, label)

        # Unmerged against merged: dW of the merged weight W + s B A gives dA = s B^T dW, dB = s dW A^T.
        # DoRA merges to W' = g V with V = W + s B A and g = m / ||V||_row held constant, so
        # dm = rowsum(dW' * V) / ||V||, dA = s B^T (g dW'), dB = s (g dW') A^T.
        s = peft_reference.scaling_of(adapter_cfg)
        merged = copy.deepcopy(base).double()
        pairs = []
        with torch.no_grad():
            for name, lin in peft_reference.targets_of(merged, adapter_cfg):
                a = tensors[f"{PREFIX}{name}.lora_A.weight"].double()
                b = tensors[f"{PREFIX}{name}.lora_B.weight"].double()
                lin.weight += s * b @ a
                v = lin.weight.clone()
                g = torch.ones(v.shape[0], dtype=torch.float64)
                if dora:
                    g = tensors[f"{PREFIX}{name}.lora_magnitude_vector"].double() / torch.linalg.norm(v, dim=1)
                    lin.weight *= g.view(-1, 1)
                lin.weight.requires_grad_(True)
                pairs.append((name, lin, a, b, v, g))
        loss_of(merged, batch)[1].backward()
        m64 = copy.deepcopy(base).double()
        lora64 = dict(attach_lora(m64, adapter_cfg, {k: v.double() for k, v in tensors.items()}))
        loss_of(m64, batch)[1].backward()
        worst = 0.0
        for name, lin, a, b, v, g in pairs:
            dw = lin.weight.grad * g.view(-1, 1)
            want_grads = [(lora64[f"{PREFIX}{name}.lora_A.weight"].grad, s * b.T @ dw),
                          (lora64[f"{PREFIX}{name}.lora_B.weight"].grad, s * dw @ a.T)]
            if dora:
                want_grads.append((lora64[f"{PREFIX}{name}.lora_magnitude_vector"].grad,
                                   (lin.weight.grad * v).sum(dim=1) / torch.linalg.norm(v, dim=1)))
            for got, want in want_grads:
                worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
        checks(worst < 1e-10, f"{label}: dA = s B^T dW and dB = s dW A^T{' (DoRA: g dW, and dm)' if dora else ''} "
               f"of the merged weight (relative {worst:.1e})")

        # AdamW steps only move A and B; with lr 0 nothing moves.
        model = copy.deepcopy(base)
        lora = attach_lora(model, adapter_cfg, tensors)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        adamw_steps(model, lora, [batch, batch], 2, 1e-2, 0.1, 1.0)
        trained = {n for n, _ in lora}
        moved = {PREFIX + n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
        checks(moved == trained, f"{label}: AdamW moves every A and B{' and m' if dora else ''} and nothing else")
    if checks.failed:
        print(f"lora_golden selftest: {checks.failed} check(s) failed")
        return 1
    print("lora_golden selftest: all checks passed")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="write LoRA golden files for a base model and an adapter")
    mk.add_argument("model_dir")
    mk.add_argument("adapter_dir")
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
    sub.add_parser("selftest", help="check the LoRA reference itself on tiny models")
    args = ap.parse_args()
    if args.cmd == "make":
        return cmd_make(args)
    return cmd_selftest(args)


if __name__ == "__main__":
    sys.exit(main())
