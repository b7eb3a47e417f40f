"""nf4: bitsandbytes-compatible NF4 quantization, with and without double quantization, computed by
the independent numpy reference in nf4_reference.py (not by bitsandbytes, which is not installed).
Sizes are odd on purpose: partial last blocks, odd element counts, several nested groups."""
import numpy as np
import torch

import nf4_reference as ref

OP = "nf4"


def _case(name, x, dtype):
    """x: torch f32 values; dtype: the input dtype the op sees ("f32", "bf16", "f16")."""
    if dtype == "bf16":
        xt = x.to(torch.bfloat16)
    elif dtype == "f16":
        xt = x.to(torch.float16)
    else:
        xt = x
    xf = xt.float().numpy()
    n = xf.size
    packed, absmax = ref.quantize_nf4(xf)
    qabsmax, nested, offset = ref.double_quantize(absmax)
    deq_absmax = ref.dequantize_absmax(qabsmax, nested, offset)
    arrays = {
        "x": xt,
        "packed": torch.from_numpy(packed.astype(np.int32)),
        "absmax": torch.from_numpy(absmax),
        "out": torch.from_numpy(ref.dequantize_nf4(packed, absmax, n)),
        "qabsmax": torch.from_numpy(qabsmax.astype(np.int32)),
        "nested_absmax": torch.from_numpy(nested),
        "offset": torch.tensor([float(offset)], dtype=torch.float32),
        "deq_absmax": torch.from_numpy(deq_absmax),
        "out_nested": torch.from_numpy(ref.dequantize_nf4(packed, deq_absmax, n)),
    }
    # The bf16 output is the f32 one rounded once (torch's round to nearest even).
    arrays["out_nested_bf16"] = arrays["out_nested"].to(torch.bfloat16)
    return name, arrays, {"n": int(n), "dtype": dtype}


def cases():
    g = torch.Generator().manual_seed(41)
    yield _case("one", torch.tensor([0.37]), "f32")
    yield _case("three_odd", torch.randn(3, generator=g), "f32")
    yield _case("block_minus_one", torch.randn(63, generator=g), "f32")
    yield _case("block_plus_one_odd", torch.randn(65, generator=g) * 3, "bf16")
    for n, dtype in ((1001, "f32"), (4097, "bf16"), (777, "f16")):
        yield _case(f"randn_{n}_{dtype}", torch.randn(n, generator=g) * 0.02, dtype)
    # Values on and around the decision thresholds, an all-zero block, a single-value block, and
    # infinities kept out: each block holds absmax exactly, so x * inv lands near thresholds.
    t = torch.from_numpy(ref.NF4_THRESHOLDS.astype(np.float32))
    near = torch.cat([t, torch.nextafter(t, torch.full_like(t, 2.0)), torch.nextafter(t, torch.full_like(t, -2.0)),
                      torch.from_numpy(ref.NF4), torch.tensor([1.0, -1.0])])
    near = torch.cat([near, torch.zeros(64 - near.numel() % 64)]) if near.numel() % 64 else near
    special = torch.cat([near, torch.zeros(64), torch.tensor([5.0]), torch.zeros(63), -near * 7])
    yield _case("thresholds_and_zero_blocks", special, "f32")
    # Block scales spread over decades so the nested (double) quantization has work to do: over
    # two groups of 256 blocks, the last group partial, an odd element count.
    n = 64 * 600 + 31
    scales = torch.exp(torch.empty(600 + 1).uniform_(-6, 2, generator=g)).repeat_interleave(64)[:n]
    yield _case("nested_groups_odd", torch.randn(n, generator=g) * scales, "f32")
    n = 64 * 256 * 3 + 64 * 5
    scales = torch.exp(torch.empty(256 * 3 + 5).uniform_(-3, 0, generator=g)).repeat_interleave(64)
    yield _case("nested_groups_bf16", torch.randn(n, generator=g) * scales, "bf16")
    yield ("dynamic_map", {"map": torch.from_numpy(ref.DYNAMIC), "nf4": torch.from_numpy(ref.NF4),
                           "thresholds": torch.from_numpy(ref.NF4_THRESHOLDS)}, {"n": 0, "dtype": "none"})
