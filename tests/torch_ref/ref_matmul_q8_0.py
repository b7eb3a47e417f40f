"""matmul_q8_0: C = alpha * A @ dequant(Wq)^T + beta * C0, with Wq the weight W [N, K] quantized to ggml's
Q8_0, written here from the format's definition (ggml's docs and quantize_row_q8_0_ref), independently
of shardlm: per block of 32 consecutive elements of a row, d = max|w| / 127 computed in f32 and stored
as f16, q = round(w * (1 / d)) (1 / d in f32, the product in f32, rounded half away from zero; all 0
when d = 0), the block stored as d's 2 bytes (little-endian) and the 32 int8. `wq` is those bytes
(the C++ side checks shardlm's quantizer gives the same), `c` the product in float64 on the
dequantized weight f16(d) * q, `cabs` |A| @ |dequant(Wq)|^T (for the bf16 path's tolerance)."""
import numpy as np
import torch

OP = "matmul_q8_0"


def quantize(w):
    n, k = w.shape
    blocks = w.reshape(n, k // 32, 32).astype(np.float32)
    d = (np.abs(blocks).max(axis=2) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (blocks * inv[:, :, None]).astype(np.float32).astype(np.float64)
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)
    dh = d.astype(np.float16)
    out = np.zeros((n, k // 32, 34), dtype=np.uint8)
    out[:, :, 0:2] = dh.view(np.uint8).reshape(n, k // 32, 2)
    out[:, :, 2:] = q.view(np.uint8)
    deq = dh.astype(np.float64)[:, :, None] * q.astype(np.float64)
    return out.reshape(n, k // 32 * 34), deq.reshape(n, k)


def cases():
    # M <= 8: a decode step (the weight read in place); 9, 33 and 12: a prefill (dequantized 256 rows at
    # a time: 600 rows are 3 blocks, the last partial, into a C that keeps beta * C0).
    shapes = [(1, 37, 64), (3, 20, 96), (8, 65, 1024), (9, 33, 128), (33, 17, 256), (12, 600, 64)]
    for i, (m, n, k) in enumerate(shapes):
        a = torch.randn(m, k)
        w = torch.randn(n, k) * 0.05
        if i == 1:
            w[3, 32:64] = 0  # a block of zeros: d = 0
            w[5, 7] = 9.0    # an outlier: its block's scale
        wq, deq = quantize(w.numpy())
        c0 = torch.randn(m, n)
        alpha, beta = (1.0, 0.0) if i % 2 == 0 else (0.5, 1.5)
        c = alpha * (a.double().numpy() @ deq.T) + beta * c0.double().numpy()
        cabs = np.abs(a.double().numpy()) @ np.abs(deq).T
        yield (f"{m}x{n}x{k}", {"a": a, "w": w, "wq": torch.from_numpy(wq.astype(np.int32)), "c0": c0,
                                "c": torch.from_numpy(c).float(), "cabs": torch.from_numpy(cabs).float()},
               {"m": m, "n": n, "k": k, "alpha": alpha, "beta": beta})
