# shellcheck shell=bash disable=SC2154,SC2034  # `work` and `pid` are the caller's; `port` is for it
# Helpers shared by the script tests that run `shardlm serve` (serve_cli.sh, serve_logprobs.sh,
# tensor_parallel_cli.sh, device_map_cli.sh). Sourced, not run; the caller sets `set -euo pipefail` and `work`, starts
# a server in the background with its stderr in $work/serve.err and sets `pid` to it.

pid=
# fail REASON: the reason, then the end of the server's stderr.
fail() {
  echo "FAIL: $*"
  [[ -f "$work/serve.err" ]] && sed 's/^/  serve: /' "$work/serve.err" | tail -20
  exit 1
}
# Only the server this script started is stopped.
trap '[[ -n "$pid" ]] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true' EXIT

# wait_listening WHAT: sets `port` from serve's "listening on" line in $work/serve.err (under
# launch, prefixed by the rank), once the server started as $pid says it; fails naming WHAT if it
# exits first or never says.
wait_listening() {
  port=
  for _ in $(seq 1 600); do
    port=$(sed -n 's|.*serve: listening on http://127.0.0.1:\([0-9][0-9]*\)$|\1|p' "$work/serve.err")
    [[ -n "$port" ]] && return 0
    kill -0 "$pid" 2>/dev/null || fail "$1 exited before listening"
    sleep 0.1
  done
  fail "$1 did not say where it listens"
}

# ask_server NAME [MAX_TOKENS]: the answers same_completions.py compares, from the server on $port:
# NAME.json, a completion with logprobs and echo; NAME.sse, a streamed completion; NAME.batch, one
# request of 4 prompts decoded together (MAX_TOKENS each, default 12).
ask_server() {
  curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "hello there", "max_tokens": 10, "temperature": 0, "logprobs": 5, "echo": true}' \
    > "$work/$1.json" || fail "$1: the completion failed"
  curl -sfN "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "four four", "max_tokens": 10, "temperature": 0, "stream": true}' \
    > "$work/$1.sse" || fail "$1: the streamed completion failed"
  curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": [\"request 1 of four\", \"request 2 of four\", \"request 3 of four\", \"request 4 of four\"],
         \"max_tokens\": ${2:-12}, \"temperature\": 0}" > "$work/$1.batch" || fail "$1: the request of 4 prompts failed"
}
