"""quant8: 8-bit blockwise quantization of optimizer state as bitsandbytes defines it, written here in
torch: its dynamic map (create_dynamic_map(signed, max_exponent_bits=7, total_bits=8), built the way
bitsandbytes builds it, in float32 linspace and products), blocks of 256 with an f32 absmax each,
and every element's code the map's nearest value to x / absmax (a tie to the lower code; a block of
zeros: absmax 0 and the code of 0). Dequantization: map[code] * absmax."""
import torch

OP = "quant8"
BLOCK = 256


def dynamic_map(signed):
    data = []
    for i in range(7):
        items = 2 ** i + 1 if signed else 2 ** (i + 1) + 1
        b = torch.linspace(0.1, 1, items)
        means = (b[:-1] + b[1:]) / 2.0
        data += (10 ** (-6 + i) * means).tolist()
        if signed:
            data += (-(10 ** (-6 + i)) * means).tolist()
    data += [0.0, 1.0]
    assert len(data) == 256
    return torch.tensor(sorted(data), dtype=torch.float32)


def quantize(x, signed):
    qmap = dynamic_map(signed)
    n = x.numel()
    blocks = (n + BLOCK - 1) // BLOCK
    padded = torch.zeros(blocks * BLOCK, dtype=torch.float32)
    padded[:n] = x
    absmax = padded.view(blocks, BLOCK).abs().max(dim=1).values
    safe = torch.where(absmax == 0, torch.ones_like(absmax), absmax)
    y = (padded.view(blocks, BLOCK) / safe[:, None]).reshape(-1)[:n]
    hi = torch.searchsorted(qmap, y, right=False).clamp(1, 255)  # first value >= y (ends: below)
    lo = hi - 1
    below = torch.searchsorted(qmap, y, right=False) == 0
    above = torch.searchsorted(qmap, y, right=False) == 256
    code = torch.where((y - qmap[lo]) <= (qmap[hi] - y), lo, hi)
    code = torch.where(below, torch.zeros_like(code), torch.where(above, torch.full_like(code, 255), code))
    zero = int(torch.searchsorted(qmap, torch.tensor(0.0)))
    block_of = torch.arange(n) // BLOCK
    code = torch.where(absmax[block_of] == 0, torch.full_like(code, zero), code)
    return code.to(torch.uint8), absmax


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
