#!/usr/bin/env python3
"""A bounded load test of `shardlm serve` on loopback (issue 30): hostile and careless clients
together must not stall it.

One server (--max-connections 96, --request-timeout 2, --max-body 1MiB) meets, at the same time:
  - 40 clients that dribble their request headers (a byte every 0.3 s): each is cut off after the
    request timeout, and meanwhile /health answers every 0.1 s and completions succeed;
  - 16 concurrent completion clients (greedy, 8 tokens), all answered 200;
  - 100 MB chunked bodies: refused 413 after at most a few MB are sent, the body never echoed;
  - a Content-Length of 100 MB: refused 413 before any body is sent;
  - an HTTP/1.0 POST without Content-Length: answered (411) at once;
  - `temperature: 1e400`: a 400 naming the field.
Then more connections than the limit: the ones past it get 503 at once, and once the idle ones
are cut off the server answers again. The server's RSS is sampled throughout and must stay within
150 MB of its idle RSS. Last, SIGTERM while a slow client is still sending: the server exits 0
within its shutdown grace (2 s) plus 3 s; and so does a second server whose --request-timeout
(600 s) would not cut the client off.

Usage: serve_load.py SHARDLM WORKDIR     (127.0.0.1 only; about 20 s)
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

shardlm, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
env = dict(os.environ, OMP_NUM_THREADS="2")
failures = []
lock = threading.Lock()
started = time.monotonic()


def fail(msg):
    with lock:
        failures.append(msg)
    print("FAIL:", msg, flush=True)


def log(msg):
    print(f"[{time.monotonic() - started:5.1f}s] {msg}", flush=True)


model = os.path.join(work, "m")
subprocess.run([shardlm, "init", "--preset", "tiny", "--set", "max_position_embeddings=96", "--seed", "1",
                "--out", model], check=True, stdout=subprocess.DEVNULL, env=env)
err = open(os.path.join(work, "serve.err"), "w+")


def start_server(*flags):
    """serve on an ephemeral loopback port with these flags; returns (process, port or None)."""
    err.seek(0)
    err.truncate()
    proc = subprocess.Popen([shardlm, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0",
                             "--max-len", "96", *flags], stderr=err, env=env)
    for _ in range(600):
        err.seek(0)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", err.read())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    return proc, None


server, port = start_server("--max-batch", "4", "--max-connections", "96", "--request-timeout", "2",
                            "--max-body", "1MiB")
if port is None:
    err.seek(0)
    print("FAIL: serve did not start:\n" + err.read())
    server.kill()
    sys.exit(1)


def connect(timeout=5.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(s, limit=1 << 20):
    """(status, headers, body) of one response on socket s, or None when the connection ends first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:] if ":" in l)}
    n = int(headers.get("content-length", "-1"))
    while (n < 0 or len(body) < n) and len(body) < limit:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        body += chunk
    return status, headers, body[:n] if n >= 0 else body


def request(method, path, body=None, timeout=10.0, extra=""):
    s = connect(timeout)
    try:
        data = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{extra}"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        s.sendall(head.encode() + b"\r\n" + data)
        return read_response(s)
    finally:
        s.close()


def rss_kb():
    with open(f"/proc/{server.pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


completion = {"prompt": "12+34=", "max_tokens": 8, "temperature": 0}
r = request("POST", "/v1/completions", completion)
if not r or r[0] != 200:
    fail(f"a first completion: {r}")
idle_rss = rss_kb()
log(f"server up on port {port}, idle RSS {idle_rss / 1024:.1f} MB")

stop = threading.Event()
peak_rss = [idle_rss]


def sample_rss():
    while not stop.is_set():
        try:
            peak_rss[0] = max(peak_rss[0], rss_kb())
        except (OSError, AttributeError):
            return
        time.sleep(0.05)


health_times = []


def poll_health():
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            r = request("GET", "/health", timeout=3)
            if not r or r[0] != 200:
                fail(f"/health while under load: {r and r[0]}")
        except OSError as e:
            fail(f"/health while under load: {e}")
        health_times.append(time.monotonic() - t0)
        time.sleep(0.1)


cut_after = []


def dribble():
    """Sends a request line and headers a byte at a time; the server must cut it off."""
    s = connect()
    t0 = time.monotonic()
    try:
        for b in b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 1000:
            s.send(bytes([b]))
            time.sleep(0.3)
            if time.monotonic() - t0 > 8:
                fail("a dribbling client was not cut off within 8 s")
                return
    except OSError:
        pass  # the server shut the connection: a reset or a broken pipe
    else:
        s.settimeout(5)
    cut_after.append(time.monotonic() - t0)
    s.close()


completions_ok = []


def complete(i):
    body = {"prompt": f"{i}+{i}=", "max_tokens": 8, "temperature": 0}
    try:
        r = request("POST", "/v1/completions", body, timeout=30)
        if r and r[0] == 200 and json.loads(r[2])["choices"][0]["finish_reason"]:
            completions_ok.append(i)
        else:
            fail(f"completion {i} under load: {r}")
    except OSError as e:
        fail(f"completion {i} under load: {e}")


def chunked_bomb(i):
    """100 MB in chunks of 64 KiB: refused with 413 long before the end, never echoed."""
    s = connect(10)
    sent = 0
    try:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        piece = b'{"prompt": "' + b"x" * (65536 - 12)
        chunk = b"%x\r\n" % len(piece) + piece + b"\r\n"
        while sent < 100 << 20:
            s.sendall(chunk)
            sent += len(piece)
    except OSError:
        pass  # the server stopped reading and closed
    try:
        s.settimeout(5)
        r = read_response(s)
    except OSError as e:
        r = None
    s.close()
    if sent >= 100 << 20:
        fail(f"chunked body {i}: the server read all 100 MB")
    if r is None:
        fail(f"chunked body {i}: no answer after {sent >> 20} MB sent")
    elif r[0] != 413 or b"xxxxxxxxxx" in r[2] or len(r[2]) > 4096:
        fail(f"chunked body {i}: {r[0]} {r[2][:200]!r}")
    else:
        with lock:
            bombs.append(sent)


bombs = []

threads = [threading.Thread(target=sample_rss), threading.Thread(target=poll_health)]
threads += [threading.Thread(target=dribble) for _ in range(40)]
for t in threads:
    t.start()
time.sleep(0.5)  # the dribblers are connected
work_threads = [threading.Thread(target=complete, args=(i,)) for i in range(16)]
work_threads += [threading.Thread(target=chunked_bomb, args=(i,)) for i in range(4)]
for t in work_threads:
    t.start()

# Meanwhile, single bad requests.
r = request("POST", "/v1/completions", timeout=5,
            extra="Content-Type: application/json\r\nContent-Length: 104857600\r\n")
if not r or r[0] != 413:
    fail(f"Content-Length of 100 MB: {r}")
s = connect(5)
t0 = time.monotonic()
s.sendall(b'POST /v1/completions HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\r\n{"prompt": "a"}')
r = read_response(s)
s.close()
if not r or r[0] not in (400, 411) or time.monotonic() - t0 > 1.5:
    fail(f"HTTP/1.0 POST without Content-Length: {r} after {time.monotonic() - t0:.1f} s")
s = connect(5)
raw = b'{"prompt": "a", "temperature": 1e400}'
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
          % len(raw) + raw)
r = read_response(s)
s.close()
if not r or r[0] != 400 or json.loads(r[2])["error"]["param"] != "temperature":
    fail(f"temperature 1e400: {r}")

for t in work_threads:
    t.join(60)
log(f"16 completions ok: {len(completions_ok)}; chunked 100 MB bodies refused after "
    f"{[b >> 20 for b in bombs]} MB sent")
for t in threads[2:]:
    t.join(15)
log(f"40 dribblers cut off after {min(cut_after or [0]):.1f}..{max(cut_after or [0]):.1f} s; "
    f"/health answered {len(health_times)} times, slowest {max(health_times or [0]):.2f} s")
if len(cut_after) != 40:
    fail(f"{40 - len(cut_after)} dribbling clients were not cut off")
elif max(cut_after) > 4.5:
    fail(f"a dribbling client was cut off only after {max(cut_after):.1f} s (--request-timeout 2)")
if health_times and max(health_times) > 2:
    fail(f"/health took {max(health_times):.1f} s under load")

# Past the connection limit: 96 idle connections fill it, the next is answered 503 at once.
stop.set()
threads[1].join()
time.sleep(0.3)
idle = [connect() for _ in range(96)]
time.sleep(0.3)
t0 = time.monotonic()
try:
    r = request("GET", "/health", timeout=3)
except OSError as e:
    r = e
if not (isinstance(r, tuple) and r[0] == 503 and time.monotonic() - t0 < 1):
    fail(f"a connection past --max-connections: {r} after {time.monotonic() - t0:.1f} s")
else:
    log(f"past the limit: 503 in {time.monotonic() - t0:.3f} s: {r[2].decode()[:100]}")
time.sleep(2.5)  # the idle connections are cut off after --request-timeout
r = request("GET", "/health", timeout=3)
if not r or r[0] != 200:
    fail(f"/health once the idle connections were cut off: {r}")
else:
    h = json.loads(r[2])
    log(f"after: {h}")
for s in idle:
    s.close()
threads[0].join()
log(f"RSS: idle {idle_rss / 1024:.1f} MB, peak {peak_rss[0] / 1024:.1f} MB")
if peak_rss[0] - idle_rss > 150 * 1024:
    fail(f"RSS grew by {(peak_rss[0] - idle_rss) / 1024:.0f} MB under load")


def sigterm_with_slow_client(server, what):
    """SIGTERM while a client is still sending its headers: exit 0 within the 2 s grace + 3 s."""
    slow = connect()
    slow.send(b"GET /health HTTP/1.1\r\n")
    time.sleep(0.2)
    t0 = time.monotonic()
    server.send_signal(signal.SIGTERM)
    try:
        rc = server.wait(timeout=2 + 3)
        log(f"SIGTERM with a slow client ({what}): exit {rc} after {time.monotonic() - t0:.1f} s")
        if rc != 0:
            fail(f"serve exited {rc} after SIGTERM")
    except subprocess.TimeoutExpired:
        fail(f"serve ({what}) did not exit within 5 s of SIGTERM")
        server.kill()
    slow.close()


sigterm_with_slow_client(server, "--request-timeout 2")
# Again with a request timeout far past the grace: the shutdown itself must cut the client off.
server, port = start_server("--request-timeout", "600")
if port is None:
    fail("the second serve did not start")
else:
    sigterm_with_slow_client(server, "--request-timeout 600")
if server.poll() is None:
    server.kill()
log(f"done in {time.monotonic() - started:.1f} s")
if failures:
    err.seek(0)
    print("serve's stderr:\n" + "".join(err.readlines()[-20:]))
    sys.exit(1)
print("serve_load: ok")
