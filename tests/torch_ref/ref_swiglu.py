"""swiglu: out = silu(gate) * up, as in LlamaMLP; gradients by autograd."""
import torch
import torch.nn.functional as F

OP = "swiglu"


def cases():
    for (n, f, dtype) in [(1, 1, "f32"), (7, 13, "f32"), (64, 344, "f32"), (33, 100, "bf16")]:
        gate, up = torch.randn(n, f) * 3, torch.randn(n, f)
        gate[0, 0] = -30.0  # far tails of the sigmoid must not produce NaN
        if n > 1:
            gate[1, 0] = 30.0
        if dtype == "bf16":
            gate, up = gate.bfloat16(), up.bfloat16()
        g = gate.float().clone().requires_grad_(True)
        u = up.float().clone().requires_grad_(True)
        out = F.silu(g) * u
        dout = torch.randn(n, f)
        (out * dout).sum().backward()
        yield (f"n{n}_f{f}_{dtype}", {"gate": gate, "up": up, "out": out, "dout": dout, "dgate": g.grad,
                                       "dup": u.grad}, {"n": n, "f": f, "dtype": dtype})
