#!/usr/bin/python3
"""An independent reference of bitsandbytes' NF4 (QLoRA) 4-bit quantization, in numpy, written from
the algorithm (the bitsandbytes package is not installed here and is not used).

The algorithm, as bitsandbytes' CUDA kernels define it (kQuantizeBlockwise with its NF4 and
General8bit data types, kDequantizeBlockwise):

NF4 quantization of n values (blocksize 64):
  * blocks of 64 consecutive elements of the flattened tensor; the last block may be partial.
  * absmax[b] = max |x| over the block's elements (f32); inv = 1.0f / absmax[b] (f32 division).
  * each element becomes the 4-bit code c = number of the 15 thresholds t_k < x * inv (f32
    product), t_k = the f32 of bitsandbytes' decimal literal for the midpoint of NF4 codes k and
    k+1 (see NF4_THRESHOLDS). bitsandbytes writes this as a decision tree of `x > t` tests;
    counting the thresholds below x is the same function, NaN included: every test is false,
    code 0.
  * two codes per byte: element 2j in the high nibble, 2j+1 in the low one; ceil(n/2) bytes. For
    odd n the last low nibble is the code of the kernel's zero padding, 0 * inv (7 for a nonzero
    absmax; 0 when absmax is 0 since 0 * inf is NaN). An all-zero block gets absmax 0 and code 0.
Double quantization (compress_statistics=True) of the absmax values:
  * offset = mean of absmax (here: a sequential double sum divided by the count, rounded to f32;
    bitsandbytes uses torch's f32 mean on the device, which may differ by rounding);
  * centered = absmax - offset (f32), quantized blockwise in blocks of 256 with the signed 8-bit
    dynamic map (create_dynamic_map(signed=True)): nested_absmax[g] = max |centered| of the
    block, x = centered * (1.0f / nested_absmax[g]), and the code is chosen by bitsandbytes'
    binary search over the 256 sorted values followed by a midpoint comparison with the
    neighbour on the side x lies (dQuantize<0>), implemented below step by step.
Dequantization (f32 products, then rounded once to the output dtype):
  * absmax[b] = dynamic_map[qabsmax[b]] * nested_absmax[b // 256] + offset (two f32 roundings)
  * out[i] = NF4[code_i] * absmax[i // 64]

Used by gen_refs.py through ref_nf4.py (the op parity cases) and from the command line:
    nf4_reference.py write-dirs OUT    bitsandbytes-layout model directories for the loader test
"""

import json
import os
import sys
from fractions import Fraction

import numpy as np
import torch

BLOCKSIZE = 64
NESTED_BLOCKSIZE = 256

# The NF4 data type of the QLoRA paper (bitsandbytes' get_4bit_type("nf4")), as f32.
NF4 = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)


def f32_of_decimal(text):
    """The f32 nearest to the decimal `text` (ties to even), as a C or CUDA compiler converts a
    float literal: directly, not through a double (which can round differently near a tie)."""
    exact = Fraction(text)
    guess = np.float32(float(text))
    candidates = [guess, np.nextafter(guess, np.float32(np.inf)), np.nextafter(guess, np.float32(-np.inf))]
    def key(c):
        bits = int(np.array([c], dtype=np.float32).view(np.uint32)[0])
        return (abs(Fraction(float(c)) - exact), bits & 1)
    return min(candidates, key=key)


# Decision thresholds: the midpoints between neighbouring NF4 values, as bitsandbytes' CUDA
# decision tree (dQuantizeNF4) writes them: 16-17 digit decimal literals with an f suffix. The
# literal is what counts: four of them (-0.848..., 0.120..., 0.501..., 0.861...) lie so close to
# the tie between two f32 values that the f32 of the exact midpoint, or of the literal through a
# double, is the other neighbour. (bitsandbytes' pure-torch backend, which takes f32 midpoints,
# therefore rounds differently at those four thresholds; its CUDA kernel is followed here.)
NF4_THRESHOLD_LITERALS = [
    "-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906", "-0.33967943489551544",
    "-0.23460740596055984", "-0.13791173323988914", "-0.045525018125772476", "0.03979014977812767",
    "0.1202552504837513", "0.2035212516784668", "0.2920137718319893", "0.3893125355243683",
    "0.5016634166240692", "0.6427869200706482", "0.8614784181118011"]
NF4_THRESHOLDS = np.array([f32_of_decimal(t) for t in NF4_THRESHOLD_LITERALS], dtype=np.float32)
# Each literal is the midpoint of its neighbours to within 2e-17 (the decimal printing of a double).
assert all(abs(float(Fraction(t)) - (float(NF4[k]) + float(NF4[k + 1])) / 2) < 1e-16
           for k, t in enumerate(NF4_THRESHOLD_LITERALS))


def dynamic_map(signed=True):
    """bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for exponent i
    in 0..6, the midpoints of torch.linspace(0.1, 1, k + 1) scaled by 10**(i - 6), k = 2**i signed
    (both signs) and 2**(i + 1) unsigned (bitsandbytes counts 7 non-sign bits either way); plus 0
    and 1; sorted. 256 f32 values. Signed: the NF4 nested map and exp_avg's 8-bit state; unsigned:
    exp_avg_sq's."""
    values = []
    for i in range(7):
        k = 2 ** i if signed else 2 ** (i + 1)
        edges = torch.linspace(0.1, 1, k + 1, dtype=torch.float32)
        mids = (edges[:-1] + edges[1:]) / 2.0
        scale = 10 ** (i - 6)
        values += (scale * mids).tolist()
        if signed:
            values += (-scale * mids).tolist()
    values += [0.0, 1.0]
    assert len(values) == 256
    return np.array(sorted(values), dtype=np.float32)


DYNAMIC = dynamic_map(True)
DYNAMIC_UNSIGNED = dynamic_map(False)


def _blocks(x, bs):
    """x (f32, flat) zero-padded to whole blocks of bs, as [blocks, bs], and the valid count."""
    n = x.size
    nb = (n + bs - 1) // bs
    padded = np.zeros(nb * bs, dtype=np.float32)
    padded[:n] = x
    return padded.reshape(nb, bs)


def _absmax_and_inverse(blocks, n):
    bs = blocks.shape[1]
    valid = (np.arange(blocks.size).reshape(blocks.shape) < n)
    amax = np.where(valid, np.abs(blocks), np.float32(0)).max(axis=1).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = (np.float32(1.0) / amax).astype(np.float32)
    return amax, inv


def quantize_nf4(x):
    """x: f32 values (already widened from bf16/f16). Returns (packed u8 [ceil(n/2)], absmax f32)."""
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    n = x.size
    blocks = _blocks(x, BLOCKSIZE)
    amax, inv = _absmax_and_inverse(blocks, n)
    with np.errstate(invalid="ignore"):
        scaled = (blocks * inv[:, None]).astype(np.float32).reshape(-1)
        codes = (scaled[:, None] > NF4_THRESHOLDS[None, :]).sum(axis=1).astype(np.uint8)
    codes = codes[: n + (n & 1)]  # an odd tail keeps the padding element's code
    packed = ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8)
    return packed, amax


def dynamic_quantize(x, code=DYNAMIC):
    """bitsandbytes' dQuantize<0> over a dynamic map (f32 [256], ascending) for each element of x
    (f32): returns u8 codes."""
    x = np.asarray(x, dtype=np.float32)
    pivot = np.full(x.shape, 127, dtype=np.int64)
    low_idx = np.zeros(x.shape, dtype=np.int64)
    high_idx = np.full(x.shape, 255, dtype=np.int64)
    low = np.full(x.shape, -1.0, dtype=np.float32)
    high = np.full(x.shape, 1.0, dtype=np.float32)
    val = code[pivot]
    step = 64
    while step > 0:
        up = x > val
        low_idx = np.where(up, pivot, low_idx)
        low = np.where(up, val, low)
        high_idx = np.where(up, high_idx, pivot)
        high = np.where(up, high, val)
        pivot = np.where(up, pivot + step, pivot - step)
        val = code[pivot]
        step //= 2
    high = np.where(high_idx == 255, code[255], high)
    low = np.where(low_idx == 0, code[0], low)
    up = x > val
    mid_high = ((high + val) * np.float32(0.5)).astype(np.float32)
    mid_low = ((low + val) * np.float32(0.5)).astype(np.float32)
    result = np.where(up, np.where(x > mid_high, high_idx, pivot), np.where(x < mid_low, low_idx, pivot))
    return result.astype(np.uint8)


def offset_of(absmax):
    s = 0.0
    for v in absmax.tolist():  # sequential double sum, as shardlm does
        s += v
    return np.float32(s / absmax.size)


def double_quantize(absmax):
    """absmax f32 [nb] -> (qabsmax u8 [nb], nested_absmax f32 [ceil(nb/256)], offset f32)."""
    absmax = np.asarray(absmax, dtype=np.float32)
    nb = absmax.size
    offset = offset_of(absmax)
    centered = (absmax - offset).astype(np.float32)
    blocks = _blocks(centered, NESTED_BLOCKSIZE)
    amax2, inv2 = _absmax_and_inverse(blocks, nb)
    with np.errstate(invalid="ignore"):
        scaled = (blocks * inv2[:, None]).astype(np.float32).reshape(-1)[:nb]
    return dynamic_quantize(scaled), amax2, offset


def dequantize_absmax(qabsmax, nested_absmax, offset, code=DYNAMIC):
    q = np.asarray(qabsmax).astype(np.int64)
    g = np.arange(q.size) // NESTED_BLOCKSIZE
    prod = (code[q] * nested_absmax[g]).astype(np.float32)
    return (prod + np.float32(offset)).astype(np.float32)


def dequantize_nf4(packed, absmax, n):
    """f32 values of n elements."""
    packed = np.asarray(packed, dtype=np.uint8)
    codes = np.empty(packed.size * 2, dtype=np.uint8)
    codes[0::2] = packed >> 4
    codes[1::2] = packed & 15
    codes = codes[:n]
    b = np.arange(n) // BLOCKSIZE
    return (NF4[codes] * absmax[b]).astype(np.float32)


# ---- bitsandbytes-layout model directories (what transformers' save_pretrained writes) ----------

def _quant_state_tensors(prefix, shape, dtype_name, packed, absmax, nested):
    """The tensors bitsandbytes' Linear4bit._save_to_state_dict stores beside `prefix` (a weight)."""
    out = {prefix: torch.from_numpy(packed.copy()).reshape(-1, 1)}  # [(n + 1) // 2, 1] uint8
    meta = {"quant_type": "nf4", "blocksize": BLOCKSIZE, "dtype": dtype_name, "shape": list(shape)}
    if nested:
        qabsmax, amax2, offset = double_quantize(absmax)
        out[prefix + ".absmax"] = torch.from_numpy(qabsmax.copy())
        out[prefix + ".quant_map"] = torch.from_numpy(NF4.copy())
        out[prefix + ".nested_absmax"] = torch.from_numpy(amax2.copy())
        out[prefix + ".nested_quant_map"] = torch.from_numpy(DYNAMIC.copy())
        meta.update({"nested_blocksize": NESTED_BLOCKSIZE, "nested_dtype": "float32",
                     "nested_offset": float(offset)})
        deq_absmax = dequantize_absmax(qabsmax, amax2, offset)
    else:
        out[prefix + ".absmax"] = torch.from_numpy(absmax.copy())
        out[prefix + ".quant_map"] = torch.from_numpy(NF4.copy())
        deq_absmax = absmax
    blob = json.dumps(meta).encode("utf-8")
    out[prefix + ".quant_state.bitsandbytes__nf4"] = torch.tensor(list(blob), dtype=torch.uint8)
    return out, deq_absmax


def write_dir(out, nested, seed):
    """A tiny Llama whose linear layers are NF4 (nested or not) and the rest bf16, as transformers
    saves a model loaded with BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")."""
    from safetensors_check import save
    rng = np.random.default_rng(seed)
    hidden, inter, vocab, heads, kv = 64, 88, 50, 4, 2
    hd = hidden // heads
    model_dir = os.path.join(out, "model")
    os.makedirs(model_dir, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": 1,
        "num_attention_heads": heads, "num_key_value_heads": kv, "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False,
        "quantization_config": {
            "_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_compute_dtype": "bfloat16",
            "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": bool(nested), "llm_int8_enable_fp32_cpu_offload": False,
            "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": None,
            "llm_int8_threshold": 6.0, "load_in_4bit": True, "load_in_8bit": False,
            "quant_method": "bitsandbytes"},
    }
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    linear = {
        "self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv * hd, hidden),
        "self_attn.v_proj": (kv * hd, hidden), "self_attn.o_proj": (hidden, hidden),
        "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter),
    }
    tensors, expected = {}, {}
    for name, shape in linear.items():
        key = f"model.layers.0.{name}.weight"
        # Per-row scales spread the block absmax values so double quantization has work to do.
        w = rng.standard_normal(shape) * np.exp(rng.uniform(-4, 1, size=(shape[0], 1)))
        w_bf16 = torch.from_numpy(w.astype(np.float32)).to(torch.bfloat16)
        packed, absmax = quantize_nf4(w_bf16.float().numpy())
        t, deq_absmax = _quant_state_tensors(key, shape, "bfloat16", packed, absmax, nested)
        tensors.update(t)
        expected[key] = torch.from_numpy(dequantize_nf4(packed, deq_absmax, w.size).reshape(shape))
    plain = {
        "model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden),
        "model.norm.weight": (hidden,), "model.layers.0.input_layernorm.weight": (hidden,),
        "model.layers.0.post_attention_layernorm.weight": (hidden,),
    }
    for key, shape in plain.items():
        t = torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(torch.bfloat16)
        tensors[key] = t
        expected[key] = t.float()
    save(os.path.join(model_dir, "model.safetensors"), tensors, {"format": "pt"})
    save(os.path.join(out, "expected.safetensors"), expected, {"format": "pt"})


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "write-dirs":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        write_dir(os.path.join(sys.argv[2], "double_quant"), True, 11)
        write_dir(os.path.join(sys.argv[2], "plain"), False, 12)
        print("OK")
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
