# shellcheck shell=bash disable=SC2034  # sourced; the variables are used by the scripts that source it
# Shared by the emulated-cluster scripts (docs/multinode.md): where a cluster keeps its state, the
# names of its namespaces, and how the scripts report. Sourced, not run.
#
# A cluster NAME is: one network namespace per node, shardlm-NAME-nodeI, holding the node's end of
# a veth pair (eth0, address 198.18.0.I/24) and its own UTS namespace (hostname NAME-nodeI,
# bind-mounted under the state directory); and a switch namespace, shardlm-NAME-sw, holding a
# bridge and the other end of every node's pair (portI). Nothing is created in the caller's own
# network namespace, and the addresses (198.18.0.0/15 is the range RFC 2544 sets aside for network
# tests) exist only inside these namespaces, which have no route out: no traffic can leave them.
CLUSTER_ROOT=/run/shardlm-cluster
CLUSTER_SUBNET=198.18.0   # node I is $CLUSTER_SUBNET.I

self=$(basename "$0")
fail() { echo "$self: $*" >&2; exit 1; }

# cluster_vars NAME: the state directory and namespace names of cluster NAME.
cluster_vars() {
  CLUSTER_NAME=$1
  [[ $CLUSTER_NAME =~ ^[a-z][a-z0-9]{0,11}$ ]] || fail "cluster name '$CLUSTER_NAME': expected 1-12 lowercase letters and digits, a letter first"
  CLUSTER_DIR=$CLUSTER_ROOT/$CLUSTER_NAME
  CLUSTER_SWITCH=shardlm-$CLUSTER_NAME-sw
}
node_netns() { echo "shardlm-$CLUSTER_NAME-node$1"; }
node_host() { echo "$CLUSTER_NAME-node$1"; }
# The node number of a hostname of this cluster (NAME-nodeI), or fail.
node_index() {
  local i=${1#"$CLUSTER_NAME"-node}
  [[ $1 == "$CLUSTER_NAME-node"* && $i =~ ^[0-9]+$ && -e $CLUSTER_DIR/uts/$i ]] || fail "no node '$1' in cluster $CLUSTER_NAME"
  echo "$i"
}
# node_enter I: the command prefix that runs a program on node I (its network and UTS namespaces;
# the file system, processes and users stay the machine's, as a shared file system would be).
node_enter() { echo nsenter --net=/run/netns/"$(node_netns "$1")" --uts="$CLUSTER_DIR/uts/$1" --; }
