"""generate_bf16: what `shardlm generate --dtype bf16` means, computed independently of shardlm.

A small Llama (grouped-query attention, untied head) with random f32 weights; a prompt, then a few
decode steps of given tokens. `logits_bf16` [S + 1, V] are the logits after the prompt and after each
decode token when the weights are held in bf16 (every weight rounded to bf16 once, norms included)
and keys and values are rounded to bf16 as they are written to the KV cache (attention reads all of
them, the new ones included, from the cache); everything else (embedding lookup, norms, RoPE,
softmax, sums) is float64 math on those values. `logits_f32` are the same without any rounding.
The C++ side (tests/parity_generate.cpp) loads the f32 weights into a ParamStore and generates.
"""
import math

import torch

OP = "generate_bf16"


def config():
    return {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 100, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0}


def weights(c):
    D, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    qd = c["num_attention_heads"] * c["head_dim"]
    kvd = c["num_key_value_heads"] * c["head_dim"]
    w = {"model.embed_tokens.weight": torch.randn(V, D), "model.norm.weight": 1 + 0.2 * torch.randn(D),
         "lm_head.weight": torch.randn(V, D) * 0.2}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + 0.2 * torch.randn(D)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.2 * torch.randn(D)
        for name, shape in (("self_attn.q_proj", (qd, D)), ("self_attn.k_proj", (kvd, D)),
                            ("self_attn.v_proj", (kvd, D)), ("self_attn.o_proj", (D, qd)),
                            ("mlp.gate_proj", (F, D)), ("mlp.up_proj", (F, D)), ("mlp.down_proj", (D, F))):
            w[p + name + ".weight"] = torch.randn(*shape) * (0.4 / math.sqrt(shape[1]) * 2)
    return w


def generate(c, w, tokens, prompt_len, bf16):
    """Logits [len(tokens) - prompt_len + 1, V]: after the prompt, then after each further token."""
    rnd = (lambda t: t.bfloat16().double()) if bf16 else (lambda t: t.double())
    sd = {k: rnd(v) for k, v in w.items()}
    H, Hkv, Dh, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, Dh, 2, dtype=torch.float32) / Dh))

    def norm(x, g):
        return g * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    def rope(x, pos):  # x [Dh]: pairs (i, i + Dh/2) rotated by pos * inv_freq (a float32 product)
        angle = (torch.tensor(float(pos)) * inv).double()
        a, b = x[: Dh // 2], x[Dh // 2:]
        return torch.cat([a * torch.cos(angle) - b * torch.sin(angle), b * torch.cos(angle) + a * torch.sin(angle)])

    caches = [([], []) for _ in range(c["num_hidden_layers"])]
    out = []
    for pos, tok in enumerate(tokens):
        x = sd["model.embed_tokens.weight"][tok]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = norm(x, sd[p + "input_layernorm.weight"])
            q = sd[p + "self_attn.q_proj.weight"] @ h
            k = sd[p + "self_attn.k_proj.weight"] @ h
            v = sd[p + "self_attn.v_proj.weight"] @ h
            ks, vs = caches[i]
            ks.append(rnd(torch.cat([rope(k[g * Dh:(g + 1) * Dh], pos) for g in range(Hkv)])))
            vs.append(rnd(v))
            K, Vv = torch.stack(ks), torch.stack(vs)  # [pos + 1, Hkv * Dh]
            heads = []
            for hh in range(H):
                g = hh // (H // Hkv)
                qh = rope(q[hh * Dh:(hh + 1) * Dh], pos)
                s = K[:, g * Dh:(g + 1) * Dh] @ qh / math.sqrt(Dh)
                heads.append(torch.softmax(s, 0) @ Vv[:, g * Dh:(g + 1) * Dh])
            x = x + sd[p + "self_attn.o_proj.weight"] @ torch.cat(heads)
            h = norm(x, sd[p + "post_attention_layernorm.weight"])
            gate = sd[p + "mlp.gate_proj.weight"] @ h
            x = x + sd[p + "mlp.down_proj.weight"] @ (gate * torch.sigmoid(gate) * (sd[p + "mlp.up_proj.weight"] @ h))
        if pos + 1 >= prompt_len:
            out.append(sd["lm_head.weight"] @ norm(x, sd["model.norm.weight"]))
    return torch.stack(out).float()


def cases():
    c = config()
    w = weights(c)
    # A prompt of 5 (every matmul of its prefill a decode-sized one) and one of 12, then 4 tokens each.
    for prompt_len in (5, 12):
        tokens = torch.randint(0, c["vocab_size"], (prompt_len + 4,))
        arrays = {"tokens": tokens,
                  "logits_bf16": generate(c, w, tokens.tolist(), prompt_len, True),
                  "logits_f32": generate(c, w, tokens.tolist(), prompt_len, False)}
        arrays.update(w)
        yield f"prompt{prompt_len}", arrays, dict(c, prompt_len=prompt_len, steps=4, names=sorted(w))
