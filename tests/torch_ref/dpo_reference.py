#!/usr/bin/python3
"""An independent PyTorch reference for shardlm's DPO (tests/scripts/dpo_cli.sh runs it).

DPO as Rafailov et al. (2023) define it and TRL's DPOTrainer computes it, written from the formulas:
  logp(row)  = sum over the completion's targets of log softmax(logits)[target]
               (loss_type ipo: the mean over those targets, as TRL averages for IPO)
  z          = (pi_chosen - pi_rejected) - (ref_chosen - ref_rejected)
  sigmoid    -(1 - ls) log sigmoid(beta z) - ls log sigmoid(-beta z)
  ipo        (z - 1 / (2 beta))^2
  hinge      relu(1 - beta z)
  rewards    beta (pi - ref) per side; accuracy: chosen reward > rejected reward; the loss is the
             mean over pairs.
The data is TRL's standard format, {"prompt", "chosen", "rejected"} strings, tokenized as shardlm's
byte-level fallback tokenizer does (a model directory without tokenizer files, vocab 259):
BOS(1) + bytes(prompt) + 3, then bytes(completion) + 3 and EOS(2); rows padded with EOS, ignored.

Commands (each exits 1 when shardlm's figures differ from the reference's beyond the tolerance):
  full MODEL_DIR PAIRS RUN_DIR --loss L --beta B [--label-smoothing S] --lr LR --steps K
        A full fine-tune with the frozen copy as reference. Every step uses every pair (the run's
        global batch is the whole file), AdamW(betas 0.9/0.95, eps 1e-8, no weight decay) at a
        constant lr after clip_grad_norm_(1.0). Checks each step's loss, gradient norm and
        rewards/margins against RUN_DIR/metrics.jsonl, the final weights against
        RUN_DIR/model.safetensors, and the final eval record (eval: the same file) against the
        trained policy.
  lora MODEL_DIR PAIRS RUN_DIR --loss L --beta B
        A LoRA run: the reference is the base with the adapter off. Checks RUN_DIR's final eval
        record against base + RUN_DIR/adapter (PEFT's unmerged formula, peft_reference.py) vs base.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402
import peft_reference  # noqa: E402

BOS, EOS, FIRST_BYTE = 1, 2, 3


def tokenize_pairs(path):
    rows = []  # (ids, targets) per row: chosen, rejected of each pair in file order
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            prompt = [BOS] + [FIRST_BYTE + b for b in rec["prompt"].encode()]
            for side in ("chosen", "rejected"):
                completion = [FIRST_BYTE + b for b in rec[side].encode()] + [EOS]
                seq = prompt + completion
                ids = seq[:-1]
                targets = [-100] * (len(prompt) - 1) + completion
                rows.append((ids, targets))
    T = max(len(i) for i, _ in rows)
    ids = torch.full((len(rows), T), EOS, dtype=torch.int64)
    targets = torch.full((len(rows), T), -100, dtype=torch.int64)
    for r, (i, t) in enumerate(rows):
        ids[r, :len(i)] = torch.tensor(i)
        targets[r, :len(t)] = torch.tensor(t)
    return ids, targets


def row_logps(model, ids, targets, loss_type):
    logits = model(ids).double()
    mask = targets != -100
    logp = torch.gather(F.log_softmax(logits, -1), 2, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    s = (logp * mask).sum(-1)
    return s / mask.sum(-1) if loss_type == "ipo" else s


def dpo(pi, ref, loss_type, beta, ls):
    pc, pr, rc, rr = pi[0::2], pi[1::2], ref[0::2], ref[1::2]
    z = (pc - pr) - (rc - rr)
    if loss_type == "sigmoid":
        losses = -(1 - ls) * F.logsigmoid(beta * z) - ls * F.logsigmoid(-beta * z)
    elif loss_type == "ipo":
        losses = (z - 1 / (2 * beta)) ** 2
    else:
        losses = torch.relu(1 - beta * z)
    chosen, rejected = beta * (pc - rc).detach(), beta * (pr - rr).detach()
    # The size of the terms the loss is a difference of: hinge's 1 - beta z and IPO's z - 1/(2 beta)
    # cancel as the policy learns, so their rounding error follows these terms, not the loss.
    bz = (beta * z).detach().abs()
    scale = {"hinge": (1 + bz).mean().item(), "ipo": ((z.detach().abs() + 1 / (2 * beta)) ** 2).mean().item()}
    return losses.mean(), {"rewards/chosen": chosen.mean().item(), "rewards/rejected": rejected.mean().item(),
                           "rewards/margins": (chosen - rejected).mean().item(),
                           "rewards/accuracies": (chosen > rejected).double().mean().item(),
                           "loss_scale": scale.get(loss_type, abs(losses.mean().item()))}


def records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


class Checks:
    def __init__(self):
        self.bad = 0

    def close(self, what, got, want, rtol, atol=1e-7):
        ok = got is not None and abs(got - want) <= atol + rtol * abs(want)
        print(f"{'ok  ' if ok else 'FAIL'} {what}: shardlm {got} reference {want}")
        self.bad += not ok


def eval_checks(checks, rec, pi, ref, args):
    loss, m = dpo(pi, ref, args.loss, args.beta, args.label_smoothing)
    checks.close("final eval_loss", rec.get("eval_loss"), loss.item(), 1e-4, 1e-4 * m["loss_scale"])
    for k in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        checks.close(f"final eval_{k}", rec.get("eval_" + k), m[k], 1e-4, 1e-6)


def cmd_full(args):
    torch.manual_seed(0)
    policy, _ = llama_ref.load_hf_dir(args.model_dir)
    reference, _ = llama_ref.load_hf_dir(args.model_dir)
    for p in reference.parameters():
        p.requires_grad_(False)
    ids, targets = tokenize_pairs(args.pairs)
    with torch.no_grad():
        ref = row_logps(reference, ids, targets, args.loss)
    params = [p for p in policy.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, foreach=False)
    steps = [r for r in records(args.run_dir) if "loss" in r and "grad_norm" in r]
    checks = Checks()
    for k in range(args.steps):
        opt.zero_grad()
        loss, m = dpo(row_logps(policy, ids, targets, args.loss), ref, args.loss, args.beta, args.label_smoothing)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        checks.close(f"step {k + 1} loss", steps[k]["loss"], loss.item(), 1e-5, 1e-5 * m["loss_scale"])
        checks.close(f"step {k + 1} grad_norm", steps[k]["grad_norm"], norm.item(), 1e-4)
        checks.close(f"step {k + 1} rewards/margins", steps[k]["rewards/margins"], m["rewards/margins"], 1e-4, 1e-6)
        opt.step()
    # Element by element, as tests/golden_llama.cpp compares final weights: atol 2e-4 + rtol 1e-3
    # (AdamW's first steps move an element whose gradient is rounding noise by up to lr either way).
    trained = llama_ref.read_hf_state(args.run_dir)
    initial = llama_ref.read_hf_state(args.model_dir)
    worst, where, moved = 0.0, "", 0.0
    for name, p in policy.state_dict().items():
        excess = ((trained[name].double() - p.double()).abs() - 1e-3 * p.double().abs()).max().item()
        moved = max(moved, (p.double() - initial[name].double()).abs().max().item())
        if excess > worst:
            worst, where = excess, name
    ok = worst <= 2e-4 and moved > 1e-3
    print(f"{'ok  ' if ok else 'FAIL'} final weights: largest difference beyond rtol 1e-3: {worst:.3g} ({where}; "
          f"atol 2e-4); the largest update {moved:.3g}")
    checks.bad += not ok
    with torch.no_grad():
        eval_checks(checks, [r for r in records(args.run_dir) if "eval_loss" in r][-1],
                    row_logps(policy, ids, targets, args.loss), ref, args)
    return checks.bad


def cmd_lora(args):
    base, _ = llama_ref.load_hf_dir(args.model_dir)
    ids, targets = tokenize_pairs(args.pairs)
    with torch.no_grad():
        ref = row_logps(base, ids, targets, args.loss)
        cfg, tensors = peft_reference.read_adapter(os.path.join(args.run_dir, "adapter"))
        peft_reference.apply_adapter(base, cfg, tensors)
        pi = row_logps(base, ids, targets, args.loss)
    checks = Checks()
    eval_checks(checks, [r for r in records(args.run_dir) if "eval_loss" in r][-1], pi, ref, args)
    if abs((pi - ref).abs().max().item()) < 1e-6:
        print("FAIL: the trained adapter does not change the log-probabilities")
        checks.bad += 1
    return checks.bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("full", "lora"):
        p = sub.add_parser(name)
        p.add_argument("model_dir")
        p.add_argument("pairs")
        p.add_argument("run_dir")
        p.add_argument("--loss", default="sigmoid", choices=("sigmoid", "ipo", "hinge"))
        p.add_argument("--beta", type=float, default=0.1)
        p.add_argument("--label-smoothing", type=float, default=0.0)
        p.add_argument("--lr", type=float, default=1e-3)
        p.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    bad = cmd_full(args) if args.cmd == "full" else cmd_lora(args)
    print("dpo_reference: OK" if bad == 0 else f"dpo_reference: {bad} check(s) failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
