"""One streamed completion against `shardlm serve`, token by token: what the serving benchmarks
(serve_latency.py, serve_clients.py) share."""
import http.client
import json
import time


def stream_token_times(port, prompt, max_tokens):
    """POSTs a streamed greedy completion of token-id `prompt` (logprobs 0, so that every token is
    its own server-sent event) and yields each token's arrival time (time.monotonic()). A new
    connection each time; an HTTP error raises."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1200)
    try:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "logprobs": 0}
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        for line in r:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            lp = json.loads(data)["choices"][0].get("logprobs") or {}
            for _ in lp.get("tokens", []) or []:
                yield time.monotonic()
    finally:
        c.close()
