#!/usr/bin/env python3
"""N concurrent clients against `shardlm serve` (issue 32's serving benchmark).

CLIENTS threads each send REQUESTS streamed completions one after another: token-id prompts of
16 to 384 tokens and max_tokens of 16 to 160, drawn from a fixed seed (the same requests for every
server), greedy, no stop token, logprobs 0 so that every token is its own server-sent event. Each
token's arrival time is taken at the client. Printed, one line:
  - req/s over the whole run, and generated tokens/s;
  - ttft p50 / p99: time to first token;
  - itl p50 / p99: the gaps between a request's tokens.

Usage: serve_clients.py PORT CLIENTS REQUESTS
"""
import random
import statistics
import sys
import threading
import time

from serve_stream import stream_token_times

port, clients, per_client = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(7)
work = [[([rng.randrange(3, 500) for _ in range(rng.randrange(16, 385))], rng.randrange(16, 161))
         for _ in range(per_client)] for _ in range(clients)]


def client(requests, ttft, itl, tokens, failures):
    try:
        for prompt, max_tokens in requests:
            last = time.monotonic()  # the request is sent: its first gap is the time to first token
            for i, now in enumerate(stream_token_times(port, prompt, max_tokens)):
                (ttft if i == 0 else itl).append(now - last)
                last = now
                tokens.append(1)
    except Exception as e:  # reported below; the run then fails
        failures.append(repr(e))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


ttft, itl, tokens, failures = [], [], [], []
start = time.monotonic()
threads = [threading.Thread(target=client, args=(work[i], ttft, itl, tokens, failures)) for i in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
elapsed = time.monotonic() - start
if failures:
    sys.exit(f"serve_clients: {len(failures)} failed: {failures[0]}")
n = clients * per_client
print(f"{n / elapsed:6.2f} req/s {len(tokens) / elapsed:7.1f} tok/s  ttft p50 {1e3 * statistics.median(ttft):8.1f} ms "
      f"p99 {1e3 * pct(ttft, 99):8.1f} ms  itl p50 {1e3 * statistics.median(itl):7.1f} ms p99 {1e3 * pct(itl, 99):7.1f} ms"
      f"  elapsed {elapsed:6.1f} s")
