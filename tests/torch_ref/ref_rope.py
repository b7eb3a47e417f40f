"""PyTorch references for rotary position embeddings: Hugging Face Llama's rotary code, written
out (transformers is not needed).

Arrays per case: x [B, T, H, Dh] and dout (inputs), positions [B, T], inv_freq [Dh/2] (from
_compute_default_rope_parameters / _compute_llama3_parameters), out (the forward) and dx (the
gradient of sum(out * dout), by autograd). HF works in [B, H, T, Dh]; the op's layout is
[B, T, H, Dh], so x is transposed in and out.

For bf16 cases out and dx are HF's bf16 computation (cos and sin cast to bf16 and every product
rounded), and out_f32 / dx_f32 are the float32 computation on the same bf16 values, which is what
the op promises (f32 arithmetic, one rounding at the end).
"""

import torch

OP = "rope"


# The frequencies come from the model reference, so the op and the model are checked against one
# definition of transformers' rotary parameters.
from llama_ref import default_inv_freq, llama3_inv_freq  # noqa: E402


def cos_sin(inv_freq, position_ids, dtype):
    # LlamaRotaryEmbedding.forward (attention_scaling is 1.0 for default and llama3)
    inv_freq_expanded = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    position_ids_expanded = position_ids[:, None, :].float()
    freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x_bthd, inv_freq, positions):
    """HF apply_rotary_pos_emb on [B, T, H, Dh] (via HF's [B, H, T, Dh])."""
    q = x_bthd.transpose(1, 2)
    cos, sin = cos_sin(inv_freq, positions.long(), q.dtype)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos + rotate_half(q) * sin).transpose(1, 2)


def forward_backward(x, dout, inv_freq, positions):
    xg = x.clone().requires_grad_(True)
    out = apply_rope(xg, inv_freq, positions)
    (out * dout).sum().backward()
    return out.detach(), xg.grad


def packed_positions(b, t, seg_lens):
    """Positions restarting at 0 at each packed segment: [0, 1, 2, 0, 1, ...]."""
    row = []
    while len(row) < t:
        for n in seg_lens:
            row.extend(range(n))
    return torch.tensor(row[:t], dtype=torch.int32).repeat(b, 1)


def cases():
    B, H = 2, 3
    none = {"scaling": "none"}
    llama31 = {"scaling": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    llama32 = dict(llama31, factor=32.0)
    arange = lambda t: torch.arange(t, dtype=torch.int32).repeat(B, 1)  # noqa: E731
    specs = [
        # name, Dh, T, theta, positions, scaling, dtype
        ("dh8_t5_arange", 8, 5, 10000.0, arange(5), none, torch.float32),
        ("dh64_t37_packed", 64, 37, 10000.0, packed_positions(B, 37, [5, 11, 3, 20]), none, torch.float32),
        ("dh128_t1_decode", 128, 1, 500000.0, torch.tensor([[4711], [0]], dtype=torch.int32), none,
         torch.float32),
        ("dh64_t5_large_pos", 64, 5, 10000.0, torch.randint(0, 8001, (B, 5), dtype=torch.int32), none,
         torch.float32),
        ("dh128_t37_theta5e5", 128, 37, 500000.0, arange(37) + 100, none, torch.float32),
        ("llama31_dh128_t37", 128, 37, 500000.0, torch.randint(0, 20001, (B, 37), dtype=torch.int32), llama31,
         torch.float32),
        ("llama32_dh64_t5", 64, 5, 500000.0, packed_positions(B, 5, [2, 3]) * 997, llama32, torch.float32),
        # Head sizes that are not powers of two: the exponent 2i / Dh is then inexact, so its f32
        # rounding matters.
        ("dh80_t5_theta1e4", 80, 5, 10000.0, arange(5) + 3, none, torch.float32),
        ("llama31_dh96_t3", 96, 3, 500000.0, arange(3) * 4000, llama31, torch.float32),
        ("bf16_dh64_t5_packed", 64, 5, 10000.0, packed_positions(B, 5, [3, 2]) + 7, none, torch.bfloat16),
    ]
    for name, dh, t, theta, positions, scaling, dtype in specs:
        if scaling["scaling"] == "llama3":
            inv_freq = llama3_inv_freq(theta, dh, scaling["factor"], scaling["low_freq_factor"],
                                       scaling["high_freq_factor"], scaling["original_max_position_embeddings"])
        else:
            inv_freq = default_inv_freq(theta, dh)
        x = torch.randn(B, t, H, dh).to(dtype)
        dout = torch.randn(B, t, H, dh).to(dtype)
        out, dx = forward_backward(x, dout, inv_freq, positions)
        arrays = {"x": x, "dout": dout, "positions": positions, "inv_freq": inv_freq, "out": out, "dx": dx}
        if dtype != torch.float32:
            out_f32, dx_f32 = forward_backward(x.float(), dout.float(), inv_freq, positions)
            arrays.update(out_f32=out_f32, dx_f32=dx_f32)
        params = dict(scaling, B=B, T=t, H=H, head_dim=dh, theta=theta, dtype=str(dtype).replace("torch.", ""))
        yield name, arrays, params
