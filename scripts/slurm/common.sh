# shellcheck shell=bash disable=SC2034  # sourced; the variables are used by the scripts that source it
# Shared by start-cluster.sh and stop-cluster.sh: where the one-machine cluster keeps its files, the
# steps both kinds of cluster take (packages, munge, slurm.conf), and how the scripts report. Sourced,
# not run.
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
# number was reused by another process does not count). daemon_alive NAME [PIDFILE]
daemon_alive() {
  local pid
  pid=$(cat "${2:-$SLURM_RUN_DIR/$1.pid}" 2>/dev/null) || return 1
  [[ -n $pid && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$1" ]]
}

# Installs Debian's Slurm (slurmctld, slurmd, slurm-client, which pull in munge) when a program is
# missing, through apt-get; `cannot` when that is impossible. The log goes to LOG.
slurm_install() {
  local apt_log=$1 need=() bin added_policy=0 ok=0
  for bin in slurmctld slurmd sinfo munged; do command -v "$bin" >/dev/null || need+=("$bin"); done
  ((${#need[@]})) || return 0
  command -v apt-get >/dev/null || cannot "${need[*]} missing and no apt-get to install them (Debian 12 expected)"
  echo "installing Debian's Slurm packages (missing: ${need[*]})"
  # The packages' install scripts try to start the daemons through invoke-rc.d with Debian's default
  # configuration; there is no init system here and we start them ourselves, so deny that for the
  # duration of the install (only if no policy is in place already, and removed afterwards).
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\n# temporary, from shardlm scripts/slurm/start-cluster.sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    added_policy=1
  fi
  apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge; }
  # A fresh machine may have no package lists yet: update once and retry.
  { apt_install || { apt-get update && apt_install; }; } >"$apt_log" 2>&1 && ok=1
  ((added_policy)) && rm -f /usr/sbin/policy-rc.d
  ((ok)) || cannot "apt-get could not install slurmctld slurmd slurm-client munge (see $apt_log)"
}

# Starts munged unless it answers already; a munged started here is marked by touching MARK, so
# that stop-cluster.sh stops only a munged one of these scripts started.
munge_start() {
  local mark=$1
  # Debian's munge package makes a key at install time; make one if it is missing (e.g. removed).
  if [[ ! -s /etc/munge/munge.key ]]; then
    mungekey --create --keyfile=/etc/munge/munge.key || fail "mungekey could not create /etc/munge/munge.key"
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
  # munged refuses to run as root; it runs as its own user, as Debian's service would run it.
  install -d -o munge -g munge -m 755 /run/munge
  runuser -u munge -- /usr/sbin/munged || fail "munged did not start (see /var/log/munge/munged.log)"
  touch "$mark"
  for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n </dev/null | unmunge >/dev/null 2>&1 || fail "munged started but munge -n | unmunge fails"
}

# Stops munged if MARK says one of these scripts started it, and removes MARK.
munge_stop() {
  local mark=$1 pid
  [[ -e $mark ]] || return 0
  # munged's pid file is its own (Debian: /run/munge/munged.pid).
  if pid=$(cat /run/munge/munged.pid 2>/dev/null) && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == munged ]]; then
    kill -TERM "$pid" && echo "stopped munged (pid $pid)"
  fi
  rm -f "$mark"
}

# The node's layout as slurmd sees it (CPUs, sockets, cores, threads), so that slurmd registers
# without a mismatch that would drain the node. RealMemory is left at its default: nothing here
# schedules by memory.
node_layout() {
  local layout
  layout=$(slurmd -C | head -1 | grep -oE '(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=[0-9]+' | tr '\n' ' ')
  [[ $layout == *CPUs=* ]] || fail "slurmd -C did not report this machine's CPUs"
  echo "$layout"
}

# slurm_conf_write FILE CTLD_HOST CTLD_ADDR STATE_DIR RUN_DIR LOG_DIR PER_NODE NODE_LINES PARTITION_LINE:
# the slurm.conf both kinds of cluster use (docs/slurm.md has the why of each setting): slurmctld's
# state in STATE_DIR/ctld, slurmd's spool in STATE_DIR/d. PER_NODE is "" for one slurmd, or "-%n"
# when several run on one machine (emulated nodes): slurmd expands %n to its node's name in its
# spool directory, pid file, log file and TmpFS (where PMIx keeps a step's files), so they differ.
slurm_conf_write() {
  local file=$1 ctld_host=$2 ctld_addr=$3 state=$4 run=$5 log=$6 per_node=$7 nodes=$8 partition=$9
  mkdir -p "$(dirname "$file")"
  cat >"$file" <<CONF
$SLURM_CONF_MARK; rewritten on each start
# A cluster for running shardlm's Slurm examples and tests (docs/slurm.md).
ClusterName=shardlm
SlurmctldHost=$ctld_host($ctld_addr)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d$per_node
SlurmctldPidFile=$run/slurmctld.pid
SlurmdPidFile=$run/slurmd$per_node.pid
SlurmctldLogFile=$log/slurmctld.log
SlurmdLogFile=$log/slurmd$per_node.log
${per_node:+TmpFS=$state/tmp$per_node}
# No cgroups: processes are tracked through /proc and tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# Without slurmdbd there is no sacct; finished jobs stay visible to \`scontrol show job\` for an hour,
# and each job's end (state, exit code) is appended to jobcomp.log.
MinJobAge=3600
JobCompType=jobcomp/filetxt
JobCompLoc=$log/jobcomp.log
# Jobs may be requeued (sbatch --requeue, scontrol requeue); a rebooted node returns to service.
JobRequeue=1
ReturnToService=2
# srun starts MPI ranks through PMIx (Debian's OpenMPI 4.1 has no PMI-1/PMI-2 client).
MpiDefault=pmix
# Time for ranks to checkpoint between SIGTERM and SIGKILL when a job is cancelled or times out.
KillWait=60
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
$nodes
$partition
CONF
}
