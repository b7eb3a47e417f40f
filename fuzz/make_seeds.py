#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/ (checked in; rerun only to change them).

Each seed is a small valid input of its format, so mutations start from files that get deep into
the loaders. The checkpoint seed is not made here: scripts/fuzz.sh adds the metadata.json of the
checkpoint it trains. Usage: fuzz/make_seeds.py (from anywhere).
"""
import base64
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(ROOT, target, name), "wb") as f:
        f.write(data)


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, offset, blob = {}, 0, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blob += raw
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob


put("safetensors", "f32_bf16", safetensors([
    ("model.embed_tokens.weight", "F32", [2, 3], struct.pack("<6f", *range(6))),
    ("model.norm.weight", "BF16", [4], b"\x80\x3f" * 4),
    ("lm_head.weight", "F16", [2, 2], b"\x00\x3c" * 4),
], {"format": "pt"}))
put("safetensors", "foreign_dtypes", safetensors([
    ("a", "I64", [2], struct.pack("<2q", 1, -1)),
    ("b", "U8", [3], b"\x01\x02\x03"),
    ("scalar", "F32", [], struct.pack("<f", 1.5)),
    ("empty", "F32", [0, 4], b""),
]))

llama3 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "bos_token_id": 1, "eos_token_id": [2, 3], "torch_dtype": "bfloat16",
}
put("model_config", "llama3.json", json.dumps(llama3, indent=1))
mistral = dict(llama3, architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=4096,
               rope_scaling=None, tie_word_embeddings=False, eos_token_id=2)
put("model_config", "mistral.json", json.dumps(mistral))
qwen2 = dict(llama3, architectures=["Qwen2ForCausalLM"], model_type="qwen2", rope_scaling=None,
             use_sliding_window=False, eos_token_id=2)
put("model_config", "qwen2.json", json.dumps(qwen2))
bnb = dict(mistral, architectures=["LlamaForCausalLM"], model_type="llama", quantization_config={
    "quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8"})
put("model_config", "bnb_nf4.json", json.dumps(bnb))

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for name in sorted(os.listdir(os.path.join(repo, "configs"))):
    with open(os.path.join(repo, "configs", name)) as f:
        put("train_config", name, f.read() + "\0max_steps=3\nsharding_strategy=FULL_SHARD\nlr=1e-4")
put("train_config", "inline.yaml", """model: m
output_dir: out
data:
  train: data.jsonl
  format: alpaca
micro_batch_size: 2
gradient_accumulation_steps: 2
fsdp_config:
  fsdp_sharding_strategy: HYBRID_SHARD
  fsdp_activation_checkpointing: true
lora:
  r: 8
  lora_alpha: 16
  target_modules: [q_proj, v_proj]
save_every: 10
on_nonfinite: skip
\0data.seq_len=64
lora.r=4""")


with open(os.path.join(repo, "configs", "ds_z3.json")) as f:
    put("deepspeed_config", "ds_z3.json", f.read())
put("deepspeed_config", "explicit.json", json.dumps({
    "train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0, "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10,
                                                        "warmup_min_ratio": 0.01, "cos_min_ratio": 0.1}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "overlap_comm": True}}, indent=1))


# GPT-2's byte-to-unicode table: printable bytes stand for themselves, the rest shift to U+0100.
def byte_chars():
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


bc = byte_chars()
vocab = {bc[b]: b for b in range(256)}
merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "w")]
for a, b in merges:
    vocab[a + b] = len(vocab)
tok_json = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": len(vocab), "content": "<|begin_of_text|>", "special": True},
                     {"id": len(vocab) + 1, "content": "<|eot_id|>", "special": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    "post_processor": None, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "ignore_merges": True,
              "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
}
put("tokenizer_json", "llama3_style.json", json.dumps(tok_json))
gpt2_style = dict(tok_json, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
                  added_tokens=[{"id": len(vocab), "content": "<|endoftext|>", "special": True}])
gpt2_style["model"] = dict(tok_json["model"], ignore_merges=False, merges=[[a, b] for a, b in merges])
put("tokenizer_json", "gpt2_style.json", json.dumps(gpt2_style))

ranks = [bytes([b]) for b in range(256)] + [b" t", b"he", b" the", b"in", b" w"]
put("tiktoken", "small.model", "".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))

put("gpt2_bpe", "small", json.dumps(vocab) + "\0#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))

alpaca = [{"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
          {"instruction": "Say hi.", "input": "", "output": "Hi!"}]
put("instruct", "alpaca_array", b"\x20" + json.dumps(alpaca, indent=1).encode())
put("instruct", "alpaca_jsonl", b"\x05" + "".join(json.dumps(r) + "\n" for r in alpaca).encode())
chat = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
                      {"role": "assistant", "content": "6"}]}]
put("instruct", "chat_jsonl", b"\x62" + "".join(json.dumps(r) + "\n" for r in chat).encode())
put("instruct", "chat_truncated", b"\x6b" + "".join(json.dumps(r) + "\n" for r in chat).encode())
put("instruct", "question_column", b"\x30" + json.dumps([{"question": "Why?", "output": "Because."}]).encode())
