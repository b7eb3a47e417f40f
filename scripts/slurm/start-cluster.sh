#!/usr/bin/env bash
# Starts a Slurm cluster on this host, as root, without systemd: enough to run
# examples/slurm/finetune.sbatch (srun steps, scancel signals, requeue) exactly as on a real cluster.
# Either one node, this machine, or N emulated nodes (scripts/cluster/: network and UTS namespaces).
#
#   scripts/slurm/start-cluster.sh     # installs Debian's Slurm if missing, starts it, waits for an idle node
#   scripts/slurm/stop-cluster.sh      # stops what this started
#   scripts/slurm/start-cluster.sh --nodes N [--name NAME]   # N emulated nodes NAME-node1..N (default name slurm)
#   scripts/slurm/stop-cluster.sh --name NAME                 # stops them and removes the emulated cluster
#
# A second call finds the running cluster and leaves it alone. Only Debian packages are installed
# (slurmctld, slurmd, slurm-client, which pull in munge), through apt-get.
#
# What it sets up, and why (docs/slurm.md):
#   - munge authentication (what Debian's packages depend on anyway; Slurm 22.05 still has auth/none,
#     but munge is what every real cluster runs, so jobs here see the same thing);
#   - one node: /etc/slurm/slurm.conf, marked as written by this script (a slurm.conf without the mark
#     is never overwritten): one node named `hostname -s` at 127.0.0.1 with the CPUs slurmd detects,
#     proctrack/linuxproc and task/none (no cgroups, which containers often do not delegate),
#     no accounting daemon, JobRequeue=1, MpiDefault=pmix (what Debian's OpenMPI 4.1 speaks), one
#     partition `local`; slurmctld and slurmd as root, daemonized, logs in /var/log/slurm, state in
#     /var/spool/shardlm-slurm;
#   - N emulated nodes: scripts/cluster/start.sh --name NAME --nodes N makes the nodes; the same
#     settings go to /run/shardlm-cluster/NAME/slurm/slurm.conf (with it its state, logs and pid
#     files, removed with the cluster), nodes NAME-node1..N at 198.18.0.1..N, partition `nodes`;
#     slurmctld runs on node 1 and one slurmd on each node, in the node's namespaces. Clients run on
#     a node with SLURM_CONF set: scripts/cluster/run.sh NAME 1 bash -c 'source
#     /run/shardlm-cluster/NAME/slurm/env && sbatch ...'. Nothing of it touches /etc/slurm or a
#     one-machine cluster running beside it (the ports are the namespaces' own).
# Exit status: 0 when the nodes are idle (or already running jobs); 2 when this machine cannot run it
# at all (not root, no apt-get, packages not installable, no namespaces); 1 for anything else, with
# one line saying what.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/slurm/common.sh
source "$here/common.sh"

nodes=0 name=slurm
while [[ $# -gt 0 ]]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    *) fail "unknown argument '$1' (see the top of $0)" ;;
  esac
done
[[ $nodes =~ ^[0-9]+$ ]] || fail "--nodes $nodes: expected a node count"
[[ $(id -u) -eq 0 ]] || cannot "must run as root (it installs packages and starts slurmctld and slurmd as root)"
if ((nodes)); then
  for tool in ip nsenter unshare; do command -v $tool >/dev/null || cannot "emulated nodes need $tool (iproute2, util-linux)"; done
  unshare --net --uts true 2>/dev/null || cannot "emulated nodes need network and UTS namespaces (unshare --net --uts failed: no CAP_SYS_ADMIN?)"
fi
mkdir -p "$SLURM_STATE_DIR/ctld" "$SLURM_STATE_DIR/d" "$SLURM_LOG_DIR" "$SLURM_RUN_DIR"

# --- 1. Packages -------------------------------------------------------------------------------------
slurm_install "$SLURM_LOG_DIR/apt-get.log"

# --- N emulated nodes ----------------------------------------------------------------------------------
if ((nodes)); then
  cluster=$(cd "$here/../cluster" && pwd)
  # shellcheck source=scripts/cluster/common.sh
  source "$cluster/common.sh"  # cluster_vars, node_enter, ...; its fail() is this one's
  cluster_vars "$name"
  dir=$CLUSTER_DIR/slurm
  conf=$dir/slurm.conf
  # on I COMMAND...: runs COMMAND on node I with this cluster's slurm.conf.
  # shellcheck disable=SC2046  # node_enter is a command prefix
  on() { local i=$1; shift; $(node_enter "$i") env SLURM_CONF="$conf" "$@"; }
  if [[ -e $CLUSTER_DIR ]]; then
    if ! daemon_alive slurmctld "$dir/run/slurmctld.pid" || ! on 1 scontrol ping 2>/dev/null | grep -q UP; then
      fail "emulated cluster $name exists without a running Slurm (scripts/slurm/stop-cluster.sh --name $name removes it)"
    fi
    echo "Slurm already running on emulated cluster $name: $(on 1 sinfo -h -o '%P %D node(s) %t')"
    exit 0
  fi
  "$cluster/start.sh" --name "$name" --nodes "$nodes" >/dev/null
  # Failures included: whatever was made is removed.
  started=0
  trap '[[ $started == 1 ]] || { "$here/stop-cluster.sh" --name "$name" >/dev/null 2>&1 || true; echo "$self: Slurm on $name not started (removed what was made)" >&2; }' EXIT
  mkdir -p "$dir/run" "$dir/log"
  for i in $(seq "$nodes"); do mkdir -p "$dir/d-$(node_host "$i")" "$dir/tmp-$(node_host "$i")"; done
  munge_start "$dir/munged.started"  # one munged for the machine: its socket is a file, seen from every node
  layout=$(node_layout)
  node_lines=$(for i in $(seq "$nodes"); do echo "NodeName=$(node_host "$i") NodeAddr=$CLUSTER_SUBNET.$i ${layout}State=UNKNOWN"; done)
  slurm_conf_write "$conf" "$(node_host 1)" "$CLUSTER_SUBNET.1" "$dir" "$dir/run" "$dir/log" "-%n" "$node_lines" \
    "PartitionName=nodes Nodes=$CLUSTER_NAME-node[1-$nodes] Default=YES MaxTime=INFINITE State=UP"
  echo "export SLURM_CONF=$conf" >"$dir/env"
  on 1 slurmctld -i || fail "slurmctld did not start on $(node_host 1) (see $dir/log/slurmctld.log)"
  for _ in $(seq 100); do on 1 scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
  on 1 scontrol ping 2>/dev/null | grep -q UP || fail "slurmctld is not answering (see $dir/log/slurmctld.log)"
  for i in $(seq "$nodes"); do
    on "$i" slurmd || fail "slurmd did not start on $(node_host "$i") (see $dir/log/slurmd-$(node_host "$i").log)"
  done
  idle=0
  for _ in $(seq 150); do
    idle=$(on 1 sinfo -h -N -t idle,alloc,mix -o '%N' 2>/dev/null | sort -u | wc -l)
    ((idle == nodes)) && break
    sleep 0.2
  done
  ((idle == nodes)) || fail "$idle of $nodes nodes idle after 30 s (see $dir/log/, and: $(on 1 sinfo -h -N -o '%N %t' | tr '\n' ' '))"
  started=1
  echo "Slurm running on emulated cluster $name: partition nodes, $nodes nodes $(node_host 1)..$(node_host "$nodes") ($layout); logs in $dir/log"
  echo "clients: $cluster/run.sh $name 1 bash -c 'source $dir/env && sinfo'"
  exit 0
fi

# --- 2. Already running? -----------------------------------------------------------------------------
if daemon_alive slurmctld && daemon_alive slurmd && scontrol ping 2>/dev/null | grep -q UP; then
  echo "Slurm already running: $(sinfo -h -o '%P %D node(s) %t %c CPUs' | head -1)"
  exit 0
fi

# --- 3. munge ----------------------------------------------------------------------------------------
munge_start "$SLURM_RUN_DIR/munged.started"

# --- 4. slurm.conf -----------------------------------------------------------------------------------
node=$(hostname -s)
if [[ -e "$SLURM_CONF_FILE" ]] && ! head -1 "$SLURM_CONF_FILE" | grep -qF "$SLURM_CONF_MARK"; then
  fail "$SLURM_CONF_FILE exists and was not written by this script; move it away to let it write its own"
fi
layout=$(node_layout)
slurm_conf_write "$SLURM_CONF_FILE" "$node" 127.0.0.1 "$SLURM_STATE_DIR" "$SLURM_RUN_DIR" "$SLURM_LOG_DIR" "" \
  "NodeName=$node NodeAddr=127.0.0.1 ${layout}State=UNKNOWN" \
  "PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP"

# --- 5. Daemons --------------------------------------------------------------------------------------
# Both daemonize themselves and write their pid files; -i lets slurmctld start even if saved state
# from an older configuration cannot be read.
daemon_alive slurmctld || slurmctld -i || fail "slurmctld did not start (see $SLURM_LOG_DIR/slurmctld.log)"
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
scontrol ping 2>/dev/null | grep -q UP || fail "slurmctld is not answering (see $SLURM_LOG_DIR/slurmctld.log)"
daemon_alive slurmd || slurmd || fail "slurmd did not start (see $SLURM_LOG_DIR/slurmd.log)"

# --- 6. Wait for the node ----------------------------------------------------------------------------
state=""
for i in $(seq 150); do
  state=$(sinfo -h -n "$node" -o '%t' 2>/dev/null | head -1)
  case "$state" in
    idle | alloc | mix) break ;;
    # A node left down or drained by an earlier run (e.g. slurmd killed mid-job) is put back.
    down* | drain* | drng*) ((i % 10 == 1)) && scontrol update NodeName="$node" State=RESUME 2>/dev/null || true ;;
  esac
  sleep 0.2
done
case "$state" in
  idle | alloc | mix) ;;
  *) fail "node $node is '$state' after 30 s, not idle (see $SLURM_LOG_DIR/slurmd.log, scontrol show node $node)" ;;
esac
echo "Slurm running: partition local, node $node ($layout), state $state; logs in $SLURM_LOG_DIR"
