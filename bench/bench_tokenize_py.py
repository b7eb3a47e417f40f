#!/usr/bin/python3
"""Python sentencepiece's encoding speed on the Alpaca demo records, for comparison with
bench_tokenize (same texts, same repetitions, same JSON fields).

Owner: the SentencePiece tokenizer work.

    /usr/bin/python3 bench/bench_tokenize_py.py --sentencepiece FILE --alpaca FILE [--reps N]

Encodes every non-empty field (instruction, input, output) of every record, one sp.encode call
per text as bench_tokenize does, N times (default 5), and prints one JSON line from the best pass.
"""
import argparse
import json
import time

import sentencepiece as spm


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentencepiece", required=True)
    ap.add_argument("--alpaca", required=True)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    sp = spm.SentencePieceProcessor(model_file=a.sentencepiece)
    with open(a.alpaca, encoding="utf-8") as f:
        records = json.load(f)
    texts = [r[k] for r in records for k in ("instruction", "input", "output") if r.get(k)]
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    best, tokens = float("inf"), 0
    for _ in range(max(1, a.reps)):
        t0 = time.perf_counter()
        tokens = sum(len(sp.encode(t)) for t in texts)
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({
        "impl": "python-sentencepiece " + spm.__version__, "tokenizer": "sentencepiece", "kind": "sentencepiece",
        "records": len(records), "texts": len(texts), "bytes": nbytes, "tokens": tokens, "reps": a.reps,
        "best_s": round(best, 4), "records_per_s": round(len(records) / best, 1),
        "mb_per_s": round(nbytes / 1e6 / best, 2), "tokens_per_s": round(tokens / best),
    }))


if __name__ == "__main__":
    main()
