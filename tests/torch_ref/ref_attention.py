"""Reference cases for attention_forward / attention_backward (ops/ops.h).

PyTorch 1.13 has no scaled_dot_product_attention, so the reference is the naive math in float64:
scores = q k^T * scale with kv heads repeated for grouped-query attention, a causal mask aligned
bottom-right (query i sits at key position i + Tk - Tq) intersected with the segment mask, a
softmax, and autograd of sum(out * dout) for the gradients.

Layouts as in ops.h: q, out, dout, dq [B, Tq, H, Dh]; k, v, dk, dv [B, Tk, Hkv, Dh]; lse [B, H, Tq];
segment_ids [B, Tk].
"""
import math

import torch

OP = "attention"


def reference(q, k, v, dout, scale, segment_ids=None):
    """Returns out, lse, dq, dk, dv computed in float64 from the given (float) tensors."""
    B, Tq, H, Dh = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    q64 = q.double().requires_grad_()
    k64 = k.double().requires_grad_()
    v64 = v.double().requires_grad_()
    # [B, heads, T, Dh]; query head h reads kv head h // (H // Hkv).
    qh = q64.transpose(1, 2)
    kh = k64.repeat_interleave(H // Hkv, dim=2).transpose(1, 2)
    vh = v64.repeat_interleave(H // Hkv, dim=2).transpose(1, 2)
    scores = qh @ kh.transpose(-1, -2) * scale  # [B, H, Tq, Tk]

    qpos = torch.arange(Tq).view(Tq, 1) + (Tk - Tq)
    kpos = torch.arange(Tk).view(1, Tk)
    allowed = (kpos <= qpos).view(1, 1, Tq, Tk).expand(B, 1, Tq, Tk)
    if segment_ids is not None:
        seg_q = segment_ids[:, Tk - Tq:].view(B, 1, Tq, 1)
        seg_k = segment_ids.view(B, 1, 1, Tk)
        allowed = allowed & (seg_q == seg_k)
    scores = scores.masked_fill(~allowed, float("-inf"))

    lse = torch.logsumexp(scores, dim=-1)  # [B, H, Tq]
    probs = torch.softmax(scores, dim=-1)
    out = (probs @ vh).transpose(1, 2)  # [B, Tq, H, Dh]
    (out * dout.double()).sum().backward()
    return out.detach(), lse.detach(), q64.grad, k64.grad, v64.grad


def make_case(B, Tq, Tk, H, Hkv, Dh, scale=None, segments=None, dtype="f32"):
    """segments: per batch row, a list of segment lengths summing to Tk (packed examples)."""
    if scale is None:
        scale = 1.0 / math.sqrt(Dh)
    q = torch.randn(B, Tq, H, Dh)
    k = torch.randn(B, Tk, Hkv, Dh)
    v = torch.randn(B, Tk, Hkv, Dh)
    dout = torch.randn(B, Tq, H, Dh)
    if dtype == "bf16":
        # Stored as bf16; the reference sees exactly the rounded values the kernel reads.
        q, k, v, dout = (t.bfloat16() for t in (q, k, v, dout))
    seg = None
    if segments is not None:
        rows = []
        for lengths in segments:
            assert sum(lengths) == Tk
            rows.append(torch.cat([torch.full((n,), s, dtype=torch.int32) for s, n in enumerate(lengths)]))
        seg = torch.stack(rows)
    out, lse, dq, dk, dv = reference(q.float(), k.float(), v.float(), dout.float(), scale,
                                     seg.long() if seg is not None else None)
    arrays = {"q": q, "k": k, "v": v, "dout": dout, "out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    if seg is not None:
        arrays["segment_ids"] = seg
    params = {"B": B, "Tq": Tq, "Tk": Tk, "H": H, "Hkv": Hkv, "Dh": Dh, "scale": scale, "dtype": dtype}
    return arrays, params


def cases():
    # Small GQA case, two batch rows.
    yield ("gqa_b2_t7", *make_case(B=2, Tq=7, Tk=7, H=4, Hkv=2, Dh=16))
    # A single token (decode-like) with H == Hkv.
    yield ("mha_t1", *make_case(B=2, Tq=1, Tk=1, H=2, Hkv=2, Dh=16))
    # One past a 64-block boundary; multi-query (one kv head) and Dh 64.
    yield ("mqa_t65", *make_case(B=1, Tq=65, Tk=65, H=6, Hkv=1, Dh=64))
    # Three query and key blocks, the last one partial; a non-default scale.
    yield ("gqa_t130_scale", *make_case(B=1, Tq=130, Tk=130, H=4, Hkv=2, Dh=32, scale=0.3))
    # Packed sequences: segments that cross the block boundary at 64, different per batch row.
    yield ("segments_t70", *make_case(B=2, Tq=70, Tk=70, H=4, Hkv=2, Dh=16,
                                      segments=[[3, 2, 3, 60, 2], [40, 30]]))
    # KV cache: fewer queries than keys, bottom-right aligned.
    yield ("kvcache_tq3_tk20", *make_case(B=2, Tq=3, Tk=20, H=4, Hkv=2, Dh=32))
    # KV cache across blocks, with segments (a segment boundary inside the query range).
    yield ("kvcache_tq66_tk130_segments", *make_case(B=1, Tq=66, Tk=130, H=2, Hkv=1, Dh=16,
                                                     segments=[[70, 35, 25]]))
    # Head sizes that are not a whole number of 16-float vectors (the CPU kernel pads block rows
    # with zeros) or need a partial register tile (80 = 4 + 1 vectors), across blocks.
    yield ("head_dim_24_t67", *make_case(B=1, Tq=67, Tk=67, H=2, Hkv=1, Dh=24))
    yield ("head_dim_80_t70_segments", *make_case(B=1, Tq=70, Tk=70, H=4, Hkv=2, Dh=80,
                                                  segments=[[30, 40]]))
    yield ("head_dim_128_t129", *make_case(B=1, Tq=129, Tk=129, H=2, Hkv=2, Dh=128))
    # bf16 inputs and dout (the kernel writes bf16 out); compared with looser tolerances.
    yield ("bf16_gqa_t33", *make_case(B=1, Tq=33, Tk=33, H=4, Hkv=2, Dh=32, dtype="bf16"))
    # One sequence's decode step and prefill chunk after a cache of keys (attention_forward_paged
    # reads these keys from blocks too).
    yield ("kvcache_decode_tq1_tk37", *make_case(B=1, Tq=1, Tk=37, H=4, Hkv=2, Dh=16))
    yield ("bf16_kvcache_tq4_tk37", *make_case(B=1, Tq=4, Tk=37, H=4, Hkv=1, Dh=32, dtype="bf16"))
