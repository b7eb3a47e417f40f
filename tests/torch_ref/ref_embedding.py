"""embedding: forward gather and backward scatter-add (repeated ids accumulate)."""
import torch

OP = "embedding"


def cases():
    for (n, v, d, dtype) in [(1, 5, 3, "f32"), (9, 11, 7, "f32"), (64, 1000, 65, "f32"), (40, 13, 130, "bf16")]:
        weight = torch.randn(v, d)
        if dtype == "bf16":
            weight = weight.bfloat16()
        ids = torch.randint(0, v, (n,))
        ids[: n // 2] = ids[0]  # repeated ids must accumulate in the backward
        w = weight.float().clone().requires_grad_(True)
        out = torch.nn.functional.embedding(ids, w)
        dout = torch.randn(n, d)
        (out * dout).sum().backward()
        yield (f"n{n}_v{v}_d{d}_{dtype}", {"weight": weight, "ids": ids, "out": out, "dout": dout,
                                            "dweight": w.grad}, {"n": n, "v": v, "d": d, "dtype": dtype})
