"""A PyTorch reference for Hugging Face's LlamaForCausalLM (and Mistral / Qwen2), written out.

transformers is not installed here, so this module re-implements the eager (non-flash, non-SDPA)
path of transformers' modeling_llama.py with the same operations in the same order and the same
dtypes, so that a float32 model here computes what HF computes in float32:

  LlamaRMSNorm      h = x.float(); h = h * rsqrt(mean(h^2) + eps); w * h.to(x.dtype)
  rotary            inv_freq = 1 / theta^(arange(0, Dh, 2) / Dh) (llama3-rescaled when asked);
                    freqs = inv_freq @ positions (float32), emb = cat(freqs, freqs), cos/sin;
                    q * cos + rotate_half(q) * sin
  attention         GQA by repeat_kv (query head h reads kv head h // (H / Hkv)),
                    scores = q k^T * head_dim^-0.5, masked, softmax in float32, @ v, o_proj
  MLP               down(silu(gate(x)) * up(x))
  decoder layer     x + attn(norm1(x)), then x + mlp(norm2(x)); final norm; lm_head

Two things beyond HF's forward, both used by shardlm's packed-sequence training:
  position_ids [B, T]  positions for RoPE (default arange(T) per row, as HF);
  segment_ids  [B, T]  packed sequences: a query attends only to keys of its own segment (and
                       causally), i.e. HF's causal mask intersected with seg[q] == seg[k].

Parameter names (state_dict keys) are exactly HF's: model.embed_tokens.weight,
model.layers.{i}.{input_layernorm,post_attention_layernorm}.weight,
model.layers.{i}.self_attn.{q,k,v,o}_proj.{weight,bias}, model.layers.{i}.mlp.{gate,up,down}_proj.weight,
model.norm.weight and lm_head.weight. With tie_word_embeddings there is no lm_head module at all:
the logits use model.embed_tokens.weight, so lm_head.weight is neither a parameter nor a key.

In float64 (used for gradcheck) the float32 up-casts of RMSNorm, softmax and the logits keep float64
instead of rounding to float32; float32 and bfloat16 behave exactly as in HF.

Usage:
    import llama_ref
    model, config = llama_ref.load_hf_dir("path/to/hf_dir")   # float32, strict keys
    logits = model(ids, position_ids=None, segment_ids=None)  # [B, T, V]
    loss = llama_ref.Llama.loss(logits, targets)                # targets already aligned, -100 ignored
"""
import json
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


def _upcast(x):
    """x.float() as HF does it, except that float64 stays float64 (for gradcheck)."""
    return x if x.dtype == torch.float64 else x.float()


# ---------------------------------------------------------------------------------------------
# Configuration


def normalize_config(cfg):
    """Resolves a config.json dict into the fields the model uses (a plain dict), with HF's
    defaults, and rejects what this reference (like shardlm) does not implement."""
    archs = cfg.get("architectures") or ["LlamaForCausalLM"]
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch!r} (supported: {', '.join(ARCHITECTURES)})")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported hidden_act {act!r} (only silu)")
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = cfg.get("num_key_value_heads")
    kv_heads = heads if kv_heads is None else int(kv_heads)
    head_dim = cfg.get("head_dim")
    head_dim = hidden // heads if head_dim is None else int(head_dim)
    if heads % kv_heads != 0:
        raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim {head_dim} is odd")

    # RoPE: classic keys (rope_theta, rope_scaling), or transformers v5's rope_parameters.
    rope_theta = cfg.get("rope_theta")
    rope_scaling = cfg.get("rope_scaling")
    rope_params = cfg.get("rope_parameters")
    if isinstance(rope_params, dict):
        if rope_theta is None:
            rope_theta = rope_params.get("rope_theta")
        if rope_scaling is None:
            rope_scaling = rope_params
    rope_theta = 10000.0 if rope_theta is None else float(rope_theta)
    scaling = None
    if rope_scaling is not None:
        kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
        if kind == "llama3":
            scaling = {
                "rope_type": "llama3",
                "factor": float(rope_scaling["factor"]),
                "low_freq_factor": float(rope_scaling["low_freq_factor"]),
                "high_freq_factor": float(rope_scaling["high_freq_factor"]),
                "original_max_position_embeddings": int(rope_scaling["original_max_position_embeddings"]),
            }
        elif kind not in (None, "default"):
            raise ValueError(f"unsupported rope_scaling type {kind!r} (only llama3)")

    # Biases: Qwen2 has them on q, k, v; Llama's attention_bias puts them on q, k, v and o.
    if arch == "Qwen2ForCausalLM":
        qkv_bias, o_bias = True, False
    elif arch == "LlamaForCausalLM":
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
    else:
        qkv_bias = o_bias = False
    mlp_bias = bool(cfg.get("mlp_bias", False)) if arch == "LlamaForCausalLM" else False

    # Sliding-window attention (HF eager mask: key k visible from query q iff q - k < window).
    layers = int(cfg["num_hidden_layers"])
    window = [0] * layers
    sw = cfg.get("sliding_window")
    if arch == "MistralForCausalLM" and sw:
        window = [int(sw)] * layers
    elif arch == "Qwen2ForCausalLM" and sw and cfg.get("use_sliding_window", False):
        first = int(cfg.get("max_window_layers", 28))
        window = [int(sw) if i >= first else 0 for i in range(layers)]

    return {
        "architecture": arch,
        "vocab_size": int(cfg["vocab_size"]),
        "hidden_size": hidden,
        "intermediate_size": int(cfg["intermediate_size"]),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "rope_theta": rope_theta,
        "rope_scaling": scaling,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "qkv_bias": qkv_bias,
        "o_bias": o_bias,
        "mlp_bias": mlp_bias,
        "sliding_window": window,
        "initializer_range": float(cfg.get("initializer_range", 0.02)),
    }


# ---------------------------------------------------------------------------------------------
# Rotary embeddings (transformers.modeling_rope_utils and LlamaRotaryEmbedding)


def default_inv_freq(base, dim):
    """_compute_default_rope_parameters."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3_inv_freq(base, dim, factor, low_freq_factor, high_freq_factor, old_context_len):
    """_compute_llama3_parameters: wavelengths longer than old_context_len / low_freq_factor are
    divided by factor, shorter than old_context_len / high_freq_factor kept, smoothed between."""
    inv_freq = default_inv_freq(base, dim)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def inv_freq_for(config):
    c = config
    s = c["rope_scaling"]
    if s is None:
        return default_inv_freq(c["rope_theta"], c["head_dim"])
    return llama3_inv_freq(c["rope_theta"], c["head_dim"], s["factor"], s["low_freq_factor"],
                           s["high_freq_factor"], s["original_max_position_embeddings"])


class RotaryEmbedding(nn.Module):
    """LlamaRotaryEmbedding: cos, sin [B, T, Dh] from position_ids [B, T]. attention_scaling is 1.0
    for the default and llama3 rope types."""

    def __init__(self, config):
        super().__init__()
        self.register_buffer("inv_freq", inv_freq_for(config), persistent=False)
        self.attention_scaling = 1.0

    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    """q, k [B, heads, T, Dh]; cos, sin [B, T, Dh]."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def repeat_kv(hidden_states, n_rep):
    """[B, Hkv, T, Dh] -> [B, Hkv * n_rep, T, Dh], each kv head repeated n_rep times in place
    (the same as repeat_interleave(n_rep, dim=1))."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def attention_mask(batch, seq, segment_ids=None, sliding_window=0, device=None):
    """Boolean [B, 1, T, T], True where query q may attend to key k: k <= q, the same segment when
    segment_ids is given, and q - k < sliding_window when that is positive."""
    q = torch.arange(seq, device=device).view(seq, 1)
    k = torch.arange(seq, device=device).view(1, seq)
    allowed = k <= q
    if sliding_window and sliding_window > 0:
        allowed = allowed & (q - k < sliding_window)
    allowed = allowed.view(1, 1, seq, seq).expand(batch, 1, seq, seq)
    if segment_ids is not None:
        allowed = allowed & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    return allowed


# ---------------------------------------------------------------------------------------------
# Modules (parameters are created uninitialized; Llama.init_weights or a state dict fills them)


class Linear(nn.Module):
    """nn.Linear without its (slow, global-RNG) initialization: y = x W^T + b."""

    def __init__(self, in_features, out_features, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    def __init__(self, num, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, dim))

    def forward(self, ids):
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    """LlamaRMSNorm."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = _upcast(hidden_states)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Attention(nn.Module):
    """LlamaAttention with eager_attention_forward (no dropout: attention_dropout is 0)."""

    def __init__(self, c, layer_idx):
        super().__init__()
        self.num_heads = c["num_attention_heads"]
        self.num_kv_heads = c["num_key_value_heads"]
        self.head_dim = c["head_dim"]
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.scaling = self.head_dim ** -0.5
        self.sliding_window = c["sliding_window"][layer_idx]
        h = c["hidden_size"]
        self.q_proj = Linear(h, self.num_heads * self.head_dim, c["qkv_bias"])
        self.k_proj = Linear(h, self.num_kv_heads * self.head_dim, c["qkv_bias"])
        self.v_proj = Linear(h, self.num_kv_heads * self.head_dim, c["qkv_bias"])
        self.o_proj = Linear(self.num_heads * self.head_dim, h, c["o_bias"])

    def forward(self, hidden_states, cos, sin, segment_ids=None):
        bsz, seq = hidden_states.shape[:2]
        hidden_shape = (bsz, seq, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        key_states = repeat_kv(key_states, self.num_key_value_groups)
        value_states = repeat_kv(value_states, self.num_key_value_groups)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * self.scaling
        # HF adds a mask of 0 / finfo.min; masked_fill with finfo.min gives identical probabilities
        # (exp underflows to exactly 0) and leaves the allowed scores bit-identical.
        allowed = attention_mask(bsz, seq, segment_ids, self.sliding_window, hidden_states.device)
        attn_weights = attn_weights.masked_fill(~allowed, torch.finfo(attn_weights.dtype).min)
        softmax_dtype = torch.float64 if query_states.dtype == torch.float64 else torch.float32
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=softmax_dtype).to(query_states.dtype)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(bsz, seq, -1).contiguous()
        return self.o_proj(attn_output)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, f, b = c["hidden_size"], c["intermediate_size"], c["mlp_bias"]
        self.gate_proj = Linear(h, f, b)
        self.up_proj = Linear(h, f, b)
        self.down_proj = Linear(f, h, b)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c, layer_idx):
        super().__init__()
        self.self_attn = Attention(c, layer_idx)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, hidden_states, cos, sin, segment_ids=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, cos, sin, segment_ids)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states


class Model(nn.Module):
    """LlamaModel: embed_tokens, layers, norm (and the rotary embedding, which has no parameters)."""

    def __init__(self, c):
        super().__init__()
        self.embed_tokens = Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.rotary_emb = RotaryEmbedding(c)

    def forward(self, input_ids, position_ids, segment_ids=None):
        hidden_states = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, cos, sin, segment_ids)
        return self.norm(hidden_states)


class Llama(nn.Module):
    """LlamaForCausalLM (also Mistral and Qwen2) from a config.json dict.

    Llama(config, init=True, seed=0): with init, the weights are drawn as HF's _init_weights does
    (normal(0, initializer_range) for linear and embedding weights, zero biases, unit norms) from a
    generator seeded with seed; with init=False they stay uninitialized for a state dict to fill.
    """

    def __init__(self, config, init=True, seed=0):
        super().__init__()
        self.hf_config = dict(config)
        self.config = c = normalize_config(config)
        self.model = Model(c)
        if not c["tie_word_embeddings"]:
            self.lm_head = Linear(c["hidden_size"], c["vocab_size"], False)
        else:
            self.lm_head = None
        if init:
            self.init_weights(seed)

    def lm_head_weight(self):
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @torch.no_grad()
    def init_weights(self, seed=0, std=None):
        std = self.config["initializer_range"] if std is None else std
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif is_norm_param(self, name):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(std).to(p.dtype))
        return self

    def forward(self, ids, position_ids=None, segment_ids=None):
        """ids [B, T] (any integer dtype) -> logits [B, T, V] (float32, or float64 for a float64
        model). position_ids default to arange(T) in every row; segment_ids (packed sequences)
        restrict attention to keys of the same segment."""
        ids = ids.long()
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        bsz, seq = ids.shape
        if position_ids is None:
            position_ids = torch.arange(seq, device=ids.device).unsqueeze(0).expand(bsz, seq)
        position_ids = position_ids.long().reshape(bsz, seq)
        if segment_ids is not None:
            segment_ids = segment_ids.long().reshape(bsz, seq)
        hidden_states = self.model(ids, position_ids, segment_ids)
        if self.lm_head is None:
            logits = F.linear(hidden_states, self.model.embed_tokens.weight)
        else:
            logits = self.lm_head(hidden_states)
        return _upcast(logits)

    @staticmethod
    def loss(logits, targets):
        """Mean cross entropy over the positions whose target is not -100. targets [B, T] are already
        aligned with logits [B, T, V] (targets[b, t] is the token to predict at t; no shift here)."""
        return F.cross_entropy(_upcast(logits).reshape(-1, logits.shape[-1]), targets.reshape(-1).long(),
                               ignore_index=-100)


# ---------------------------------------------------------------------------------------------
# Weight decay groups


def is_norm_param(model, name):
    """True for the weights of RMSNorm modules (input_layernorm, post_attention_layernorm, norm)."""
    module_name = name.rsplit(".", 1)[0]
    return isinstance(model.get_submodule(module_name), RMSNorm)


def decay_param_names(model):
    """Names (HF's) of the parameters that get weight decay: every weight (embedding, projections,
    lm_head) except the norm weights, and no bias -- HF Trainer's rule, and shardlm's."""
    return [name for name, _ in model.named_parameters()
            if not name.endswith(".bias") and not is_norm_param(model, name)]


def param_groups(model, weight_decay):
    """AdamW parameter groups: [{decay params, weight_decay}, {the rest, 0.0}], in named_parameters
    order."""
    decay = set(decay_param_names(model))
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]


# ---------------------------------------------------------------------------------------------
# Hugging Face model directories


def _safetensors():
    import sys
    if HERE not in sys.path:
        sys.path.append(HERE)
    import safetensors_check
    return safetensors_check


def read_hf_state(path):
    """All tensors of a model directory: model.safetensors, or the shards that
    model.safetensors.index.json lists."""
    st = _safetensors()
    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(single):
        return dict(st.load(single))
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        state = {}
        for shard in sorted(set(weight_map.values())):
            tensors = st.load(os.path.join(path, shard))
            for key, value in tensors.items():
                if key in state:
                    raise ValueError(f"{path}: tensor {key} appears in more than one shard")
                if weight_map.get(key) != shard:
                    raise ValueError(f"{path}/{shard}: tensor {key} is not mapped to this shard by the index")
                state[key] = value
        missing = sorted(set(weight_map) - set(state))
        if missing:
            raise ValueError(f"{path}: index lists tensors no shard holds: {missing[:5]}")
        return state
    raise FileNotFoundError(f"{path}: neither model.safetensors nor model.safetensors.index.json")


def load_hf_dir(path, dtype=torch.float32):
    """(model, config dict) from a Hugging Face model directory. The state dict must match the
    model's parameter names exactly (missing or unexpected keys raise), with one allowance: a tied
    model's file may also carry lm_head.weight if it equals model.embed_tokens.weight."""
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    model = Llama(config, init=False)
    state = read_hf_state(path)
    if model.lm_head is None and "lm_head.weight" in state:
        emb = state.get("model.embed_tokens.weight")
        if emb is None or not torch.equal(state["lm_head.weight"].float(), emb.float()):
            raise ValueError(f"{path}: tie_word_embeddings is set but lm_head.weight differs from the embedding")
        del state["lm_head.weight"]
    expected = dict(model.named_parameters())
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path}: state dict mismatch: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for name, p in expected.items():
            t = torch.as_tensor(state[name])
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"{path}: {name} has shape {tuple(t.shape)}, expected {tuple(p.shape)}")
            p.copy_(t.to(torch.float32))
    return model.to(dtype), config
