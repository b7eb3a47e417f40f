#!/usr/bin/env bash
# Sets node I's link down or up, as a pulled cable would: its switch port goes down, so packets
# are dropped both ways and nothing is told (no reset, no unreachable):
#   scripts/cluster/link.sh NAME I down|up
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/cluster/common.sh
source "$here/common.sh"
[[ $# -eq 3 && ($3 == down || $3 == up) ]] || fail "usage: $self NAME NODE_NUMBER down|up"
cluster_vars "$1"
node_index "$(node_host "$2")" >/dev/null
ip -n "$CLUSTER_SWITCH" link set "port$2" "$3"
