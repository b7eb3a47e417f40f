"""quant8: 8-bit blockwise quantization of optimizer state as bitsandbytes defines it: its dynamic
maps (create_dynamic_map(signed, max_exponent_bits=7, total_bits=8), built as bitsandbytes builds
them, in float32 torch linspace and products), blocks of 256 with an f32 absmax each, every
element's code bitsandbytes' dQuantize<0> search (nf4_reference.dynamic_quantize: a binary search
from 127, then the f32 midpoint to the neighbour) over x * (1 / absmax) in f32, as its kernels
scale; a block of zeros: absmax 0 and the code of 0. Dequantization: map[code] * absmax."""
import numpy as np
import torch

import nf4_reference as nf4

OP = "quant8"
BLOCK = 256


def dynamic_map(signed):
    return torch.from_numpy(nf4.dynamic_map(signed))


def quantize(x, signed):
    """x: f32 [n] (any n). Returns (codes u8 [n], absmax f32 [ceil(n / 256)])."""
    qmap = nf4.dynamic_map(signed)
    xn = x.numpy().astype(np.float32)
    n = xn.size
    blocks = (n + BLOCK - 1) // BLOCK
    padded = np.zeros(blocks * BLOCK, dtype=np.float32)
    padded[:n] = xn
    absmax = np.abs(padded.reshape(blocks, BLOCK)).max(axis=1).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = (np.float32(1.0) / absmax).astype(np.float32)
        y = (padded.reshape(blocks, BLOCK) * inv[:, None]).astype(np.float32).reshape(-1)[:n]
    code = nf4.dynamic_quantize(y, qmap).astype(np.int64)
    zero = int(np.searchsorted(qmap, np.float32(0.0)))
    code = np.where(absmax[np.arange(n) // BLOCK] == 0, zero, code)
    return torch.from_numpy(code.astype(np.uint8)), torch.from_numpy(absmax)


def dequantize(code, absmax, signed):
    qmap = dynamic_map(signed)
    return qmap[code.long()] * absmax[torch.arange(code.numel()) // BLOCK]


def cases():
    g = torch.Generator().manual_seed(8)
    for signed in (True, False):
        qmap = dynamic_map(signed)
        assert qmap[0] >= -1 and qmap[-1] == 1 and torch.all(qmap[1:] > qmap[:-1])
        for n in (1000, 4 * BLOCK):
            x = torch.randn(n, generator=g) * 1e-3
            if not signed:
                x = x * x  # exp_avg_sq: non-negative, spread over orders of magnitude
            x[BLOCK:2 * BLOCK] = 0.0  # a block of zeros
            x[2 * BLOCK:2 * BLOCK + 256] = qmap[torch.arange(256)] * 0.5  # every map value exactly
            code, absmax = quantize(x, signed)
            yield (f"{'signed' if signed else 'unsigned'}_n{n}", {
                "x": x, "codes": code, "absmax": absmax, "dequantized": dequantize(code, absmax, signed),
                "map": qmap}, {"n": n, "signed": signed})
