#!/usr/bin/env bash
# Starts an emulated cluster of N nodes on this machine (root; docs/multinode.md): each node a
# network namespace with its own hostname, joined by veth pairs to a bridge, TCP between them, plus
# an rsh agent for OpenMPI and a hostfile. Prints the file to source (OpenMPI's settings).
#   scripts/cluster/start.sh [--name NAME] [--nodes N] [--slots S] [--rate RATE]
#     --name   cluster name (default emu): hostnames NAME-node1..N, state in /run/shardlm-cluster/NAME
#     --nodes  node count (default 2, at most 200)
#     --slots  ranks per node in the hostfile (default 2)
#     --rate   limit every link, both ways, with tc tbf (e.g. 1gbit, 10gbit; default: none)
# On any failure everything made so far is removed. scripts/cluster/stop.sh NAME removes the rest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/cluster/common.sh
source "$here/common.sh"

name=emu nodes=2 slots=2 rate=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --name) name=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    *) fail "unknown argument '$1' (see the top of $0)" ;;
  esac
done
[[ $nodes =~ ^[0-9]+$ && $nodes -ge 1 && $nodes -le 200 ]] || fail "--nodes $nodes: expected 1 to 200"
[[ $slots =~ ^[0-9]+$ && $slots -ge 1 ]] || fail "--slots $slots: expected a positive count"
cluster_vars "$name"
[[ $(id -u) -eq 0 ]] || fail "must run as root (it creates network and UTS namespaces)"
for tool in ip nsenter unshare mount umount; do command -v $tool >/dev/null || fail "needs $tool (iproute2, util-linux)"; done
[[ -z $rate ]] || command -v tc >/dev/null || fail "--rate needs tc (iproute2)"
if [[ -e $CLUSTER_DIR ]] || ip netns list | grep -q "^$CLUSTER_SWITCH\b"; then
  fail "cluster $name exists already (scripts/cluster/stop.sh $name removes it)"
fi

# Failures included: whatever was made is removed.
started=0
trap '[[ $started == 1 ]] || { "$here/stop.sh" "$name" >/dev/null 2>&1 || true; echo "$self: cluster $name not started (removed what was made)" >&2; }' EXIT
mkdir -p "$CLUSTER_DIR/uts"
echo "$nodes" > "$CLUSTER_DIR/nodes"
ip netns add "$CLUSTER_SWITCH"
ip -n "$CLUSTER_SWITCH" link set lo up
ip -n "$CLUSTER_SWITCH" link add br0 type bridge
ip -n "$CLUSTER_SWITCH" link set br0 up
: > "$CLUSTER_DIR/hostfile"
for i in $(seq "$nodes"); do
  ns=$(node_netns "$i")
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  # Made in the switch namespace with its peer straight in the node's: never in ours.
  ip -n "$CLUSTER_SWITCH" link add "port$i" type veth peer name eth0 netns "$ns"
  ip -n "$CLUSTER_SWITCH" link set "port$i" master br0 up
  ip -n "$ns" addr add "$CLUSTER_SUBNET.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  if [[ -n $rate ]]; then
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 1mb latency 50ms
    ip netns exec "$CLUSTER_SWITCH" tc qdisc add dev "port$i" root tbf rate "$rate" burst 1mb latency 50ms
  fi
  # A UTS namespace kept by a bind mount (no process needs to stay), with the node's hostname.
  touch "$CLUSTER_DIR/uts/$i"
  unshare --uts="$CLUSTER_DIR/uts/$i" hostname "$(node_host "$i")"
  echo "$(node_host "$i") slots=$slots" >> "$CLUSTER_DIR/hostfile"
done

# OpenMPI starts the other nodes' daemons through this instead of ssh.
cat > "$CLUSTER_DIR/node-shell" <<SH
#!/bin/sh
exec "$here/node-shell" "$name" "\$@"
SH
chmod +x "$CLUSTER_DIR/node-shell"
cat > "$CLUSTER_DIR/env" <<SH
# Source this on the head node (scripts/cluster/run.sh $name 1 ...) before mpirun or shardlm launch.
export OMPI_MCA_plm_rsh_agent=$CLUSTER_DIR/node-shell
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
SH

# Every node reaches the first over TCP: a connection to a closed port is refused (an answer)
# rather than timing out. No ping needed.
for i in $(seq 2 "$nodes"); do
  reply=$($(node_enter "$i") timeout 3 bash -c "exec 3<>/dev/tcp/$CLUSTER_SUBNET.1/9" 2>&1 || true)
  [[ $reply == *"Connection refused"* ]] || fail "node $i cannot reach node 1 over TCP: ${reply:-timed out}"
done
started=1
echo "cluster $name: $nodes nodes ($(node_host 1) .. $(node_host "$nodes"), $CLUSTER_SUBNET.1-$nodes)${rate:+, links at $rate}"
echo "hostfile: $CLUSTER_DIR/hostfile"
echo "run on a node: $here/run.sh $name 1 COMMAND...   (source $CLUSTER_DIR/env first for mpirun)"
