#!/usr/bin/env python3
"""An independent GGUF reader, written from ggml's docs/gguf.md, and the checks of `shardlm export`.

The reader parses the whole file by hand (struct + numpy): the header ("GGUF", version 3, tensor
and key-value counts), every key-value (all 13 value types, nested arrays), the tensor infos
(name, dims in ggml order, type, offset), the zero padding to general.alignment, and each
tensor's data, dequantized (F32, F16, BF16, Q8_0: blocks of an f16 scale and 32 int8).

`check` then compares a GGUF file with the Hugging Face directory it came from, using only
config.json, the safetensors files (read here with numpy) and the
tokenizer files (tokenizer.json; Llama 3's tiktoken tokenizer.model; SentencePiece through
python sentencepiece):
  - metadata: architecture, hyperparameters, file type, alignment;
  - every tensor present with llama.cpp's name, no others, the expected type; its values equal to
    the safetensors weights after undoing the llama q/k row permutation: exactly for F32 and BF16
    (the nearest bf16 of the weight, ties to even), F16 numpy's f16 rounding, Q8_0 within its block's quantization
    bound (and the scale exactly f16(max|x| / 127));
  - rope_freqs against the Llama 3 formula; the tokenizer entries against the tokenizer files.
Exit 0 and "OK ..." lines, or the problems and exit 1.

Commands (one Python start each, for the test's time budget):
  gguf_check.py check MODEL_DIR FILE.gguf OUTTYPE [...] [--tamper MODEL_DIR FILE.gguf TENSOR N_HEAD]
      check each file; --tamper also checks a copy of an f32 file whose TENSOR (a llama q or k) was
      left unpermuted, which must fail on exactly that tensor
  gguf_check.py prepare WORK GPT2_VOCAB GPT2_MERGES
      for tests/scripts/gguf_export_cli.sh: random norms and biases in WORK/{l3,l2,ms,q2} (a fresh model
      has ones and zeros, which no permutation or mix-up could change), a small Qwen2-style
      tokenizer.json in WORK/q2, and WORK/drop, WORK/shape: copies of q2 with a tensor dropped or
      mis-shaped
"""

import base64
import json
import math
import os
import random
import struct
import sys

import numpy as np

# No torch: its import alone costs seconds of the test's time budget. Rounding references are numpy's
# (f16) or written from the definition (bf16, bf16_rounded).

# ---- the reader ------------------------------------------------------------------------------
GGML_F32, GGML_F16, GGML_Q8_0, GGML_BF16 = 0, 1, 8, 30
TYPE_NAMES = {GGML_F32: "F32", GGML_F16: "F16", GGML_Q8_0: "Q8_0", GGML_BF16: "BF16"}
# metadata value types: struct format of the scalar ones
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
T_STRING, T_ARRAY = 8, 9


class Reader:
    def __init__(self, data):
        self.d = data
        self.pos = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        if self.pos + n > len(self.d):
            raise ValueError(f"string of {n} bytes at {self.pos} runs past the end")
        s = bytes(self.d[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def value(self, t):
        if t in SCALARS:
            v = self.take(SCALARS[t])
            if t == 7:
                raw = self.d[self.pos - 1]
                if raw not in (0, 1):
                    raise ValueError(f"bool byte {raw} at {self.pos - 1}")
            return v
        if t == T_STRING:
            return self.string()
        if t == T_ARRAY:
            et = self.take("<I")
            n = self.take("<Q")
            if et in (4, 5, 6) and n > 1000:  # fast path for long numeric arrays
                dt = {4: "<u4", 5: "<i4", 6: "<f4"}[et]
                arr = np.frombuffer(self.d, dtype=dt, count=n, offset=self.pos)
                self.pos += 4 * n
                return ("array", et, arr.tolist())
            if et == T_STRING:  # fast path for long string arrays (vocabularies, merges)
                d, pos, out = self.d, self.pos, []
                for _ in range(n):
                    (k,) = struct.unpack_from("<Q", d, pos)
                    if pos + 8 + k > len(d):
                        raise ValueError(f"string of {k} bytes at {pos} runs past the end")
                    out.append(str(d[pos + 8:pos + 8 + k], "utf-8"))
                    pos += 8 + k
                self.pos = pos
                return ("array", et, out)
            return ("array", et, [self.value(et) for _ in range(n)])
        raise ValueError(f"unknown value type {t} at {self.pos}")


def nbytes(ggml_type, n):
    if ggml_type == GGML_F32:
        return 4 * n
    if ggml_type in (GGML_F16, GGML_BF16):
        return 2 * n
    if ggml_type == GGML_Q8_0:
        assert n % 32 == 0
        return n // 32 * 34
    raise ValueError(f"unexpected ggml type {ggml_type}")


def read_gguf(path):
    """-> (kv: {key: (type, value)}, tensors: {name: info dict}, order of names). Raises on any breach."""
    data = memoryview(open(path, "rb").read())
    r = Reader(data)
    if bytes(data[:4]) != b"GGUF":
        raise ValueError(f"magic {bytes(data[:4])!r}")
    r.pos = 4
    version = r.take("<I")
    if version != 3:
        raise ValueError(f"version {version}")
    n_tensors = r.take("<Q")
    n_kv = r.take("<Q")
    kv = {}
    for _ in range(n_kv):
        key = r.string()
        if key in kv:
            raise ValueError(f"key {key} twice")
        if not all(c.islower() or c.isdigit() or c in "._" for c in key):
            raise ValueError(f"key {key!r} is not lower_snake_case segments")
        t = r.take("<I")
        kv[key] = (t, r.value(t))
    align = kv.get("general.alignment", (4, 32))[1]
    if align % 8:
        raise ValueError(f"alignment {align}")
    tensors, order = {}, []
    for _ in range(n_tensors):
        name = r.string()
        if len(name.encode()) > 64 or name in tensors:
            raise ValueError(f"tensor name {name!r} too long or repeated")
        nd = r.take("<I")
        dims = [r.take("<Q") for _ in range(nd)]
        t = r.take("<I")
        off = r.take("<Q")
        tensors[name] = {"dims": dims, "type": t, "offset": off}
        order.append(name)
    header_end = r.pos
    data_start = (header_end + align - 1) // align * align
    if any(data[header_end:data_start]):
        raise ValueError("non-zero padding before the data section")
    spans = []
    for name in order:
        info = tensors[name]
        if info["offset"] % align:
            raise ValueError(f"{name}: offset {info['offset']} not a multiple of {align}")
        n = int(np.prod(info["dims"]))
        info["nbytes"] = nbytes(info["type"], n)
        info["start"] = data_start + info["offset"]
        if info["start"] + info["nbytes"] > len(data):
            raise ValueError(f"{name}: data runs past the end of the file")
        spans.append((info["start"], info["start"] + info["nbytes"], name))
    spans.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise ValueError(f"{an} and {bn} overlap")
        if any(data[a1:b0]):
            raise ValueError(f"non-zero padding between {an} and {bn}")
    return kv, tensors, order, data


def dequantize(info, data):
    """The tensor as numpy (f32, exact for F32/F16/BF16; f64 for Q8_0, with (d, q) too), row-major."""
    n = int(np.prod(info["dims"]))
    shape = tuple(reversed(info["dims"]))
    raw = data[info["start"]:info["start"] + info["nbytes"]]
    t = info["type"]
    if t == GGML_F32:
        return np.frombuffer(raw, dtype="<f4").reshape(shape), None
    if t == GGML_F16:  # every f16 is an f32 exactly
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape), None
    if t == GGML_BF16:
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape), None
    if t == GGML_Q8_0:
        blocks = np.frombuffer(raw, dtype=np.uint8).reshape(n // 32, 34)
        d = blocks[:, :2].copy().view("<f2").astype(np.float64)  # [nb, 1]
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float64)
        return (d * q).reshape(shape), (d, q)
    raise ValueError(f"type {t}")


# ---- safetensors, by hand (numpy) -------------------------------------------------------------
# An 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, the data.
ST_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}  # BF16 kept as its raw 16 bits


class Weight:
    def __init__(self, dtype, array):
        self.dtype, self.array = dtype, array  # array: typed as ST_DTYPES says

    def f32(self):
        if self.dtype == "BF16":
            return (self.array.astype(np.uint32) << 16).view(np.float32)
        return self.array.astype(np.float32)

    def dim(self):
        return self.array.ndim


def st_load(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        arr = np.frombuffer(data, dtype=ST_DTYPES[e["dtype"]], count=(end - b) // np.dtype(ST_DTYPES[e["dtype"]]).itemsize,
                            offset=8 + n + b).reshape(e["shape"])
        out[name] = Weight(e["dtype"], arr)
    return out, meta


def st_save(path, weights, meta):
    header, offset, blobs = {}, 0, []
    for name, w in weights.items():
        raw = np.ascontiguousarray(w.array).tobytes()
        header[name] = {"dtype": w.dtype, "shape": list(w.array.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if meta is not None:
        header["__metadata__"] = meta
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)


# ---- expectations, from the Hugging Face side ----------------------------------------------------
def load_weights(model_dir):
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return st_load(single)[0]
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for s in shards:
        out.update(st_load(os.path.join(model_dir, s))[0])
    return out


def bf16_rounded(w):
    """The weight rounded to the nearest bf16 (ties to the even one), as f32, from the definition: of
    the two bf16 values around x (x with its low 16 bits cleared, and the next one away from zero),
    the nearer, compared in f64. Finite values only (a model's weights)."""
    x = w.f32()
    u = x.view(np.uint32)
    lo_bits = u & np.uint32(0xFFFF0000)
    hi_bits = lo_bits + np.uint32(0x10000)
    lo, hi = lo_bits.view(np.float32).astype(np.float64), hi_bits.view(np.float32).astype(np.float64)
    xd = x.astype(np.float64)
    dlo, dhi = np.abs(xd - lo), np.abs(hi - xd)
    lo_even = (lo_bits & np.uint32(0x10000)) == 0
    take_lo = (dlo < dhi) | ((dlo == dhi) & lo_even)
    return np.where(take_lo, lo_bits, hi_bits).view(np.float32)


LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.o_proj.bias": "attn_output.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf):
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    parts = hf.split(".")
    assert parts[0] == "model" and parts[1] == "layers", hf
    return f"blk.{parts[2]}." + LAYER_NAMES[".".join(parts[3:])]


def unpermute(w, n_head):
    """Undo llama.cpp's converter permutation: GGUF rows (head, i, pair) back to HF (head, pair, i)."""
    shape = w.shape
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def llama3_rope_factors(cfg):
    rs = cfg["rope_scaling"]
    base = cfg.get("rope_theta", 10000.0)
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    factor, low, high = rs["factor"], rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / (base ** (i / dim))
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out)


def byte_alphabet():
    """GPT-2's bytes -> printable characters (as its encoder.py defines them)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cps = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            cps.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, cps)}


ALPHA = byte_alphabet()


SPELL_TABLE = {b: ALPHA[b] for b in range(256)}  # for str.translate over latin-1 text (byte b = code point b)


def spell(bs):
    return bs.decode("latin-1").translate(SPELL_TABLE)


LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def expected_vocab(model_dir, cfg):
    """-> dict: model, pre, tokens, types, scores (or None), merges (or None), bos, eos, unk, add_bos, add_space_prefix."""
    V = cfg["vocab_size"]
    tc_path = os.path.join(model_dir, "tokenizer_config.json")
    tc = json.load(open(tc_path)) if os.path.exists(tc_path) else {}
    tj_path = os.path.join(model_dir, "tokenizer.json")
    tm_path = os.path.join(model_dir, "tokenizer.model")
    e = {"tokens": [f"[PAD{i}]" for i in range(V)], "types": [5] * V, "scores": None, "merges": None,
         "unk": None, "add_space_prefix": None}
    if os.path.exists(tj_path):
        tj = json.load(open(tj_path))
        e["model"] = "gpt2"
        pt = tj["pre_tokenizer"]
        regexes = [p["pattern"]["Regex"] for p in pt.get("pretokenizers", [pt]) if p["type"] == "Split"]
        e["pre"] = {LLAMA3_PATTERN: "llama-bpe", QWEN2_PATTERN: "qwen2"}.get(regexes[0] if len(regexes) == 1 else None)
        added = {t["id"]: t for t in tj.get("added_tokens", [])}
        for tok, i in tj["model"]["vocab"].items():
            e["tokens"][i], e["types"][i] = tok, 1
        for i, t in added.items():
            e["tokens"][i], e["types"][i] = t["content"], 3 if t["special"] else 4
        merges, seen = [], set()
        for m in tj["model"]["merges"]:
            m = m if isinstance(m, str) else " ".join(m)
            if m not in seen:
                seen.add(m)
                merges.append(m)
        e["merges"] = merges

        def special(key):
            v = tc.get(key)
            v = v.get("content") if isinstance(v, dict) else v
            return next((i for i, t in added.items() if t["content"] == v), None) if v else None
        e["bos"], e["eos"] = special("bos_token"), special("eos_token")
        if e["bos"] is None:
            e["bos"] = cfg.get("bos_token_id")
        e["add_bos"] = tc.get("add_bos_token", e["bos"] is not None and special("bos_token") is not None)
    elif os.path.exists(tm_path) and open(tm_path, "rb").read(1) != b"\x0a":
        # Llama 3's tiktoken file: base64 token, rank; 256 special tokens follow.
        ranks = {}
        for line in open(tm_path, "rb").read().splitlines():
            if line:
                b64, rank = line.split()
                ranks[base64.b64decode(b64)] = int(rank)
        for bs, r in ranks.items():
            e["tokens"][r], e["types"][r] = spell(bs), 1
        n = len(ranks)
        names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                 "<|reserved_special_token_2|>", "<|reserved_special_token_3|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"]
        names += [f"<|reserved_special_token_{i}|>" for i in range(5, 5 + 256 - len(names))]
        for k, s in enumerate(names):
            e["tokens"][n + k], e["types"][n + k] = s, 3
        e["model"], e["pre"] = "gpt2", "llama-bpe"
        e["bos"], e["eos"], e["add_bos"] = n, n + 1, True
        e["merges"] = tiktoken_merges(ranks)
    else:
        import sentencepiece as spm
        from sentencepiece import sentencepiece_model_pb2 as pb
        sp = spm.SentencePieceProcessor(model_file=tm_path)
        proto = pb.ModelProto()
        proto.ParseFromString(open(tm_path, "rb").read())
        e["model"], e["pre"] = "llama", "default"
        e["scores"] = [-10000.0] * V
        for i in range(sp.get_piece_size()):
            e["tokens"][i], e["scores"][i] = sp.id_to_piece(i), sp.get_score(i)
            t = 1
            if sp.is_unknown(i):
                t = 2
            elif sp.is_control(i):
                t = 3
            elif sp.is_unused(i):
                t = 5
            elif sp.is_byte(i):
                t = 6
            elif proto.pieces[i].type == pb.ModelProto.SentencePiece.USER_DEFINED:
                t = 4
            e["types"][i] = t
        e["bos"], e["eos"], e["unk"] = sp.bos_id(), sp.eos_id(), sp.unk_id()
        e["pad"] = sp.pad_id() if sp.pad_id() >= 0 else None
        e["add_bos"] = tc.get("add_bos_token", True)
        e["add_space_prefix"] = proto.normalizer_spec.add_dummy_prefix
    e["chat_template"] = tc.get("chat_template")
    return e


def check(model_dir, path, outtype):
    problems = []
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    kv, tensors, order, data = read_gguf(path)
    get = lambda k: kv[k][1] if k in kv else None  # noqa: E731
    arr = lambda k: kv[k][1][2] if k in kv else None  # noqa: E731
    mt = cfg.get("model_type", "llama")
    arch = "qwen2" if mt == "qwen2" else "llama"
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    n_head, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    want_kv = {
        "general.architecture": (8, arch), "general.alignment": (4, 32),
        "general.file_type": (4, {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}[outtype]),
        f"{arch}.context_length": (4, cfg["max_position_embeddings"]),
        f"{arch}.embedding_length": (4, cfg["hidden_size"]),
        f"{arch}.block_count": (4, cfg["num_hidden_layers"]),
        f"{arch}.feed_forward_length": (4, cfg["intermediate_size"]),
        f"{arch}.attention.head_count": (4, n_head), f"{arch}.attention.head_count_kv": (4, n_kv),
        f"{arch}.rope.dimension_count": (4, head_dim), f"{arch}.attention.key_length": (4, head_dim), f"{arch}.vocab_size": (4, cfg["vocab_size"]),
        f"{arch}.attention.layer_norm_rms_epsilon": (6, float(np.float32(cfg["rms_norm_eps"]))),
        f"{arch}.rope.freq_base": (6, float(np.float32(cfg.get("rope_theta", 10000.0)))),
    }
    for k, (t, v) in want_kv.items():
        if kv.get(k) != (t, v):
            problems.append(f"{k}: {kv.get(k)} in the file, expected {(t, v)}")

    # tensors
    hf = load_weights(model_dir)
    expected = {}
    for name, t in hf.items():
        if "rotary_emb" in name:
            continue
        expected[gguf_name(name)] = (name, t)
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        expected["rope_freqs.weight"] = (None, None)
    if set(expected) != set(tensors):
        problems.append(f"tensors: missing {sorted(set(expected) - set(tensors))}, extra {sorted(set(tensors) - set(expected))}")
    if cfg.get("tie_word_embeddings") and "output.weight" in tensors:
        problems.append("a tied model has output.weight")
    worst_q8 = 0.0
    for gname, (hname, t) in expected.items():
        if gname not in tensors:
            continue
        info = tensors[gname]
        if hname is None:  # rope_freqs
            got, _ = dequantize(info, data)
            want = llama3_rope_factors(cfg)
            if info["type"] != GGML_F32 or got.shape != want.shape or not np.allclose(got, want, rtol=2e-6, atol=0):
                problems.append(f"rope_freqs: {got} expected {want}")
            continue
        x = t.f32()
        matrix = t.dim() == 2 and not gname.endswith("_norm.weight")
        want_type = {"f32": GGML_F32, "f16": GGML_F16, "bf16": GGML_BF16, "q8_0": GGML_Q8_0}[outtype] if matrix else GGML_F32
        if want_type == GGML_Q8_0 and x.shape[-1] % 32:
            want_type = GGML_F16
        if info["type"] != want_type:
            problems.append(f"{gname}: type {TYPE_NAMES.get(info['type'], info['type'])}, expected {TYPE_NAMES[want_type]}")
            continue
        if list(reversed(info["dims"])) != list(x.shape):
            problems.append(f"{gname}: dims {info['dims']} (ggml order) for HF shape {list(x.shape)}")
            continue
        got, q8 = dequantize(info, data)
        if arch == "llama" and (".attn_q." in gname or ".attn_k." in gname):
            got = unpermute(got, n_head if ".attn_q." in gname else n_kv)
            if q8 is not None:
                d, q = q8
                q8 = None  # the bound is checked below on the permuted layout
                perm_x = permute_np(x, n_head if ".attn_q." in gname else n_kv)
                worst_q8 = max(worst_q8, q8_bound_problem(gname, perm_x, d, q, problems))
        xn = x  # f32: exact for f32, bf16 and f16 weights
        if want_type == GGML_F32:
            ok = np.array_equal(got, xn)
        elif want_type == GGML_BF16:
            ok = np.array_equal(got, bf16_rounded(t))
        elif want_type == GGML_F16:
            ok = np.array_equal(got, xn.astype(np.float16).astype(np.float32))  # numpy rounds to nearest even
        else:
            if q8 is not None:
                d, q = q8
                worst_q8 = max(worst_q8, q8_bound_problem(gname, xn, d, q, problems))
            ok = True
        if not ok:
            diff = np.abs(got.astype(np.float64) - xn).max()
            problems.append(f"{gname}: values differ from {hname} (max |diff| {diff:.3g})")

    # tokenizer
    e = expected_vocab(model_dir, cfg)
    if get("tokenizer.ggml.model") != e["model"]:
        problems.append(f"tokenizer.ggml.model {get('tokenizer.ggml.model')}, expected {e['model']}")
    if get("tokenizer.ggml.pre") != e["pre"]:
        problems.append(f"tokenizer.ggml.pre {get('tokenizer.ggml.pre')}, expected {e['pre']}")
    if arr("tokenizer.ggml.tokens") != e["tokens"]:
        got = arr("tokenizer.ggml.tokens") or []
        bad = [i for i in range(min(len(got), len(e["tokens"]))) if got[i] != e["tokens"][i]][:3]
        problems.append(f"tokenizer.ggml.tokens: {len(got)} tokens (expected {len(e['tokens'])}), first differences at {bad}")
    if arr("tokenizer.ggml.token_type") != e["types"]:
        got = arr("tokenizer.ggml.token_type") or []
        bad = [(i, got[i], e["types"][i]) for i in range(min(len(got), len(e["types"]))) if got[i] != e["types"][i]][:3]
        problems.append(f"tokenizer.ggml.token_type differs: {bad}")
    if kv.get("tokenizer.ggml.token_type", (9, (None,)))[1][1] != 5:
        problems.append("tokenizer.ggml.token_type is not an array of int32")
    if e["scores"] is not None:
        got = arr("tokenizer.ggml.scores")
        if got is None or not np.array_equal(np.array(got, dtype=np.float32), np.array(e["scores"], dtype=np.float32)):
            problems.append("tokenizer.ggml.scores differ")
        if get("tokenizer.ggml.add_space_prefix") != e["add_space_prefix"]:
            problems.append(f"add_space_prefix {get('tokenizer.ggml.add_space_prefix')}, expected {e['add_space_prefix']}")
    elif "tokenizer.ggml.scores" in kv:
        problems.append("a BPE vocabulary has scores")
    if e["merges"] is not None and arr("tokenizer.ggml.merges") != e["merges"]:
        problems.append(f"tokenizer.ggml.merges: {len(arr('tokenizer.ggml.merges') or [])} merges differ from the "
                        f"tokenizer.json's {len(e['merges'])}")
    if e["model"] == "llama" and "tokenizer.ggml.merges" in kv:
        problems.append("a SentencePiece vocabulary has merges")
    pad = cfg.get("pad_token_id", e.get("pad"))
    for key, want in (("bos_token_id", e["bos"]), ("eos_token_id", e["eos"]), ("unknown_token_id", e["unk"]),
                      ("padding_token_id", pad)):
        got = kv.get("tokenizer.ggml." + key)
        if (got is not None) if want is None else got != (4, want):
            problems.append(f"tokenizer.ggml.{key} {got}, expected {want}")
    if kv.get("tokenizer.ggml.add_bos_token") != (7, e["add_bos"]):
        problems.append(f"add_bos_token {kv.get('tokenizer.ggml.add_bos_token')}, expected {e['add_bos']}")
    if get("tokenizer.chat_template") != e["chat_template"]:
        problems.append("tokenizer.chat_template differs from tokenizer_config.json's")
    if not problems:
        types = {}
        for n in order:
            types[TYPE_NAMES[tensors[n]["type"]]] = types.get(TYPE_NAMES[tensors[n]["type"]], 0) + 1
        extra = f", worst Q8_0 error {worst_q8:.3g} of its block's bound" if outtype == "q8_0" else ""
        print(f"OK {path}: {arch}, {len(tensors)} tensors {types}, {len(kv)} keys, {len(e['tokens'])} tokens "
              f"({e['model']}/{e['pre']}){extra}")
    return problems


def permute_np(w, n_head):
    shape = w.shape
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def q8_bound_problem(name, x, d, q, problems):
    """Checks Q8_0 blocks of x (row-major, as stored) against their scales d [nb, 1] and codes q [nb, 32]:
    the scale is f16(max|x| / 127) computed in f32, and |x - d q| <= d_exact / 2 + 127 |d - d_exact|.
    Returns the worst error as a fraction of its bound."""
    xb = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    d_exact = (amax / np.float32(127)).astype(np.float32)
    if not np.array_equal(d_exact.astype(np.float16).astype(np.float64), d):
        problems.append(f"{name}: Q8_0 scales are not f16(max|x| / 127)")
        return 0.0
    if np.abs(q).max() > 127:
        problems.append(f"{name}: Q8_0 code beyond +-127")
    err = np.abs(xb.astype(np.float64) - d * q)
    bound = d_exact.astype(np.float64) / 2 + 127 * np.abs(d - d_exact) + 1e-12
    if (err > bound).any():
        problems.append(f"{name}: Q8_0 error {err.max():.3g} beyond its block's bound")
    return float((err / bound).max())


def tiktoken_merges(ranks):
    """The merges that encode as tiktoken's ranks do: every split of every multi-byte token into two
    tokens, by the token's rank, then the parts' ranks (transformers' TikTokenConverter)."""
    spelled = {bs: spell(bs) for bs in ranks}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        splits = sorted((ranks[token[:i]], ranks[token[i:]], token[:i], token[i:]) for i in range(1, len(token))
                        if token[:i] in ranks and token[i:] in ranks)
        merges += [spelled[l] + " " + spelled[r] for _, _, l, r in splits]
    return merges


# ---- helpers for the test script -------------------------------------------------------------------
def perturb(model_dir):
    """Norm weights and biases are ones and zeros in a fresh model: make them random, so a check can fail."""
    path = os.path.join(model_dir, "model.safetensors")
    tensors, meta = st_load(path)
    rng = np.random.default_rng(7)
    for k, w in tensors.items():
        if w.dim() == 1:
            v = (rng.standard_normal(w.array.shape) * 0.5 + 1).astype(np.float32)
            if w.dtype == "BF16":
                a = (v.view(np.uint32) >> 16).astype(np.uint16)  # values that are bf16 already
            else:
                a = v.astype(ST_DTYPES[w.dtype])
            tensors[k] = Weight(w.dtype, a)
    st_save(path, tensors, meta)


def qwen2_tokenizer(out_dir, vocab_path, merges_path, n):
    """GPT-2's first n merges and the tokens they make, with Qwen2's pre-tokenizer and special tokens."""
    vocab = json.load(open(vocab_path))
    lines = [l for l in open(merges_path, encoding="utf-8").read().splitlines() if l and not l.startswith("#version")][:n]
    keep = {t: i for t, i in vocab.items() if i < 256 + n}
    for l in lines:
        assert "".join(l.split(" ")) in keep, l
    added = [{"id": 256 + n + k, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for k, c in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])]
    tj = {"version": "1.0", "added_tokens": added, "normalizer": {"type": "NFC"},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
              {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
          "decoder": {"type": "ByteLevel"},
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False,
                    "vocab": keep, "merges": [l.split(" ") for l in lines]}}
    json.dump(tj, open(os.path.join(out_dir, "tokenizer.json"), "w"), ensure_ascii=False)
    tc = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
          "chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                           "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"}
    json.dump(tc, open(os.path.join(out_dir, "tokenizer_config.json"), "w"))


def edit(model_dir, how, name):
    path = os.path.join(model_dir, "model.safetensors")
    tensors, meta = st_load(path)
    if how == "drop":
        del tensors[name]
    else:
        w = tensors[name]
        tensors[name] = Weight(w.dtype, w.array.reshape(-1)[:-1])
    st_save(path, tensors, meta)


def unpermuted_copy(path, out, name, n_head):
    """A copy of an F32 GGUF file whose tensor `name` holds its rows as Hugging Face has them (as if
    the exporter had not permuted them): the check must catch it."""
    kv, tensors, order, data = read_gguf(path)
    info = tensors[name]
    assert info["type"] == GGML_F32
    buf = bytearray(data)
    w = np.frombuffer(bytes(buf[info["start"]:info["start"] + info["nbytes"]]), dtype="<f4")
    w = w.reshape(tuple(reversed(info["dims"])))
    buf[info["start"]:info["start"] + info["nbytes"]] = unpermute(w, n_head).astype("<f4").tobytes()
    open(out, "wb").write(buf)


def run_checks(triples):
    bad = 0
    for model_dir, path, outtype in triples:
        try:
            problems = check(model_dir, path, outtype)
        except Exception as ex:  # a file the reader cannot parse is a failure, not a crash
            problems = [f"cannot read: {type(ex).__name__}: {ex}"]
        for p in problems:
            print(f"{path}: {p}")
        bad += bool(problems)
    return bad


def main(argv):
    if len(argv) >= 4 and argv[0] == "check":
        # check MODEL FILE OUTTYPE ... [--tamper MODEL FILE.f32 TENSOR N_HEAD]: the last re-checks an
        # unpermuted copy of TENSOR and fails unless exactly that tensor is reported.
        args, tamper = argv[1:], None
        if "--tamper" in args:
            k = args.index("--tamper")
            args, tamper = args[:k], args[k + 1:]
        if len(args) % 3:
            print(__doc__)
            return 2
        bad = run_checks([args[i:i + 3] for i in range(0, len(args), 3)])
        if tamper:
            model_dir, path, name, n_head = tamper
            unpermuted_copy(path, path + ".unpermuted", name, int(n_head))
            problems = check(model_dir, path + ".unpermuted", "f32")
            if len(problems) != 1 or not problems[0].startswith(f"{name}: values differ"):
                print(f"the unpermuted {name} was not caught as expected: {problems}")
                bad += 1
            else:
                print(f"OK caught: {problems[0]}")
        return 1 if bad else 0
    if len(argv) == 4 and argv[0] == "prepare":
        # prepare WORK GPT2_VOCAB GPT2_MERGES: WORK/{l3,l2,ms,q2} made by shardlm init get random norms
        # and biases, q2 a Qwen2-style tokenizer; WORK/drop and WORK/shape are broken copies of q2.
        work = argv[1]
        qwen2_tokenizer(os.path.join(work, "q2"), argv[2], argv[3], 200)
        for m in ("l3", "l2", "ms", "q2"):
            perturb(os.path.join(work, m))
        import shutil
        for copy, how, name in (("drop", "drop", "model.layers.1.mlp.up_proj.weight"),
                                ("shape", "reshape", "model.layers.0.self_attn.k_proj.weight")):
            shutil.copytree(os.path.join(work, "q2"), os.path.join(work, copy))
            edit(os.path.join(work, copy), how, name)
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
