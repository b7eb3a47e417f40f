#!/usr/bin/env bash
# `shardlm serve` logprobs and echo (issue 32, docs/serving.md), checked against the independent
# PyTorch Llama (tests/torch_ref/llama_ref.py) on a tiny random model:
#  1. lm-eval-harness's local-completions loglikelihood request, as it sends it (a batch of prompts
#     as token ids, "max_tokens": 1, "echo": true, "logprobs": 1, "temperature": 0): every prompt
#     token's logprob (the first null) is log_softmax of the reference's logits within 1e-4, the
#     generated token is the reference's argmax and its position's most likely; lm-eval's own
#     reading of the answer (sum of the continuation's logprobs, is_greedy) matches the reference;
#  2. "max_tokens": 0 with echo scores the prompt alone (the same values);
#  3. a text prompt: the echoed text is the prompt's, the tokens' names add up to the text, the
#     offsets point at them; a streamed request carries the same logprobs, chunk by chunk;
#  4. chat logprobs / top_logprobs; greedy tokens are their position's most likely;
#  5. bad values: 400 naming the field.
# Usage: serve_logprobs.sh SHARDLM PYTHON WORKDIR TORCH_REF_DIR
set -euo pipefail
shardlm=$1
py=$2
work=$3
torch_ref=$4
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/serve_common.sh"

# initializer_range 0.5: logits far from uniform, so the most likely token is no near tie.
"$shardlm" init --preset tiny --set max_position_embeddings=64 --set initializer_range=0.5 --seed 4 \
  --out "$work/m" >/dev/null
"$shardlm" serve --model "$work/m" --port 0 --max-batch 3 --max-len 64 --chat-format llama2 2> "$work/serve.err" &
pid=$!
wait_listening serve

PYTHONPATH="$torch_ref" "$py" - "http://127.0.0.1:$port" "$work/m" <<'PY' || fail "logprobs check"
import json, sys, urllib.error, urllib.request
import torch
import llama_ref

url, model_dir = sys.argv[1], sys.argv[2]
torch.set_num_threads(2)
model, cfg = llama_ref.load_hf_dir(model_dir)
V = cfg["vocab_size"]

def post(path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode("utf-8")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8")

def no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate names in a JSON object: {keys}"
    return dict(pairs)

def ok(path, body):
    status, text = post(path, body)
    assert status == 200, (status, text)
    return json.loads(text, object_pairs_hook=no_duplicate_keys)

def logprobs_of(ids):
    """log_softmax of the reference's logits at every position of ids: [T, V] (float64)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0]
    return torch.log_softmax(logits.double(), dim=-1)

# ---- 1. lm-eval's loglikelihood request: context + continuation as token ids, batched ----
requests = [([1, 40, 90, 7, 200], [33, 120]), ([1, 250], [5, 6, 7, 8]), ([1, 100, 101, 102, 103, 104, 60], [17])]
# and a continuation that is the reference's greedy one (is_greedy True)
ctx = [1, 72, 105, 33]
for _ in range(3):
    ctx_ref = logprobs_of(ctx)
    ctx = ctx + [int(ctx_ref[-1].argmax())]
requests.append((ctx[:4], ctx[4:]))
prompts = [ctx + cont for ctx, cont in requests]
r = ok("/v1/completions", {"model": "m", "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1,
                           "seed": 1234, "echo": True})
assert r["object"] == "text_completion" and len(r["choices"]) == len(requests), r
assert r["usage"]["prompt_tokens"] == sum(map(len, prompts)), r["usage"]
worst = 0.0
greedy_seen = False
for choice, (ctx, cont), ids in zip(sorted(r["choices"], key=lambda c: c["index"]), requests, prompts):
    lp = choice["logprobs"]
    toks, tlp, top, off = lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"]
    assert len(toks) == len(tlp) == len(top) == len(off) == len(ids) + 1, (len(ids), lp)
    assert tlp[0] is None and top[0] is None, lp
    ref = logprobs_of(ids)
    for t in range(1, len(ids)):
        want = ref[t - 1, ids[t]].item()
        worst = max(worst, abs(tlp[t] - want))
        assert abs(tlp[t] - want) < 1e-4, (t, tlp[t], want)
        best = ref[t - 1].max().item()
        assert abs(max(top[t].values()) - best) < 1e-4, (t, top[t], best)  # the most likely, in top_logprobs
    # The generated token: the reference's argmax after the prompt, and its own most likely.
    gen_lp, gen_top = tlp[-1], top[-1]
    want_tok = int(ref[-1].argmax())
    assert abs(gen_lp - ref[-1, want_tok].item()) < 1e-4, (gen_lp, ref[-1, want_tok].item())
    assert gen_lp == max(gen_top.values()), (gen_lp, gen_top)
    # lm-eval's parse_logprobs: the continuation's logprobs are token_logprobs[ctxlen:-1].
    ctxlen = len(ctx)
    total = sum(tlp[ctxlen:-1])
    is_greedy = all(t == max(d.values()) for t, d in zip(tlp[ctxlen:-1], top[ctxlen:-1]))
    want_total = sum(ref[i - 1, ids[i]].item() for i in range(ctxlen, len(ids)))
    want_greedy = all(int(ref[i - 1].argmax()) == ids[i] for i in range(ctxlen, len(ids)))
    assert abs(total - want_total) < 1e-4 and is_greedy == want_greedy, (total, want_total, is_greedy, want_greedy)
    print(f"1. context {ctx} + continuation {cont}: loglikelihood {total:.6f} (reference {want_total:.6f}), "
          f"is_greedy {is_greedy}")
    greedy_seen = greedy_seen or is_greedy
assert greedy_seen, "the greedy continuation was not scored greedy"
print(f"1. max |served - reference| over the prompt logprobs: {worst:.2e}")

# ---- 2. max_tokens 0: score only ----
r0 = ok("/v1/completions", {"prompt": prompts[0], "max_tokens": 0, "echo": True, "logprobs": 0})
c0 = r0["choices"][0]
assert r0["usage"]["completion_tokens"] == 0 and c0["finish_reason"] == "length", r0
lp0 = c0["logprobs"]["token_logprobs"]
assert len(lp0) == len(prompts[0]) and lp0[0] is None, lp0
ref = logprobs_of(prompts[0])
assert all(abs(lp0[t] - ref[t - 1, prompts[0][t]].item()) < 1e-4 for t in range(1, len(lp0))), lp0
# logprobs 0: each token's own entry only.
assert all(len(d) == 1 for d in c0["logprobs"]["top_logprobs"][1:]), c0["logprobs"]["top_logprobs"]
# logprobs 20: bytes of unfinished characters are named apart ("bytes:\xNN"), so no JSON object
# has a name twice (parsed with a check for duplicate keys); tokens of the same text keep the
# likelier logprob (this vocabulary's ids past the 259 of the byte-level tokenizer decode to nothing,
# named "<unk>").
r20 = ok("/v1/completions", {"prompt": prompts[1], "max_tokens": 0, "echo": True, "logprobs": 20})
tops = r20["choices"][0]["logprobs"]["top_logprobs"][1:]
named_bytes = sum(k.startswith("bytes:") for d in tops for k in d)
assert named_bytes > 0 and all(len(d) <= 21 for d in tops), tops
ref = logprobs_of(prompts[1])
for t, d in enumerate(tops, start=1):  # every position's most likely is there, with its logprob
    assert abs(max(d.values()) - ref[t - 1].max().item()) < 1e-4, (t, d)
print(f"2. max_tokens 0 + echo: {len(lp0)} prompt tokens scored, nothing generated; logprobs 20: {sum(map(len, tops))} names ({named_bytes} of bytes), none twice")

# ---- 3. a text prompt, echoed; streamed logprobs equal the unstreamed ones ----
body = {"prompt": "hello world", "max_tokens": 8, "echo": True, "logprobs": 2, "temperature": 0}
r = ok("/v1/completions", body)
c = r["choices"][0]
lp = c["logprobs"]
P = r["usage"]["prompt_tokens"]  # BOS and the 11 bytes
assert P == 12 and c["text"].startswith("hello world"), (P, c["text"])
# Each prompt token is named by its text (BOS, which decodes to nothing, by its piece), at its
# offset (the generated bytes of this random model may
# split characters, whose names are their bytes).
assert lp["tokens"][:P] == ["<s>"] + list("hello world") and lp["text_offset"][:P] == [0] + list(range(11)), lp
assert len(lp["tokens"]) == P + r["usage"]["completion_tokens"], lp
assert all(len(d) <= 3 for d in lp["top_logprobs"][1:]), lp["top_logprobs"]
status, raw = post("/v1/completions", dict(body, stream=True))
assert status == 200, raw
chunks = [json.loads(l[6:]) for l in raw.split("\n") if l.startswith("data: {")]
s_text = "".join(ch["choices"][0]["text"] for ch in chunks)
s_tokens, s_lp = [], []
for ch in chunks:
    l = ch["choices"][0]["logprobs"]
    if l:
        s_tokens += l["tokens"]
        s_lp += l["token_logprobs"]
assert s_text == c["text"], (s_text, c["text"])
assert s_tokens == lp["tokens"] and s_lp == lp["token_logprobs"], (s_tokens, lp["tokens"])
print(f"3. text prompt echoed: {c['text']!r}; {len(chunks)} streamed chunks carry the same {len(s_lp)} logprobs")

# ---- 4. chat: logprobs + top_logprobs ----
r = ok("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0,
                                "logprobs": True, "top_logprobs": 2})
content = r["choices"][0]["logprobs"]["content"]
assert len(content) == r["usage"]["completion_tokens"], (content, r["usage"])
for e in content:
    assert len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"], e
    assert e["logprob"] == e["top_logprobs"][0]["logprob"] and e["token"] == e["top_logprobs"][0]["token"], e
    # A name is the token's text, or "bytes:\\xNN..." for text that is not whole characters.
    raw = bytes(e["bytes"])
    name = "bytes:" + "".join(f"\\x{b:02x}" for b in raw) if e["token"].startswith("bytes:") else raw.decode("utf-8")
    assert name == e["token"] or not raw, e  # no text: a special token, named by its piece
print(f"4. chat: {len(content)} tokens with logprobs, each its position's most likely")

# ---- 5. bad values ----
comp, chat = "/v1/completions", "/v1/chat/completions"
msgs = [{"role": "user", "content": "Hi"}]
for path, b, param in [(comp, {"prompt": "x", "logprobs": 21}, "logprobs"),
                       (comp, {"prompt": "x", "logprobs": True}, "logprobs"),
                       (comp, {"prompt": "x", "logprobs": -1}, "logprobs"),
                       (comp, {"prompt": "x", "max_tokens": 0, "logprobs": 1}, "max_tokens"),
                       (comp, {"prompt": [1, V], "echo": True, "max_tokens": 0}, "prompt"),
                       (comp, {"prompt": [], "echo": True}, "prompt"),
                       (comp, {"prompt": ["a", "b"], "stream": True}, "prompt"),
                       (comp, {"prompt": "x", "echo": 1}, "echo"),
                       (chat, {"messages": msgs, "top_logprobs": 2}, "top_logprobs"),
                       (chat, {"messages": msgs, "logprobs": True, "top_logprobs": 50}, "top_logprobs")]:
    status, text = post(path, b)
    e = json.loads(text).get("error", {})
    assert status == 400 and e.get("param") == param, (b, status, text)
    print(f"5. {json.dumps(b)[:70]:70} -> 400 {param}: {e['message']}")
PY

kill -TERM "$pid"
wait "$pid" || fail "serve did not exit cleanly"
pid=
echo "OK"
