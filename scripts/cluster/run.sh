#!/usr/bin/env bash
# Runs a command on node I of an emulated cluster (its network namespace and hostname), keeping this
# shell's environment and directory, as logging in to the head node and running it there would:
#   scripts/cluster/run.sh NAME I COMMAND...
# e.g. scripts/cluster/run.sh emu 1 bash -c 'source /run/shardlm-cluster/emu/env && mpirun ...'
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/cluster/common.sh
source "$here/common.sh"
[[ $# -ge 3 ]] || fail "usage: $self NAME NODE_NUMBER COMMAND..."
cluster_vars "$1"
i=$(node_index "$(node_host "$2")")
shift 2
# shellcheck disable=SC2046
exec $(node_enter "$i") "$@"
