#!/usr/bin/env python3
"""Checks that a server split over ranks answered what one process answered (device_map_cli.sh,
tensor_parallel_cli.sh; the answers are ask_server's in serve_common.sh).

In WORK, A and B name the two servers' answers: A.json / B.json, a completion with logprobs and
echo: the same text and tokens, and every logprob (prompt and completion, chosen and top) within
1e-5 relative; A.sse / B.sse, a streamed completion: the same text; A.batch / B.batch, a request
of 4 prompts: the same 4 texts. Prints one line; exits non-zero on a difference.

Usage: same_completions.py WORK A B WHAT
"""
import json
import sys

work, a_name, b_name, what = sys.argv[1:5]


def load(name, ext):
    return json.load(open(f"{work}/{name}.{ext}"))


a, b = (load(n, "json")["choices"][0] for n in (a_name, b_name))
assert a["text"] == b["text"] and len(a["text"]) > len("hello there"), (a["text"], b["text"])
la, lb = a["logprobs"], b["logprobs"]
assert la["tokens"] == lb["tokens"], (la["tokens"], lb["tokens"])
worst, n = 0.0, 0
for x, y in zip(la["token_logprobs"], lb["token_logprobs"]):
    if x is None:
        assert y is None
        continue
    worst, n = max(worst, abs(x - y) / max(abs(x), 1e-3)), n + 1
for ta, tb in zip(la["top_logprobs"], lb["top_logprobs"]):
    if ta is None:
        continue
    assert ta.keys() == tb.keys(), (ta, tb)
    for k in ta:
        worst, n = max(worst, abs(ta[k] - tb[k]) / max(abs(ta[k]), 1e-3)), n + 1
assert n > 20 and worst <= 1e-5, f"{n} logprobs, largest relative difference {worst:.2e}"


def streamed(name):
    return "".join(json.loads(l[6:])["choices"][0]["text"] for l in open(f"{work}/{name}.sse") if l.startswith("data: {"))


sa, sb = streamed(a_name), streamed(b_name)
assert sa == sb and sa, (sa, sb)
ba, bb = ([c["text"] for c in load(n, "batch")["choices"]] for n in (a_name, b_name))
assert len(ba) == 4 and ba == bb, f"4 prompts at once: {ba!r} from one process, {bb!r} {what}"
print(f"serve {what} = one process: {a['text']!r}; {n} logprobs within {worst:.1e} relative; streamed {sb!r}; "
      f"4 prompts at once")
