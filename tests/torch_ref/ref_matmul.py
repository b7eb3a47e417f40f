"""matmul: C = alpha * op(A) @ op(B) + beta * C0, f32 and bf16 operands, with transposes; and a decode
step's mix, f32 A times a transposed bf16 B (a bf16 weight), for M <= 8 (the skinny kernel's shapes,
exact in f32 on either CPU path)."""
import torch

OP = "matmul"


def cases():
    # M <= 8 with a transposed B is the decode path (ops/cpu/matmul.cpp skinny_bt); 9 is just past it.
    shapes = [(1, 1, 1), (7, 5, 3), (33, 17, 65), (64, 128, 96), (130, 7, 257), (1, 300, 2048), (8, 65, 1031),
              (9, 33, 70)]
    i = 0
    for (m, n, k) in shapes:
        for ta, tb in [(False, False), (False, True), (True, False), (True, True)]:
            for dtype in ("f32", "bf16", "f32_bf16"):
                if dtype == "bf16" and (ta or not tb) and (m, n, k) != (33, 17, 65):
                    continue  # bf16 on every shape for the Linear layout, all layouts on one shape
                if dtype == "f32_bf16" and (ta or not tb or m > 8):
                    continue  # the decode step's layout and sizes only
                a = torch.randn(k, m) if ta else torch.randn(m, k)
                b = torch.randn(n, k) if tb else torch.randn(k, n)
                if dtype == "bf16":
                    a, b = a.bfloat16(), b.bfloat16()
                if dtype == "f32_bf16":
                    b = b.bfloat16()
                c0 = torch.randn(m, n)
                alpha, beta = (1.0, 0.0) if i % 2 == 0 else (0.5, 1.5)
                opa = a.float().t() if ta else a.float()
                opb = b.float().t() if tb else b.float()
                c = alpha * (opa.double() @ opb.double()) + beta * c0.double()
                yield (f"{m}x{n}x{k}_ta{int(ta)}_tb{int(tb)}_{dtype}",
                       {"a": a, "b": b, "c0": c0, "c": c.float()},
                       {"m": m, "n": n, "k": k, "trans_a": ta, "trans_b": tb, "alpha": alpha, "beta": beta,
                        "dtype": dtype})
                i += 1
