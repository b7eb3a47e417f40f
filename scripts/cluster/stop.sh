#!/usr/bin/env bash
# Removes emulated cluster NAME (start.sh): kills every process still in its nodes' namespaces,
# deletes the namespaces (their veth pairs and bridge go with them), unmounts the hostnames' UTS
# namespaces and removes the state directory. Removing what is not there is not an error, so this
# also cleans up after a start that failed halfway.
#   scripts/cluster/stop.sh [NAME]   (default emu)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/cluster/common.sh
source "$here/common.sh"
cluster_vars "${1:-emu}"
[[ $(id -u) -eq 0 ]] || fail "must run as root"

mapfile -t spaces < <(ip netns list | awk -v p="shardlm-$CLUSTER_NAME-" 'index($1, p) == 1 { print $1 }')
# The processes in a node: those in its network namespace (ip netns pids), then, as a process may
# have joined the node's UTS namespace alone, those whose UTS namespace is one of the nodes'.
uts_ids=()
for f in "$CLUSTER_DIR"/uts/*; do
  [[ -e $f ]] && id=$(stat -L -c %i "$f" 2>/dev/null) && [[ $(stat -f -c %T "$f") == nsfs ]] && uts_ids+=("$id")
done
victims() {
  for ns in "${spaces[@]}"; do ip netns pids "$ns" 2>/dev/null || true; done
  for id in "${uts_ids[@]}"; do  # one find over /proc: a ns link reads "uts:[INODE]"
    find /proc/[0-9]*/ns/uts -maxdepth 0 -lname "uts:\[$id\]" 2>/dev/null | cut -d/ -f3
  done
}
for _ in 1 2 3 4 5; do
  mapfile -t pids < <(victims | sort -u)
  [[ ${#pids[@]} -eq 0 ]] && break
  kill -KILL "${pids[@]}" 2>/dev/null || true
  sleep 0.2
done
for ns in "${spaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
for f in "$CLUSTER_DIR"/uts/*; do
  [[ -e $f ]] || continue
  while mountpoint -q "$f" 2>/dev/null || [[ $(stat -f -c %T "$f" 2>/dev/null) == nsfs ]]; do umount "$f" || break; done
done
rm -rf "$CLUSTER_DIR"
rmdir "$CLUSTER_ROOT" 2>/dev/null || true
left=$(ip netns list | awk -v p="shardlm-$CLUSTER_NAME-" 'index($1, p) == 1 { print $1 }')
[[ -z $left ]] || fail "namespaces left: $left"
echo "cluster $CLUSTER_NAME removed"
