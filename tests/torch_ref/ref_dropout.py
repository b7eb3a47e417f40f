"""dropout: torch's dropout arithmetic (x * noise, noise = bernoulli(1 - p).div_(1 - p)) on the mask
shardlm documents: element i kept iff rng_uniform(key, stream, i) >= p, from an independent numpy
Philox4x32-10 (checked here against Random123's known answers).

torch cannot draw shardlm's mask, so the mask is computed here and torch applies it exactly as its
own F.dropout does; that F.dropout is this arithmetic is asserted below, on torch's own masks."""
import numpy as np
import torch
import torch.nn.functional as F

OP = "dropout"

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c, k0, k1):
    """c: four uint64 arrays holding 32-bit words (the counter); k0, k1: Python ints (the key)."""
    c0, c1, c2, c3 = (np.asarray(w, dtype=np.uint64) for w in c)
    for _ in range(10):
        p0, p1 = M0 * c0, M1 * c2  # < 2^64: exact in uint64
        hi0, lo0 = p0 >> np.uint64(32), p0 & MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
        k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
    return c0, c1, c2, c3


def check_known_answers():
    kat = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
           ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
           ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
            (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for ctr, key, want in kat:
        got = philox4x32_10([np.array([w], dtype=np.uint64) for w in ctr], *key)
        assert tuple(int(g[0]) for g in got) == want, (ctr, key, got, want)


def rng_uniform(key, stream, n):
    """shardlm's rng_uniform(key, stream, i) for i in [0, n), as float32."""
    i = np.arange(n, dtype=np.uint64)
    ctr = [i & MASK32, i >> np.uint64(32), np.full(n, stream & 0xFFFFFFFF, dtype=np.uint64),
           np.full(n, stream >> 32, dtype=np.uint64)]
    r0 = philox4x32_10(ctr, key & 0xFFFFFFFF, key >> 32)[0]
    return (r0 >> np.uint64(8)).astype(np.float32) * np.float32(2.0 ** -24)  # exact


def torch_dropout_with_mask(x, keep, p):
    """torch's _dropout (CPU) with `keep` as the bernoulli draw: noise.div_(1 - p); x * noise."""
    noise = keep.to(x.dtype)
    noise.div_(1 - p)
    return x * noise


def check_torch_arithmetic():
    # F.dropout on the CPU is exactly torch_dropout_with_mask with its own mask (x nonzero, so the
    # mask can be read off the output), bit for bit.
    g = torch.Generator().manual_seed(11)
    for p in [0.1, 0.5, 0.9, float(np.float32(0.3))]:
        x = torch.randn(5000, generator=g)
        x[x == 0] = 1.0
        y = F.dropout(x, p, training=True)
        assert torch.equal(y.view(torch.int32), torch_dropout_with_mask(x, y != 0, p).view(torch.int32)), p


def cases():
    check_known_answers()
    check_torch_arithmetic()
    g = torch.Generator().manual_seed(3)
    specs = [(37, 129, 0.1, 7, 3, "f32"), (16, 300, 0.5, 0xFEDCBA9876543210, 1 << 40, "bf16"),
             (1, 1000, 0.9, 1, 0xFFFFFFFFFFFFFFFF, "f32"), (64, 64, 0.05, 0x5EED << 32 | 7, 12, "f32"),
             (8, 250, 0.25, 2, 5, "bf16")]
    for (n, d, p, key, stream, dtype) in specs:
        p32 = float(np.float32(p))  # shardlm's p is an f32; torch gets that value as a double
        x = torch.randn(n, d, generator=g)
        x[0, :5] = torch.tensor([0.0, -0.0, -1.5, 3.0, -2.0])  # signed zeros of dropped negatives
        if dtype == "bf16":
            x = x.bfloat16()
        keep = torch.from_numpy(rng_uniform(key, stream, n * d) >= np.float32(p32)).view(n, d)
        xf = x.float()
        out = torch_dropout_with_mask(xf, keep, p32)  # f32 arithmetic (also for a bf16 x)
        yield (f"n{n}_d{d}_p{p}_{dtype}", {"x": x, "keep": keep, "out": out, "out_bf16": out.bfloat16()},
               {"n": n, "d": d, "p": p32, "key": key, "stream": stream, "dtype": dtype})
