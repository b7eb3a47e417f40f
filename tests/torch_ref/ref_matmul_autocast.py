"""matmul as torch.autocast('cpu', dtype=torch.bfloat16) computes it: every f32 operand rounded to
bf16, bf16 products accumulated in f32 (PyTorch's CPU bf16 GEMM, oneDNN), a bf16 result. The
layouts of a Linear layer's forward (x W^T) and backward (dx = dy W, dW = dy^T x), with bf16 and f32
operands mixed as in a bf16 training step (the gradients are f32). "c" is autocast's bf16 result;
"c_exact" the f64 product of the same bf16-rounded operands, rounded to f32."""
import torch

OP = "matmul_autocast"


def cases():
    shapes = [(33, 17, 65), (64, 128, 96), (130, 7, 257), (8, 65, 1031), (256, 96, 688), (1, 300, 512)]
    for (m, n, k) in shapes:
        for ta, tb in [(False, True), (False, False), (True, False)]:
            for adt, bdt in [("bf16", "bf16"), ("f32", "bf16"), ("bf16", "f32")]:
                a = torch.randn(k, m) if ta else torch.randn(m, k)
                b = torch.randn(n, k) if tb else torch.randn(k, n)
                if adt == "bf16":
                    a = a.bfloat16()
                if bdt == "bf16":
                    b = b.bfloat16()
                opa = a.t() if ta else a
                opb = b.t() if tb else b
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    c = opa @ opb
                assert c.dtype == torch.bfloat16
                exact = opa.bfloat16().double() @ opb.bfloat16().double()
                yield (f"{m}x{n}x{k}_ta{int(ta)}_tb{int(tb)}_{adt}_{bdt}",
                       {"a": a, "b": b, "c": c, "c_exact": exact.float()},
                       {"m": m, "n": n, "k": k, "trans_a": ta, "trans_b": tb})
