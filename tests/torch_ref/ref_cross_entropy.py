"""Reference cases for ops::linear_cross_entropy (output projection fused with cross-entropy).

logits = x @ w.T; loss_sum = F.cross_entropy(logits, targets, ignore_index=-100, reduction='sum');
dx, dw = autograd of loss_sum * grad_scale with grad_scale = 1 / count (the mean over non-ignored
rows; 1 when every row is ignored). The reference is computed in float64 from the very inputs the
op receives (f32, or bf16-rounded values for the bf16 case), so it is the exact answer up to f32
storage and the op's own f32 rounding is what the parity test measures.

Arrays: x [N, D] and w [V, D] (f32, or bf16 bit patterns), targets [N] i32, dx [N, D], dw [V, D].
Params: N, D, V, chunk_rows, grad_scale, loss_sum, count, bf16.
"""
import torch
import torch.nn.functional as F

OP = "cross_entropy"
IGNORE = -100


def make_case(N, D, V, chunk_rows, ignore=(), x_std=1.0, w_std=None, bf16=False):
    """Random x, w and targets; rows listed in `ignore` (or every row, for ignore='all') get -100."""
    w_std = D ** -0.5 if w_std is None else w_std
    x = torch.randn(N, D) * x_std
    w = torch.randn(V, D) * w_std
    if bf16:
        x, w = x.bfloat16(), w.bfloat16()
    targets = torch.randint(0, V, (N,))
    if ignore == "all":
        targets[:] = IGNORE
    else:
        for i in ignore:
            targets[i] = IGNORE
    count = int((targets != IGNORE).sum())
    grad_scale = 1.0 / count if count else 1.0

    xd = x.double().requires_grad_()
    wd = w.double().requires_grad_()
    logits = xd @ wd.T
    loss_sum = F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum")
    (loss_sum * grad_scale).backward()

    arrays = {"x": x, "w": w, "targets": targets.int(), "dx": xd.grad, "dw": wd.grad}
    params = {"N": N, "D": D, "V": V, "chunk_rows": chunk_rows, "grad_scale": grad_scale,
              "loss_sum": float(loss_sum), "count": count, "bf16": bf16}
    return arrays, params


def cases():
    # A single row, a single chunk.
    yield ("n1_d8_v17", *make_case(N=1, D=8, V=17, chunk_rows=64))
    # Odd sizes, chunks of 3 with a partial last chunk, one ignored row.
    yield ("n7_d33_v17_chunk3", *make_case(N=7, D=33, V=17, chunk_rows=3, ignore=[2]))
    # Five chunks of 64 (the last one partial: 44 rows); chunk 1 (rows 64..127) is entirely
    # ignored, so its backward matmuls are skipped, plus scattered ignored rows elsewhere.
    yield ("n300_d64_v1000_chunk64",
           *make_case(N=300, D=64, V=1000, chunk_rows=64, ignore=[*range(64, 128), 0, 5, 200, 299]))
    # A Llama-2-sized vocabulary with few rows and a narrow hidden size (keeps the files small).
    yield ("n5_d8_v32000_chunk2", *make_case(N=5, D=8, V=32000, chunk_rows=2, ignore=[3]))
    # Logits around +-100: exp() overflows f32 unless the row max is subtracted first.
    yield ("large_logits_n16_d16_v50", *make_case(N=16, D=16, V=50, chunk_rows=5, x_std=4.0, w_std=4.0))
    # Nothing to learn from: loss 0, count 0, zero gradients.
    yield ("all_ignored_n4_d8_v17", *make_case(N=4, D=8, V=17, chunk_rows=3, ignore="all"))
    # bf16 x and w (stored as bf16, so the op sees exactly the values the reference used).
    yield ("bf16_n40_d32_v300_chunk16", *make_case(N=40, D=32, V=300, chunk_rows=16, ignore=[7, 8], bf16=True))
