"""adamw8bit: AdamW with bitsandbytes' blockwise 8-bit moments (optim: adamw_8bit), written here in
torch: each step dequantizes m (signed map) and v (unsigned map) block by block (map[code] *
absmax), computes torch.optim.AdamW's update in f32 one rounded operation at a time, and requantizes
each block with its new absmax (ref_quant8.py's quantization: bitsandbytes' maps and code search)."""
import numpy as np
import torch

import ref_quant8 as q8

OP = "adamw8bit"
BLOCK = q8.BLOCK


def quantize(x, signed):
    code, absmax = q8.quantize(x, signed)
    return code.long(), absmax


def dequantize(code, absmax, signed):
    return q8.dequantize(code, absmax, signed)


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
        zero_s, zero_u = int(torch.searchsorted(q8.dynamic_map(True), torch.tensor(0.0))), 0
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
