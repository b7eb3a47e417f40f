#!/usr/bin/env python3
"""Streams' latency when a long prompt arrives mid-stream (issue 32 item 2), against `shardlm serve`.

One scenario per server: STREAMS clients stream completions of short token-id prompts (greedy,
logprobs 0 so that every token is its own server-sent event); once each has received 10 tokens, one
more client sends a LONG-token prompt (streamed, 4 new tokens). Each token's arrival time is taken
at the client. Printed, one line:
  - itl_p50 / itl_p99: the streams' inter-token gaps before the long prompt arrived (decode steps);
  - stall: the streams' longest gap while the long prompt was prefilled (from its arrival to its
    first token): what the long prompt cost the running streams;
  - ttft_long: the long prompt's time to first token;
  - elapsed and requests/s over the whole scenario.

Usage: serve_latency.py PORT STREAMS LONG [NEW_TOKENS=60]
"""
import random
import statistics
import sys
import threading
import time

from serve_stream import stream_token_times

port, streams, long_len = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
new_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 60
rng = random.Random(1)


def stream(prompt, max_tokens, arrivals, failures):
    """Appends each token's arrival time of a streamed completion."""
    try:
        arrivals.extend(stream_token_times(port, prompt, max_tokens))
    except Exception as e:  # reported below; the scenario then fails
        failures.append(repr(e))


failures = []
arrivals = [[] for _ in range(streams)]
start = time.monotonic()
threads = [threading.Thread(target=stream, args=([rng.randrange(3, 500) for _ in range(24)], new_tokens,
                                                  arrivals[i], failures)) for i in range(streams)]
for t in threads:
    t.start()
while min(len(a) for a in arrivals) < 10 and not failures:
    time.sleep(0.005)
long_arrivals = []
t_long = time.monotonic()
lt = threading.Thread(target=stream, args=([rng.randrange(3, 500) for _ in range(long_len)], 4, long_arrivals, failures))
lt.start()
for t in threads + [lt]:
    t.join()
elapsed = time.monotonic() - start
if failures:
    sys.exit("serve_latency: " + "; ".join(failures))
t_first = long_arrivals[0]
before, stall = [], 0.0
for a in arrivals:
    for x, y in zip(a, a[1:]):
        if y <= t_long:
            before.append(y - x)
        elif x < t_first:  # a gap that overlaps the long prompt's prefill
            stall = max(stall, y - x)
before.sort()
p99 = before[min(len(before) - 1, int(0.99 * len(before)))]
print(f"itl_p50 {statistics.median(before) * 1e3:8.1f} ms  itl_p99 {p99 * 1e3:8.1f} ms  "
      f"stall {stall * 1e3:8.1f} ms  ttft_long {(t_first - t_long) * 1e3:8.1f} ms  "
      f"elapsed {elapsed:6.2f} s  {(streams + 1) / elapsed:5.2f} req/s")
