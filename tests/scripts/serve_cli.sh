#!/usr/bin/env bash
# `shardlm serve` (docs/serving.md), end to end over HTTP on a tiny random model:
#  1. it starts on a free port (--port 0 prints the one it took) and answers /health and /v1/models;
#  2. curl: a streamed chat completion is server-sent events in OpenAI's chunk format (the role
#     first, the finish_reason last, then "data: [DONE]"); a completion is OpenAI's JSON with usage;
#  3. a Python client (urllib, threads) sends 8 requests at once, chat and completion, streamed and
#     not, to a server with 4 slots: each text equals what `shardlm generate --temperature 0` gives
#     the same prompt offline, with the same token count and finish_reason;
#  4. bad requests are HTTP 400 with OpenAI's error object naming the field;
#  5. SIGTERM shuts it down cleanly (exit 0); 5b. generation_config.json's eos_token_id ends a
#     completion, --stop-token-ids none runs it to max_tokens, a bad id is refused naming the flag;
#  6. with Llama 2's SentencePiece tokenizer (byte fallback: characters split over tokens), streamed
#     chat pieces add up to the text the same request gets unstreamed;
#  7. --dtype bf16: the start line says so, and a completion equals `generate --dtype bf16` offline.
# Usage: serve_cli.sh SHARDLM PYTHON WORKDIR SHARED_DATA
set -euo pipefail
shardlm=$1
py=$2
work=$3
shared=$4
[[ -f "$shared/llama2_tokenizer.model" ]] || { echo "FAIL: no $shared/llama2_tokenizer.model"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/serve_common.sh"

"$shardlm" init --preset tiny --set max_position_embeddings=96 --seed 1 --out "$work/m" >/dev/null
m=$work/m


# ---- 1. start, /health, /v1/models ----
"$shardlm" serve --model "$m" --port 0 --max-batch 4 --max-len 96 --chat-format llama2 2> "$work/serve.err" &
pid=$!
wait_listening serve
url=http://127.0.0.1:$port
for _ in $(seq 1 100); do curl -sf "$url/health" > "$work/health.json" && break; sleep 0.1; done
grep -q '"status":"ok"' "$work/health.json" || fail "/health: $(cat "$work/health.json")"
curl -sf "$url/v1/models" > "$work/models.json" || fail "/v1/models failed"
"$py" - "$work/models.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["object"] == "list" and [m["id"] for m in r["data"]] == ["m"], r
print(f"1. listening; /v1/models lists {r['data'][0]['id']!r}")
PY

# ---- offline: what `generate` gives each prompt at temperature 0 ----
cat > "$work/rows.jsonl" <<'EOF2'
{"messages": [{"role": "user", "content": "Hi"}], "max_new_tokens": 8}
{"prompt": "hello", "max_new_tokens": 5}
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}], "max_new_tokens": 12}
{"prompt": "the quick brown fox", "max_new_tokens": 20}
{"messages": [{"role": "user", "content": "a"}], "max_new_tokens": 3}
{"prompt": "12+34=", "max_new_tokens": 9}
{"messages": [{"role": "user", "content": "tell me a story"}, {"role": "assistant", "content": "once"}, {"role": "user", "content": "more"}], "max_new_tokens": 15}
{"prompt": "x", "max_new_tokens": 30}
{"messages": [{"role": "user", "content": "Hi"}], "max_new_tokens": 8}
EOF2
"$shardlm" generate --model "$m" --prompts "$work/rows.jsonl" --chat-format llama2 --temperature 0 \
  --output "$work/offline.jsonl" 2> "$work/offline.err" || fail "generate: $(cat "$work/offline.err")"

# ---- 2. curl: a streamed chat completion, a completion ----
curl -sfN "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0, "stream": true}' \
  > "$work/chat_stream.txt" || fail "streamed chat completion failed"
curl -sf "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "m", "prompt": "hello", "max_tokens": 5, "temperature": 0}' > "$work/completion.json" \
  || fail "completion failed"
# An empty prompt: generation from BOS alone (issue 36).
curl -sf "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "m", "prompt": "", "max_tokens": 3, "temperature": 0}' > "$work/empty_prompt.json" \
  || fail "a completion of an empty prompt failed"
"$py" -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['usage']['prompt_tokens'] == 1, r; assert r['usage']['completion_tokens'] >= 1, r" \
  "$work/empty_prompt.json" || fail "empty prompt: $(cat "$work/empty_prompt.json")"
"$py" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
offline = [json.loads(l) for l in open(f"{work}/offline.jsonl")]
raw = open(f"{work}/chat_stream.txt", encoding="utf-8").read()
events = raw.split("\n\n")
assert events[-1] == "", f"the stream does not end with a blank line: {raw[-40:]!r}"
events = events[:-1]
assert all(e.startswith("data: ") for e in events), events
assert events[-1] == "data: [DONE]", events[-1]
chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
assert len(chunks) >= 2, chunks
for c in chunks:
    assert c["object"] == "chat.completion.chunk" and c["model"] == "m" and c["id"] == chunks[0]["id"], c
    assert len(c["choices"]) == 1 and c["choices"][0]["index"] == 0, c
assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}, chunks[0]
assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1]), chunks
last = chunks[-1]["choices"][0]
assert last["finish_reason"] in ("stop", "length") and last["delta"] == {}, last
text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
want = offline[0]
assert text == want["text"], f"streamed chat {text!r} != generate's {want['text']!r}"
assert last["finish_reason"] == want["finish_reason"], (last, want)
print(f"2. streamed chat: {len(chunks)} chunks + [DONE], text {text!r} (= generate's), finish_reason {last['finish_reason']}")
r = json.load(open(f"{work}/completion.json"))
assert r["object"] == "text_completion" and r["model"] == "m" and r["id"].startswith("cmpl-"), r
c = r["choices"][0]
want = offline[1]
assert c["text"] == want["text"] and c["finish_reason"] == want["finish_reason"], (c, want)
u = r["usage"]
assert u["prompt_tokens"] == want["prompt_tokens"] and u["completion_tokens"] == want["completion_tokens"], (u, want)
assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
print(f"   completion: {c['text']!r} (= generate's), usage {u}")
PY

# ---- 3. 8 concurrent requests from a Python client ----
"$py" - "$url" "$work" <<'PY'
import json, sys, threading, urllib.request
url, work = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{work}/rows.jsonl")][:8]
offline = [json.loads(l) for l in open(f"{work}/offline.jsonl")][:8]

def post(path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=300)

results = [None] * len(rows)
def client(i):
    row = rows[i]
    chat = "messages" in row
    stream = i % 4 >= 2
    body = {"model": "m", "max_tokens": row["max_new_tokens"], "temperature": 0, "stream": stream}
    body["messages" if chat else "prompt"] = row["messages" if chat else "prompt"]
    if stream:
        body["stream_options"] = {"include_usage": True}
    try:
        with post("/v1/chat/completions" if chat else "/v1/completions", body) as resp:
            if not stream:
                r = json.load(resp)
                c = r["choices"][0]
                results[i] = (c["message"]["content"] if chat else c["text"], c["finish_reason"], r["usage"])
                return
            text, finish, usage = "", None, None
            for line in resp.read().decode("utf-8").split("\n"):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ch = json.loads(line[6:])
                if not ch["choices"]:
                    usage = ch["usage"]
                    continue
                c = ch["choices"][0]
                text += c["delta"].get("content", "") if chat else c["text"]
                finish = c["finish_reason"] or finish
            results[i] = (text, finish, usage)
    except Exception as e:
        results[i] = e

threads = [threading.Thread(target=client, args=(i,)) for i in range(len(rows))]
for t in threads: t.start()
for t in threads: t.join()
for i, (res, want) in enumerate(zip(results, offline)):
    assert not isinstance(res, Exception) and res is not None, f"request {i}: {res!r}"
    text, finish, usage = res
    assert text == want["text"], f"request {i}: served {text!r} != generate's {want['text']!r}"
    assert finish == want["finish_reason"], f"request {i}: finish_reason {finish} != {want['finish_reason']}"
    assert usage["completion_tokens"] == want["completion_tokens"], (i, usage, want)
    assert usage["prompt_tokens"] == want["prompt_tokens"], (i, usage, want)
print(f"3. {len(rows)} concurrent requests (chat and completion, 4 streamed) equal generate's offline output")
PY

# ---- 4. bad requests: 400 naming the field ----
"$py" - "$url" <<'PY'
import json, sys, urllib.error, urllib.request
url = sys.argv[1]
def post(path, data):
    req = urllib.request.Request(url + path, data=data.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
chat, comp = "/v1/chat/completions", "/v1/completions"
msgs = '"messages": [{"role": "user", "content": "Hi"}]'
cases = [
    (chat, '{"messages": [', None),
    (chat, '[1, 2]', None),
    (chat, '{"max_tokens": 4}', "messages"),
    (chat, '{"messages": "Hi"}', "messages"),
    (chat, '{"messages": [{"role": "assistant", "content": "x"}]}', "messages"),
    (comp, '{"max_tokens": 4}', "prompt"),
    (comp, '{"prompt": 123}', "prompt"),
    (comp, '{"prompt": [["a"]]}', "prompt"),
    (chat, '{%s, "temperature": "hot"}' % msgs, "temperature"),
    (chat, '{%s, "top_p": 3}' % msgs, "top_p"),
    (chat, '{%s, "model": "gpt-4"}' % msgs, "model"),
    (chat, '{%s, "max_tokens": 1000}' % msgs, "max_tokens"),
    (comp, '{"prompt": "x", "max_tokens": 0}', "max_tokens"),
    (chat, '{%s, "n": 2}' % msgs, "n"),
    (chat, '{%s, "stop": [1]}' % msgs, "stop"),
    (chat, '{%s, "stream": "yes"}' % msgs, "stream"),
    (comp, '{"prompt": "x", "seed": -1}', "seed"),
    (comp, '{"prompt": "x", "temprature": 1}', "temprature"),
    (comp, '{"prompt": "x", "frequency_penalty": 0.5}', "frequency_penalty"),
]
for path, body, param in cases:
    status, r = post(path, body)
    assert status == 400, (path, body, status, r)
    e = r["error"]
    assert e["type"] == "invalid_request_error" and e["param"] == param and e["message"], (body, r)
    print(f"4. {body[:60]:60} -> 400 param={param}: {e['message']}")
status, r = post("/v1/nowhere", "{}")
assert status == 404 and "error" in r, (status, r)
status, r = post(comp, '{"prompt": ["x"], "max_tokens": 2, "n": 1, "presence_penalty": 0, "user": "u"}')
assert status == 200, (status, r)  # OpenAI's neutral values, and a list of one prompt, are accepted
PY

# A second server on the same port, and a --max-len past the model's context: one line naming the flag.
one_line_error() {  # one_line_error NAME PATTERN ARGS...
  local name=$1 pattern=$2
  shift 2
  if "$shardlm" serve "$@" > /dev/null 2> "$work/$name.err"; then fail "$name: serve started"; fi
  [[ $(wc -l < "$work/$name.err") -eq 1 ]] || fail "$name: not one line: $(cat "$work/$name.err")"
  grep -q -- "$pattern" "$work/$name.err" || fail "$name: expected '$pattern' in: $(cat "$work/$name.err")"
  echo "4. $name: $(cat "$work/$name.err")"
}
one_line_error port_in_use "key '--port'" --model "$m" --port "$port"
one_line_error max_len "key '--max-len'" --model "$m" --max-len 1000

# ---- 5. SIGTERM ----
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
[[ $rc -eq 0 ]] || fail "serve exited $rc after SIGTERM"
grep -q "SIGTERM: shutting down" "$work/serve.err" || fail "serve did not say it was shutting down"
echo "5. SIGTERM: $(tail -1 "$work/serve.err"), exit 0"

# ---- 5b. stop tokens (issue 36): generation_config.json's eos_token_id, --stop-token-ids ----
# A copy of the model whose generation_config.json lists every id: a completion stops at its first
# token (none counted, "stop"); --stop-token-ids none replaces that set and it runs to max_tokens.
cp -r "$m" "$work/m_eos"
"$py" - "$work/m_eos" <<'PY'
import json, sys
vocab = json.load(open(f"{sys.argv[1]}/config.json"))["vocab_size"]
json.dump({"eos_token_id": list(range(vocab))}, open(f"{sys.argv[1]}/generation_config.json", "w"))
PY
one_line_error stop_token_ids "key '--stop-token-ids'" --model "$m" --stop-token-ids 100000
stop_case() {  # stop_case WANT_TOKENS WANT_REASON SERVE-ARGS...
  local want_n=$1 want_reason=$2
  shift 2
  "$shardlm" serve --port 0 --max-batch 1 "$@" 2> "$work/serve.err" &
  pid=$!
  wait_listening "serve $*"
  curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "hello", "max_tokens": 5, "temperature": 0}' > "$work/stop.json" || fail "serve $*: the completion failed"
  kill -TERM "$pid"
  wait "$pid" || fail "serve $* did not exit cleanly"
  pid=
  "$py" - "$work/stop.json" "$want_n" "$want_reason" "$*" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
got = (r["usage"]["completion_tokens"], r["choices"][0]["finish_reason"])
assert got == (int(sys.argv[2]), sys.argv[3]), (sys.argv[4], got, r)
print(f"5b. serve {sys.argv[4].split('/')[-1]}: {got[0]} tokens, finish_reason {got[1]}")
PY
}
stop_case 0 stop --model "$work/m_eos"
stop_case 5 length --model "$work/m_eos" --stop-token-ids none

# ---- 6. streaming with a SentencePiece tokenizer ----
"$shardlm" init --preset tiny --set vocab_size=32000 --set max_position_embeddings=256 --seed 3 --out "$work/sp" >/dev/null
cp "$shared/llama2_tokenizer.model" "$work/sp/tokenizer.model"
"$shardlm" serve --model "$work/sp" --port 0 --max-batch 4 2> "$work/serve.err" &
pid=$!
wait_listening "serve (SentencePiece)"
"$py" - "http://127.0.0.1:$port" <<'PY'
import json, sys, threading, urllib.request
url = sys.argv[1]
def post(body):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode())
    return urllib.request.urlopen(req, timeout=300)
prompts = ["Hello", "Écris un poème sur la mer", "日本語で話して", "Tell me about 🦙"]
out = {}
def run(p, stream):
    body = {"messages": [{"role": "user", "content": p}], "max_tokens": 60, "temperature": 0, "stream": stream}
    with post(body) as r:
        if not stream:
            out[p, stream] = json.load(r)["choices"][0]["message"]["content"]
            return
        text = ""
        for line in r.read().decode("utf-8").split("\n"):
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["delta"].get("content", "")
        out[p, stream] = text
threads = [threading.Thread(target=run, args=(p, s)) for p in prompts for s in (False, True)]
for t in threads: t.start()
for t in threads: t.join()
for p in prompts:
    assert out[p, True] == out[p, False], f"{p!r}: streamed {out[p, True]!r} != {out[p, False]!r}"
print(f"6. SentencePiece: {len(prompts)} streamed chats (8 requests at once) add up to their unstreamed text")
PY
kill -TERM "$pid"
wait "$pid" || fail "serve (SentencePiece) did not exit cleanly"
pid=

# ---- 7. --dtype bf16 ----
"$shardlm" serve --model "$m" --port 0 --max-batch 2 --max-len 96 --dtype bf16 2> "$work/serve.err" &
pid=$!
wait_listening "serve --dtype bf16"
grep -q "^serve: model 'm' (chat format .*, bf16)" "$work/serve.err" || fail "the start line does not say bf16"
curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "the quick brown fox", "max_tokens": 12, "temperature": 0}' > "$work/bf16.json" ||
  fail "serve --dtype bf16: the completion failed"
kill -TERM "$pid"
wait "$pid" || fail "serve --dtype bf16 did not exit cleanly"
pid=
"$shardlm" generate --model "$m" --prompt "the quick brown fox" --max-new-tokens 12 --temperature 0 --dtype bf16 \
  --quiet > "$work/bf16_offline.txt" 2>/dev/null
"$py" - "$work/bf16.json" "$work/bf16_offline.txt" <<'PY'
import json, sys
text = json.load(open(sys.argv[1]))["choices"][0]["text"]
offline = open(sys.argv[2], "rb").read().decode("utf-8", "replace")[len("the quick brown fox"):-1]
assert text == offline, (text, offline)
assert text, "nothing generated (vacuous test)"
print(f"7. serve --dtype bf16 = generate --dtype bf16: {text!r}")
PY
echo "OK"
