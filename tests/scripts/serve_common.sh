# shellcheck shell=bash disable=SC2154,SC2034  # `work` and `pid` are the caller's; `port` is for it
# Helpers shared by the script tests that run `shardlm serve` (serve_cli.sh, serve_logprobs.sh,
# tensor_parallel_cli.sh). Sourced, not run; the caller sets `set -euo pipefail` and `work`, starts
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
