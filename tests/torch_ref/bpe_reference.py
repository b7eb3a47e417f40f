#!/usr/bin/env python3
"""Independent pure-Python reference for shardlm's byte-level BPE tokenizers (tests/test_bpe.cpp).

Two textbook algorithms, written from their original sources rather than from shardlm's code:
  * tiktoken (Llama 3): regex pre-tokens; a pre-token that is itself a token is emitted whole,
    otherwise its bytes are merged by repeatedly joining the adjacent pair whose concatenation
    has the lowest rank (leftmost on ties), as tiktoken's _byte_pair_merge does.
  * GPT-2 (OpenAI's encoder.py): regex pre-tokens mapped to the byte-to-unicode alphabet, then
    repeatedly the lowest-ranked merge (by its line in merges.txt) is applied to every
    occurrence, left to right.
Pre-tokenization uses the `regex` module (Debian: python3-regex), which knows \\p{L} and \\p{N}.

Usage:
  bpe_reference.py digest   DATA_DIR   # per tokenizer: texts, tokens, FNV-1a digest of all ids
  bpe_reference.py dump     DATA_DIR OUT.jsonl   # ids of every Alpaca text, one JSON line each
  bpe_reference.py encode   DATA_DIR TEXT...     # ids of each TEXT for both tokenizers
The digest is what test_bpe.cpp compares against; `dump` helps find the first differing text.
"""
import base64
import json
import sys

import regex

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


class Tiktoken:
    def __init__(self, path):
        self.ranks = {}
        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    token, rank = line.split()
                    self.ranks[base64.b64decode(token)] = int(rank)
        self.pat = regex.compile(LLAMA3_PATTERN)

    def _merge(self, piece):
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            best, best_rank = None, None
            for i in range(len(parts) - 1):
                r = self.ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is None:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        return [self.ranks[p] for p in parts]

    def encode(self, text):
        ids = []
        for m in self.pat.finditer(text):
            piece = m.group().encode("utf-8")
            if piece in self.ranks:
                ids.append(self.ranks[piece])
            else:
                ids.extend(self._merge(piece))
        return ids


def bytes_to_unicode():
    # As in OpenAI's gpt-2/src/encoder.py.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


class Gpt2:
    def __init__(self, vocab_path, merges_path):
        with open(vocab_path, encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(merges_path, encoding="utf-8") as f:
            lines = f.read().split("\n")[1:-1]
        self.bpe_ranks = {tuple(l.split()): i for i, l in enumerate(lines)}
        self.byte_encoder = bytes_to_unicode()
        self.pat = regex.compile(GPT2_PATTERN)
        self.cache = {}

    def _bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            bigram = min(pairs, key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
        self.cache[token] = word
        return word

    def encode(self, text):
        ids = []
        for m in self.pat.finditer(text):
            token = "".join(self.byte_encoder[b] for b in m.group().encode("utf-8"))
            ids.extend(self.encoder[t] for t in self._bpe(token))
        return ids


def alpaca_texts(data_dir):
    with open(f"{data_dir}/alpaca_en_demo.json", encoding="utf-8") as f:
        records = json.load(f)
    return [r[k] for r in records for k in ("instruction", "input", "output")]


def fnv1a(all_ids):
    # 64-bit FNV-1a over each id's 4 little-endian bytes; 0xFFFFFFFF closes each text.
    h = 0xcbf29ce484222325
    for ids in all_ids:
        for v in list(ids) + [0xFFFFFFFF]:
            for b in (v & 0xFFFFFFFF).to_bytes(4, "little"):
                h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    mode, data_dir = sys.argv[1], sys.argv[2]
    toks = {"llama3": Tiktoken(f"{data_dir}/llama3_tokenizer.model"),
            "gpt2": Gpt2(f"{data_dir}/gpt2_vocab.json", f"{data_dir}/gpt2_merges.txt")}
    if mode == "encode":
        for text in sys.argv[3:]:
            for name, tok in toks.items():
                print(name, json.dumps(text), tok.encode(text))
        return
    texts = alpaca_texts(data_dir)
    results = {name: [tok.encode(t) for t in texts] for name, tok in toks.items()}
    if mode == "digest":
        for name, all_ids in results.items():
            print(f"{name}: texts {len(texts)} tokens {sum(map(len, all_ids))} "
                  f"digest 0x{fnv1a(all_ids):016x}")
    elif mode == "dump":
        with open(sys.argv[3], "w", encoding="utf-8") as f:
            for i, t in enumerate(texts):
                f.write(json.dumps({"i": i, "llama3": results["llama3"][i],
                                    "gpt2": results["gpt2"][i]}) + "\n")
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
