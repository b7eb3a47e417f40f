"""cast: f32 -> bf16 and f32 -> f16 rounding (to nearest, ties to even), and back, on values that
exercise ties, subnormals, overflow and specials."""
import torch

OP = "cast"


def cases():
    g = torch.Generator().manual_seed(5)
    bits = torch.randint(-2**31, 2**31 - 1, (20000,), generator=g, dtype=torch.int64).to(torch.int32)
    random_bits = bits.view(torch.float32)
    random_bits = random_bits[torch.isfinite(random_bits)]
    normal = torch.randn(20000, generator=g) * torch.logspace(-9, 6, 20000)
    # Exact ties for bf16: a kept mantissa followed by exactly 0x8000 in the dropped 16 bits.
    tie_bits = (torch.randint(0, 2**15, (2000,), generator=g, dtype=torch.int64) << 16) | 0x8000
    bf16_ties = tie_bits.to(torch.int32).view(torch.float32)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 65504.0, 65519.0, 65520.0, 1e-8, 5.96e-8,
                             2.98e-8, 6.1e-5, 3.4e38, -3.4e38, 1.0 + 2**-8, 1.0 + 3 * 2**-8])
    x = torch.cat([random_bits, normal, bf16_ties, specials]).float()
    yield ("mixed", {"x": x, "bf16": x.to(torch.bfloat16), "f16_bits": x.to(torch.float16).view(torch.int16),
                     "bf16_back": x.to(torch.bfloat16).float(), "f16_back": x.to(torch.float16).float()},
           {"n": int(x.numel())})
