"""adamw8bit: AdamW with bitsandbytes' blockwise 8-bit moments (optim: adamw_8bit), written here in
torch: each step dequantizes m (signed map) and v (unsigned map) block by block (map[code] *
absmax), computes torch.optim.AdamW's update in f32 one rounded operation at a time, and requantizes
each block with its new absmax (the nearest map value to x / absmax, a tie to the lower code).

The maps are bitsandbytes' create_dynamic_map definition evaluated in double and rounded to f32
once, as shardlm builds them (ref_quant8.py checks them against bitsandbytes' float32
construction: within 2 ulps)."""
import numpy as np
import torch

OP = "adamw8bit"
BLOCK = 256


def shardlm_map(signed):
    v = []
    for e in range(7):
        k = 2 ** e if signed else 2 ** (e + 1)
        scale = 10.0 ** (e - 6)
        for j in range(k):
            lo, hi = 0.1 + 0.9 * j / k, 0.1 + 0.9 * (j + 1) / k
            mid = scale * (lo + hi) / 2.0
            v.append(mid)
            if signed:
                v.append(-mid)
    v += [0.0, 1.0]
    return torch.from_numpy(np.array(sorted(v), dtype=np.float64).astype(np.float32))


def quantize(x, signed):
    qmap = shardlm_map(signed)
    blocks = x.numel() // BLOCK
    absmax = x.view(blocks, BLOCK).abs().max(dim=1).values
    safe = torch.where(absmax == 0, torch.ones_like(absmax), absmax)
    y = (x.view(blocks, BLOCK) / safe[:, None]).reshape(-1)
    pos = torch.searchsorted(qmap, y, right=False)
    hi = pos.clamp(1, 255)
    lo = hi - 1
    code = torch.where((y - qmap[lo]) <= (qmap[hi] - y), lo, hi)
    code = torch.where(pos == 0, torch.zeros_like(code), torch.where(pos == 256, torch.full_like(code, 255), code))
    zero = int(torch.searchsorted(qmap, torch.tensor(0.0)))
    code = torch.where(absmax.repeat_interleave(BLOCK) == 0, torch.full_like(code, zero), code)
    return code, absmax


def dequantize(code, absmax, signed):
    return shardlm_map(signed)[code] * absmax.repeat_interleave(BLOCK)


def step(p, g, mc, ma, vc, va, lr, beta1, beta2, eps, wd, t, scale):
    f = lambda v: torch.tensor(np.float32(v))
    decay, step_size = f(1.0 - lr * wd), f(lr / (1.0 - beta1 ** t))
    bias2_sqrt, w1, b2, w2 = f(np.sqrt(1.0 - beta2 ** t)), f(1.0 - beta1), f(beta2), f(1.0 - beta2)
    n = p.numel()
    m = dequantize(mc, ma, True)
    v = dequantize(vc, va, False)
    gi = g * f(scale)
    mn, vn = m[:n] + w1 * (gi - m[:n]), v[:n] * b2 + (w2 * gi) * gi
    p = p * decay
    p = p + (-step_size) * (mn / (torch.sqrt(vn) / bias2_sqrt + f(eps)))
    m[:n], v[:n] = mn, vn  # what follows the tensor to its last block's end stays zero
    mc, ma = quantize(m, True)
    vc, va = quantize(v, False)
    return p, mc, ma, vc, va


def cases():
    g = torch.Generator().manual_seed(9)
    for n, steps, lr, wd, scale in ((1000, 5, 1e-3, 0.0, 1.0), (2 * BLOCK, 4, 3e-3, 0.1, 0.37)):
        padded = (n + BLOCK - 1) // BLOCK * BLOCK
        p = torch.randn(n, generator=g)
        grads = torch.randn(steps, n, generator=g) * 0.1
        grads[:, :2] = torch.tensor([1e-7, 50.0])  # a tiny and a large gradient in one block
        zero_s, zero_u = int(torch.searchsorted(shardlm_map(True), torch.tensor(0.0))), 0
        mc = torch.full((padded,), zero_s, dtype=torch.long)
        vc = torch.full((padded,), zero_u, dtype=torch.long)
        ma = torch.zeros(padded // BLOCK)
        va = torch.zeros(padded // BLOCK)
        p0 = p.clone()
        for s in range(steps):
            p, mc, ma, vc, va = step(p, grads[s], mc, ma, vc, va, lr, 0.9, 0.999, 1e-8, wd, s + 1, scale)
        yield (f"n{n}_steps{steps}", {"p0": p0, "grads": grads, "p": p, "m_codes": mc, "m_absmax": ma,
                                      "v_codes": vc, "v_absmax": va},
               {"n": n, "lr": lr, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": wd, "steps": steps,
                "grad_scale": scale})
