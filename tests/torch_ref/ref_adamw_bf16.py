"""adamw_bf16: AdamW with its moments kept in bf16 (optimizer_state_dtype: bf16), written here in
torch: each step reads m and v to f32, computes torch.optim.AdamW's update in f32 one rounded
operation at a time (the order ops/cpu/optim.cpp documents), and stores m and v back to bf16 with
stochastic rounding: the low 16 bits of the f32 value plus 16 random bits, then truncated. The
random bits of tensor element j at step t are word j % 4 of Philox4x32-10 at counter
(j / 4, stream), key t (ref_dropout's independent numpy Philox, checked there against Random123's
known answers): its low half rounds m, its high half v.

Checked here before any case: stochastic rounding is unbiased (the mean of many roundings of one
value is that value) and round to nearest would freeze v (v * beta2 rounds back to v)."""
import numpy as np
import torch

from ref_dropout import MASK32, check_known_answers, philox4x32_10

OP = "adamw_bf16"


def random_words(step, stream, first, n):
    """The 32 random bits of tensor elements first .. first + n - 1 (uint64 array of 32-bit words)."""
    j = np.arange(first, first + n, dtype=np.uint64)
    q = j // np.uint64(4)
    ctr = [q & MASK32, q >> np.uint64(32), np.full(n, stream & 0xFFFFFFFF, dtype=np.uint64),
           np.full(n, stream >> 32, dtype=np.uint64)]
    words = np.stack(philox4x32_10(ctr, step & 0xFFFFFFFF, step >> 32))  # [4, n]
    return words[(j % np.uint64(4)).astype(np.int64), np.arange(n)]


def to_bf16_stochastic(x, r16):
    """x: f32 tensor; r16: uint64 array of 16-bit values. The bf16 bit patterns as an int32 tensor."""
    u = x.view(torch.int32).numpy().view(np.uint32).astype(np.uint64)
    special = (u & np.uint64(0x7F800000)) == np.uint64(0x7F800000)
    out = ((u + (r16 & np.uint64(0xFFFF))) >> np.uint64(16)) & np.uint64(0xFFFF)
    rne = x.bfloat16().view(torch.int16).numpy().view(np.uint16).astype(np.uint64)
    return torch.from_numpy(np.where(special, rne, out).astype(np.int32))


def bf16_bits_to_f32(bits):
    return torch.from_numpy((bits.numpy().astype(np.uint32) << np.uint32(16)).view(np.float32).copy())


def adamw_bf16_step(p, g, m_bits, v_bits, lr, beta1, beta2, eps, wd, step, scale, stream, first):
    f = lambda v: torch.tensor(np.float32(v))  # a scalar rounded to f32 once, as the C++ does
    decay, step_size = f(1.0 - lr * wd), f(lr / (1.0 - beta1 ** step))
    bias2_sqrt, w1, b2, w2 = f(np.sqrt(1.0 - beta2 ** step)), f(1.0 - beta1), f(beta2), f(1.0 - beta2)
    gi = g * f(scale)
    p = p * decay
    m = bf16_bits_to_f32(m_bits)
    v = bf16_bits_to_f32(v_bits)
    m = m + w1 * (gi - m)
    v = v * b2 + (w2 * gi) * gi
    denom = torch.sqrt(v) / bias2_sqrt + f(eps)
    p = p + (-step_size) * (m / denom)
    words = random_words(step, stream, first, p.numel())
    return p, to_bf16_stochastic(m, words), to_bf16_stochastic(v, words >> np.uint64(16))


def check_rounding():
    x = torch.full((200000,), 1.0 + 3.0 / 1024, dtype=torch.float32)  # between bf16 1.0 and 1.0078125
    bits = to_bf16_stochastic(x, random_words(7, 99, 0, x.numel()))
    mean = bf16_bits_to_f32(bits).double().mean().item()
    assert abs(mean - x[0].item()) < 2e-5, mean
    v = torch.tensor([1e-4], dtype=torch.float32).bfloat16()
    assert torch.equal((v.float() * 0.999).bfloat16(), v)  # round to nearest: v never decays


def cases():
    check_known_answers()
    check_rounding()
    g = torch.Generator().manual_seed(5)
    configs = [
        dict(n=1000, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, wd=0.0, steps=6, scale=1.0, stream=0x0123456789ABCDEF,
             first=0),
        dict(n=4097, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, wd=0.1, steps=4, scale=0.37, stream=42, first=1003),
    ]
    for c in configs:
        n = c["n"]
        p = torch.randn(n, generator=g)
        grads = torch.randn(c["steps"], n, generator=g) * 0.1
        grads[:, :3] = torch.tensor([1e-6, 0.0, 1e3])  # a tiny, a zero and a large gradient
        m = torch.zeros(n, dtype=torch.int32)
        v = torch.zeros(n, dtype=torch.int32)
        p0 = p.clone()
        for s in range(c["steps"]):
            p, m, v = adamw_bf16_step(p, grads[s], m, v, c["lr"], *c["betas"], c["eps"], c["wd"], s + 1, c["scale"],
                                      c["stream"], c["first"])
        yield (f"n{n}_steps{c['steps']}_first{c['first']}", {
            "p0": p0, "grads": grads, "p": p, "m_bits": m, "v_bits": v}, {
            "n": n, "lr": c["lr"], "beta1": c["betas"][0], "beta2": c["betas"][1], "eps": c["eps"],
            "weight_decay": c["wd"], "steps": c["steps"], "grad_scale": c["scale"], "stream": c["stream"],
            "first": c["first"]})
