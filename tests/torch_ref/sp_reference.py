#!/usr/bin/python3
"""SentencePiece reference ids for tests/test_sentencepiece.cpp.

Owner: the SentencePiece tokenizer work.

    sp_reference.py MODEL ALPACA_JSON OUT_JSON

Encodes every non-empty field (instruction, input, output) of every Alpaca record with python
sentencepiece (Debian's python3-sentencepiece, the same library version as libsentencepiece, but
reached through its own Python binding) and writes, in record order:

    {"model": ..., "cases": [{"record": i, "field": "input", "text": ..., "ids": [...],
                              "decoded": ...}, ...]}

`sp.encode(text)` is what Hugging Face's slow (legacy) LlamaTokenizer gives without BOS/EOS.
"""
import json
import sys

import sentencepiece as spm

FIELDS = ("instruction", "input", "output")


def main():
    model, alpaca, out = sys.argv[1:4]
    sp = spm.SentencePieceProcessor(model_file=model)
    with open(alpaca, encoding="utf-8") as f:
        records = json.load(f)
    cases = []
    for i, rec in enumerate(records):
        for field in FIELDS:
            text = rec.get(field, "")
            if not text:
                continue
            ids = sp.encode(text)
            cases.append({"record": i, "field": field, "text": text, "ids": ids, "decoded": sp.decode(ids)})
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"model": model, "cases": cases}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
