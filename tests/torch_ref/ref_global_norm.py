"""global_norm: torch.nn.utils.clip_grad_norm_ over several gradient tensors: the total L2 norm
and the clipped gradients."""
import torch

OP = "global_norm"


def cases():
    for (sizes, max_norm, dtype) in [([5], 1.0, "f32"), ([1000, 37, 4096], 1.0, "f32"),
                                     ([300, 301], 100.0, "f32"), ([513, 64], 0.5, "bf16")]:
        grads = [torch.randn(n) * 0.3 for n in sizes]
        if dtype == "bf16":
            grads = [g.bfloat16().float() for g in grads]
        params = [torch.zeros(n, requires_grad=True) for n in sizes]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        total = torch.nn.utils.clip_grad_norm_(params, max_norm)
        flat = torch.cat(grads)
        arrays = {"grads": flat.bfloat16() if dtype == "bf16" else flat,
                  "clipped": torch.cat([p.grad for p in params])}
        yield (f"{len(sizes)}x_{sum(sizes)}_max{max_norm}_{dtype}", arrays,
               {"sizes": sizes, "max_norm": max_norm, "total_norm": float(total), "dtype": dtype})
