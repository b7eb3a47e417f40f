"""adamw: several steps of torch.optim.AdamW on one flat parameter, with weight decay and a
gradient scale (as clipping applies it)."""
import torch

OP = "adamw"


def cases():
    configs = [
        dict(n=1, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, wd=0.0, steps=3, scale=1.0),
        dict(n=1000, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, wd=0.1, steps=5, scale=1.0),
        dict(n=4097, lr=1e-2, betas=(0.8, 0.99), eps=1e-6, wd=0.01, steps=4, scale=0.37),
    ]
    for c in configs:
        p0 = torch.randn(c["n"])
        grads = torch.randn(c["steps"], c["n"]) * 0.1
        p = p0.clone().requires_grad_(True)
        opt = torch.optim.AdamW([p], lr=c["lr"], betas=c["betas"], eps=c["eps"], weight_decay=c["wd"],
                                foreach=False)
        for s in range(c["steps"]):
            p.grad = grads[s] * c["scale"]
            opt.step()
        state = opt.state[p]
        yield (f"n{c['n']}_steps{c['steps']}_wd{c['wd']}", {
            "p0": p0, "grads": grads, "p": p.detach(), "m": state["exp_avg"], "v": state["exp_avg_sq"]}, {
            "n": c["n"], "lr": c["lr"], "beta1": c["betas"][0], "beta2": c["betas"][1], "eps": c["eps"],
            "weight_decay": c["wd"], "steps": c["steps"], "grad_scale": c["scale"]})
