#!/usr/bin/python3
"""A PyTorch reference for Hugging Face PEFT's LoRA on a causal LM, written out (peft is not installed).

It follows PEFT's tuners/lora (LoraModel on a ...ForCausalLM, wrapped by PeftModelForCausalLM):

  targets     a module is adapted when its name (e.g. "model.layers.0.self_attn.q_proj") equals a
              target_modules entry or ends with "." + entry; a string target_modules is a regex
              that must fullmatch the name; "all-linear" means every nn.Linear but the output
              head (lm_head).
  names       the saved state dict (get_peft_model_state_dict, adapter name removed) holds
              "base_model.model." + module name + ".lora_A.weight" [r, in] and ".lora_B.weight"
              [out, r], nothing else for bias "none" without modules_to_save.
  forward     lora.Linear: result = base_layer(x) + lora_B(lora_A(dropout(x))) * scaling, with
              scaling = lora_alpha / r, or lora_alpha / sqrt(r) when use_rslora (dropout is the
              identity in eval mode). Nothing is merged: this is the unmerged adapter.
  DoRA        use_dora: true (PEFT's DoraLinearLayer / DoraLinearVariant): each target also has
              "...lora_magnitude_vector" [out] (saved without PEFT's ".default.weight"), m; with
              weight_norm = ||W + scaling * B A|| over each row (dim 1), detached (no gradient, the
              paper's section 4.3) and g = m / weight_norm:
                result = base_layer(x) + (g - 1) * (x W^T) + g * lora_B(lora_A(x)) * scaling
              (x W^T without the bias: the bias is not rescaled; with dropout in training PEFT
              uses dropout(x) in both terms; dropout is not modelled here). PEFT initializes m to
              the row norms of W (B = 0).
  merge       (for check-merged) base_layer.weight += (lora_B.weight @ lora_A.weight) * scaling,
              with DoRA then each row j scaled by m_j / ||row j|| (PEFT's merge_safe).

The base model is the independent PyTorch Llama of llama_ref.py, loaded in float32.

Usage:
  peft_reference.py logits BASE ADAPTER IDS.npy LOGITS.npy [--atol A] [--rtol R]
      the logits of BASE with ADAPTER applied as above, on IDS [B, T], against LOGITS (shardlm's);
      prints the max abs diff, exits 0 when allclose, else 1.
  peft_reference.py check-merged BASE ADAPTER MERGED
      every tensor of the merged directory MERGED against BASE + scaling * B A (float32), stored in
      MERGED's dtype: float32 within 1e-6 relative, bf16 / f16 within one unit in the last place;
      the tensors the adapter does not touch must equal BASE's (converted to that dtype) exactly.
  peft_reference.py make-dora-adapter BASE OUT --targets q_proj,down_proj --rank R --alpha A [--seed S]
      writes a DoRA adapter as PEFT's save_pretrained does (adapter_config.json with use_dora true,
      adapter_model.safetensors with A, B and lora_magnitude_vector under PEFT's names): A and B
      normal(0, 0.1), m = ||W|| row-wise times 1 + normal(0, 0.1); for reading by shardlm.
  peft_reference.py selftest
      the reference itself: a zero B leaves the logits alone; unmerged == merged in float64.
"""
import argparse
import json
import math
import os
import re
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import llama_ref  # noqa: E402
import safetensors_check  # noqa: E402

PREFIX = "base_model.model."


def read_adapter(adapter_dir):
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        cfg = json.load(f)
    if cfg.get("peft_type") != "LORA":
        raise ValueError(f"{adapter_dir}: peft_type {cfg.get('peft_type')!r} is not LORA")
    for key, default in (("bias", "none"), ("fan_in_fan_out", False)):
        if cfg.get(key, default) not in (default, None):
            raise ValueError(f"{adapter_dir}: {key} = {cfg[key]!r} is outside this reference")
    tensors = safetensors_check.load(os.path.join(adapter_dir, "adapter_model.safetensors"))
    return cfg, tensors


def scaling_of(cfg):
    r, alpha = cfg["r"], cfg["lora_alpha"]
    return alpha / math.sqrt(r) if cfg.get("use_rslora", False) else alpha / r


def is_target(name, module, target_modules):
    """PEFT's check_target_module_exists for a plain LoraConfig."""
    if not isinstance(module, llama_ref.Linear):
        return False
    if target_modules == "all-linear":
        return name != "lm_head"
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, name) is not None
    return any(name == t or name.endswith("." + t) for t in target_modules)


class LoraLinear(torch.nn.Module):
    """peft.tuners.lora.Linear in eval mode: base_layer(x) + lora_B(lora_A(x)) * scaling; with a
    magnitude m (DoRA) base_layer(x) + (g - 1) x W^T + g lora_B(lora_A(x)) scaling, g = m / ||W + s B A||."""

    def __init__(self, base_layer, a, b, scaling, m=None):
        super().__init__()
        self.base_layer = base_layer
        dtype = base_layer.weight.dtype
        self.lora_A = llama_ref.Linear(a.shape[1], a.shape[0], False).to(dtype)
        self.lora_B = llama_ref.Linear(b.shape[1], b.shape[0], False).to(dtype)
        with torch.no_grad():
            self.lora_A.weight.copy_(a.to(dtype))
            self.lora_B.weight.copy_(b.to(dtype))
        self.scaling = scaling
        self.lora_magnitude_vector = None if m is None else torch.nn.Parameter(m.to(dtype).clone())
        # Set by a finite-difference check: the weight norm held at these values, as autograd
        # treats it (a constant), instead of recomputed from the perturbed A and B.
        self.frozen_norm = None

    def weight_norm(self):
        if self.frozen_norm is not None:
            return self.frozen_norm
        w = self.base_layer.weight + self.scaling * (self.lora_B.weight @ self.lora_A.weight).detach()
        return torch.linalg.norm(w, dim=1).detach()

    def forward(self, x):
        result = self.base_layer(x)
        lora = self.lora_B(self.lora_A(x)) * self.scaling
        if self.lora_magnitude_vector is None:
            return result + lora
        g = (self.lora_magnitude_vector / self.weight_norm()).view(1, -1)
        base = torch.nn.functional.linear(x, self.base_layer.weight)
        return result + (g - 1) * base + g * lora


def targets_of(model, cfg):
    targets = cfg["target_modules"]
    if isinstance(targets, list) and "all-linear" in targets:
        targets = "all-linear"
    return [(name, m) for name, m in model.named_modules() if is_target(name, m, targets)]


def apply_adapter(model, cfg, tensors):
    """Replaces every target Linear of `model` by a LoraLinear (strict: every target needs its A and
    B in `tensors`, and every tensor must belong to a target)."""
    scaling = scaling_of(cfg)
    dora = bool(cfg.get("use_dora", False))
    used = set()
    for name, module in targets_of(model, cfg):
        ka, kb = f"{PREFIX}{name}.lora_A.weight", f"{PREFIX}{name}.lora_B.weight"
        km = f"{PREFIX}{name}.lora_magnitude_vector"
        if ka not in tensors or kb not in tensors or (dora and km not in tensors):
            raise ValueError(f"adapter lacks {ka}, {kb}" + (f" or {km}" if dora else ""))
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoraLinear(module, tensors[ka], tensors[kb], scaling, tensors[km] if dora else None))
        used.update((ka, kb, km) if dora else (ka, kb))
    unused = sorted(set(tensors) - used)
    if unused:
        raise ValueError(f"adapter tensors of no target module: {unused[:4]}")
    if not used:
        raise ValueError("the adapter targets no module")
    return model


def cmd_logits(args):
    model, _ = llama_ref.load_hf_dir(args.base)
    cfg, tensors = read_adapter(args.adapter)
    apply_adapter(model, cfg, tensors)
    ids = torch.from_numpy(np.load(args.ids).astype(np.int64))
    want = torch.from_numpy(np.load(args.logits)).float()
    with torch.no_grad():
        base_logits = llama_ref.load_hf_dir(args.base)[0](ids)
        got = model(ids)
    diff = (got - want).abs().max().item()
    effect = (got - base_logits).abs().max().item()
    ok = torch.allclose(want, got, atol=args.atol, rtol=args.rtol)
    print(f"PEFT reference (unmerged, scaling {scaling_of(cfg):g}) vs shardlm: max abs diff {diff:.3g} "
          f"(the adapter moves the logits by up to {effect:.3g}): {'OK' if ok else 'MISMATCH'}")
    if effect < 100 * args.atol:
        print("the adapter barely changes the logits: the comparison would prove nothing")
        return 1
    return 0 if ok else 1


def ulp(x):
    """One unit in the last place of each element of a bf16 / f16 tensor (as float32)."""
    info = torch.finfo(x.dtype)
    a = x.float().abs().clamp_min(info.tiny)
    return torch.pow(2.0, torch.floor(torch.log2(a)) - (info.bits - 1 - (8 if x.dtype == torch.bfloat16 else 5)))


def cmd_check_merged(args):
    base = llama_ref.read_hf_state(args.base)
    merged = llama_ref.read_hf_state(args.merged)
    cfg, tensors = read_adapter(args.adapter)
    scaling = scaling_of(cfg)
    if set(base) != set(merged):
        print(f"tensor names differ: {sorted(set(base) ^ set(merged))[:4]}")
        return 1
    adapted = {}
    for key in tensors:
        if key.endswith(".lora_A.weight"):
            adapted[key[len(PREFIX):-len(".lora_A.weight")] + ".weight"] = key
    bad = 0
    for name in sorted(base):
        m = merged[name]
        if name in adapted:
            ka = adapted[name]
            kb = ka.replace(".lora_A.", ".lora_B.")
            want = base[name].float() + (tensors[kb].float() @ tensors[ka].float()) * scaling
            km = ka.replace(".lora_A.weight", ".lora_magnitude_vector")
            if cfg.get("use_dora", False):
                want = want * (tensors[km].float() / torch.linalg.norm(want, dim=1)).view(-1, 1)
            if m.dtype == torch.float32:
                ok = torch.allclose(m, want, rtol=1e-6, atol=1e-6)
                err = (m - want).abs().max().item()
            else:
                err_t = (m.float() - want).abs() / ulp(want.to(m.dtype))
                err = err_t.max().item()
                ok = err <= 1.0
            if not ok:
                print(f"{name}: merged weight off by {err:.3g} ({m.dtype})")
                bad += 1
        else:
            if not torch.equal(m, base[name].to(m.dtype)):
                print(f"{name}: not adapted, but differs from the base")
                bad += 1
    print(f"check-merged: {len(adapted)} merged, {len(base) - len(adapted)} copied, "
          f"dtype {next(iter(merged.values())).dtype}: {'OK' if bad == 0 else f'{bad} wrong'}")
    return 0 if bad == 0 and len(adapted) > 0 else 1


def cmd_make_dora_adapter(args):
    model, _ = llama_ref.load_hf_dir(args.base)
    targets = args.targets.split(",")
    cfg = {"alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": args.base, "bias": "none",
           "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True, "layer_replication": None,
           "layers_pattern": None, "layers_to_transform": None, "loftq_config": {}, "lora_alpha": args.alpha,
           "lora_dropout": 0.0, "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
           "peft_type": "LORA", "r": args.rank, "rank_pattern": {}, "revision": None, "target_modules": targets,
           "task_type": "CAUSAL_LM", "use_dora": True, "use_rslora": False}
    gen = torch.Generator().manual_seed(args.seed)
    tensors = {}
    for name, lin in targets_of(model, cfg):
        w = lin.weight.detach().float()
        tensors[f"{PREFIX}{name}.lora_A.weight"] = 0.1 * torch.randn(args.rank, w.shape[1], generator=gen)
        tensors[f"{PREFIX}{name}.lora_B.weight"] = 0.1 * torch.randn(w.shape[0], args.rank, generator=gen)
        tensors[f"{PREFIX}{name}.lora_magnitude_vector"] = torch.linalg.norm(w, dim=1) * (
            1 + 0.1 * torch.randn(w.shape[0], generator=gen))
    os.makedirs(args.out, exist_ok=True)
    safetensors_check.save(os.path.join(args.out, "adapter_model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(args.out, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    print(f"wrote a DoRA adapter ({len(tensors)} tensors) to {args.out}")
    return 0


def cmd_selftest(args):
    torch.manual_seed(0)
    config = {"vocab_size": 50, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "initializer_range": 0.2}
    ids = torch.randint(0, 50, (2, 7))
    base = llama_ref.Llama(config, seed=1).double()
    for targets, dora in ((["q_proj", "v_proj"], False), ("all-linear", False), (["self_attn.o_proj", "down_proj"], False),
                          (["q_proj", "down_proj"], True), ("all-linear", True)):
        cfg = {"r": 3, "lora_alpha": 5, "target_modules": targets, "use_rslora": targets == "all-linear",
               "use_dora": dora}
        names = [n for n, _ in targets_of(llama_ref.Llama(config, init=False), cfg)]
        expect = {"all-linear": 14}.get(targets if isinstance(targets, str) else "", 4)
        assert len(names) == expect, (targets, names)
        assert "lm_head" not in names
        tensors = {}
        gen = torch.Generator().manual_seed(2)
        for n in names:
            lin = base.get_submodule(n)
            tensors[f"{PREFIX}{n}.lora_A.weight"] = torch.randn(3, lin.weight.shape[1], generator=gen, dtype=torch.float64) * 0.1
            tensors[f"{PREFIX}{n}.lora_B.weight"] = torch.randn(lin.weight.shape[0], 3, generator=gen, dtype=torch.float64) * 0.1
            if dora:
                norms = torch.linalg.norm(lin.weight.detach(), dim=1)
                tensors[f"{PREFIX}{n}.lora_magnitude_vector"] = norms * (1 + 0.1 * torch.randn(norms.shape, generator=gen, dtype=torch.float64))
        with torch.no_grad():
            # PEFT's start: B = 0 and (DoRA) m = ||W||; in float64 exactly the base model, or within rounding.
            zero = {k: (v * 0 if ".lora_B." in k else v) for k, v in tensors.items()}
            for n in names:
                if dora:
                    zero[f"{PREFIX}{n}.lora_magnitude_vector"] = torch.linalg.norm(base.get_submodule(n).weight, dim=1)
            plain = base(ids)
            m0 = apply_adapter(llama_ref.Llama(config, seed=1).double(), cfg, zero)
            if dora:
                assert torch.allclose(m0(ids), plain, atol=1e-12, rtol=1e-12), "PEFT's DoRA start must leave the model alone"
            else:
                assert torch.equal(m0(ids), plain), "a zero B must leave the model alone"
            unmerged = apply_adapter(llama_ref.Llama(config, seed=1).double(), cfg, tensors)(ids)
            merged_model = llama_ref.Llama(config, seed=1).double()
            for n in names:
                w = merged_model.get_submodule(n).weight
                w += (tensors[f"{PREFIX}{n}.lora_B.weight"] @ tensors[f"{PREFIX}{n}.lora_A.weight"]) * scaling_of(cfg)
                if dora:
                    w *= (tensors[f"{PREFIX}{n}.lora_magnitude_vector"] / torch.linalg.norm(w, dim=1)).view(-1, 1)
            merged = merged_model(ids)
            assert (unmerged - plain).abs().max() > 1e-3, "the adapter must change the logits"
            assert torch.allclose(unmerged, merged, atol=1e-10, rtol=1e-10), (unmerged - merged).abs().max()
    print("peft_reference selftest: OK")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    lg = sub.add_parser("logits", help="PEFT-style logits against shardlm's")
    lg.add_argument("base")
    lg.add_argument("adapter")
    lg.add_argument("ids")
    lg.add_argument("logits")
    lg.add_argument("--atol", type=float, default=2e-4)
    lg.add_argument("--rtol", type=float, default=2e-4)
    cm = sub.add_parser("check-merged", help="a merged directory against base + scaling * B A")
    cm.add_argument("base")
    cm.add_argument("adapter")
    cm.add_argument("merged")
    md = sub.add_parser("make-dora-adapter", help="write a PEFT DoRA adapter directory")
    md.add_argument("base")
    md.add_argument("out")
    md.add_argument("--targets", required=True)
    md.add_argument("--rank", type=int, required=True)
    md.add_argument("--alpha", type=float, required=True)
    md.add_argument("--seed", type=int, default=0)
    sub.add_parser("selftest", help="check the reference itself")
    args = ap.parse_args()
    torch.set_num_threads(2)
    return {"logits": cmd_logits, "check-merged": cmd_check_merged, "make-dora-adapter": cmd_make_dora_adapter,
            "selftest": cmd_selftest}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
