#!/usr/bin/env bash
# Stops the one-machine Slurm cluster that scripts/slurm/start-cluster.sh started: cancels its jobs
# (they would otherwise keep running under slurmstepd, which outlives slurmd), then stops slurmd,
# slurmctld and, if start-cluster.sh started it, munged. Packages, slurm.conf and saved state stay,
# so start-cluster.sh brings it back quickly. Stopping a cluster that is not running is not an error.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/slurm/common.sh
source "$here/common.sh"

[[ $(id -u) -eq 0 ]] || fail "must run as root (it stops daemons started as root)"

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
if [[ -e $SLURM_RUN_DIR/munged.started ]]; then
  # munged's pid file is its own (Debian: /run/munge/munged.pid).
  if pid=$(cat /run/munge/munged.pid 2>/dev/null) && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == munged ]]; then
    kill -TERM "$pid" && echo "stopped munged (pid $pid)"
  fi
  rm -f "$SLURM_RUN_DIR/munged.started"
fi
