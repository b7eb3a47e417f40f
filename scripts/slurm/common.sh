# shellcheck shell=bash disable=SC2034  # sourced; the variables are used by the scripts that source it
# Shared by start-cluster.sh and stop-cluster.sh: where the one-machine cluster keeps its files, and
# how the scripts report. Sourced, not run.
SLURM_CONF_FILE=/etc/slurm/slurm.conf          # where sinfo, sbatch, srun look without SLURM_CONF
SLURM_CONF_MARK="# written by shardlm scripts/slurm/start-cluster.sh"
SLURM_STATE_DIR=/var/spool/shardlm-slurm       # slurmctld's saved state (ctld/), slurmd's spool (d/)
SLURM_LOG_DIR=/var/log/slurm
SLURM_RUN_DIR=/run/shardlm-slurm               # pid files, and a mark when munged was started here

self=$(basename "$0")
# One line naming what failed. `cannot`: this machine cannot run Slurm at all (exit 2, which the
# test reports as skipped); `fail`: anything else (exit 1).
fail() { echo "$self: $*" >&2; exit 1; }
cannot() { echo "$self: cannot run Slurm here: $*" >&2; exit 2; }

# Whether the daemon named by its pid file is alive and is that program (a stale pid file whose
# number was reused by another process does not count).
daemon_alive() {
  local pid
  pid=$(cat "$SLURM_RUN_DIR/$1.pid" 2>/dev/null) || return 1
  [[ -n $pid && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$1" ]]
}
