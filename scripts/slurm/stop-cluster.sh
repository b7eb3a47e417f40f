#!/usr/bin/env bash
# Stops the one-machine Slurm cluster that scripts/slurm/start-cluster.sh started: cancels its jobs
# (they would otherwise keep running under slurmstepd, which outlives slurmd), then stops slurmd,
# slurmctld and, if start-cluster.sh started it, munged. Packages, slurm.conf and saved state stay,
# so start-cluster.sh brings it back quickly. Stopping a cluster that is not running is not an error.
#   scripts/slurm/stop-cluster.sh               # the one-machine cluster
#   scripts/slurm/stop-cluster.sh --name NAME   # emulated nodes (start-cluster.sh --nodes N --name NAME):
#                                               # the whole emulated cluster NAME goes, Slurm's files with it
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/slurm/common.sh
source "$here/common.sh"

[[ $(id -u) -eq 0 ]] || fail "must run as root (it stops daemons started as root)"

if [[ ${1:-} == --name ]]; then
  [[ $# -eq 2 ]] || fail "usage: $self --name NAME"
  cluster=$(cd "$here/../cluster" && pwd)
  # shellcheck source=scripts/cluster/common.sh
  source "$cluster/common.sh"
  cluster_vars "$2"
  # The daemons, the jobs' steps and ranks all run in the nodes' namespaces: scripts/cluster/stop.sh
  # kills every process there, and removes Slurm's state, logs and pid files with the cluster's
  # directory. munged is the machine's: stopped only if this cluster started it and no other
  # cluster of these scripts still runs.
  if [[ -e $CLUSTER_DIR/slurm/munged.started ]]; then
    others=0
    daemon_alive slurmctld && others=1
    for pidfile in "$CLUSTER_ROOT"/*/slurm/run/slurmctld.pid; do
      [[ -e $pidfile && $pidfile != "$CLUSTER_DIR"/* ]] && daemon_alive slurmctld "$pidfile" && others=1
    done
    ((others)) && rm -f "$CLUSTER_DIR/slurm/munged.started"
    munge_stop "$CLUSTER_DIR/slurm/munged.started"
  fi
  exec "$cluster/stop.sh" "$CLUSTER_NAME"
fi
[[ $# -eq 0 ]] || fail "unknown arguments '$*' (see the top of $0)"

if daemon_alive slurmctld && command -v squeue >/dev/null; then
  jobs=$(squeue -h -t RUNNING,PENDING,SUSPENDED,COMPLETING -o %i 2>/dev/null || true)
  if [[ -n $jobs ]]; then
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null || true
    for _ in $(seq 150); do [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break; sleep 0.2; done
  fi
fi

# TERM, then wait up to 10 s for the daemon to go before KILL.
stop() {
  local name=$1 pid
  daemon_alive "$name" || return 0
  pid=$(cat "$SLURM_RUN_DIR/$name.pid")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
  [[ -d /proc/$pid ]] && kill -KILL "$pid" 2>/dev/null || true
  echo "stopped $name (pid $pid)"
}
stop slurmd
stop slurmctld
munge_stop "$SLURM_RUN_DIR/munged.started"
