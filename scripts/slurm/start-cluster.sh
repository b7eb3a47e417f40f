#!/usr/bin/env bash
# Starts a one-machine Slurm cluster on this host, as root, without systemd: enough to run
# examples/slurm/finetune.sbatch (srun steps, scancel signals, requeue) exactly as on a real cluster.
#
#   scripts/slurm/start-cluster.sh     # installs Debian's Slurm if missing, starts it, waits for an idle node
#   scripts/slurm/stop-cluster.sh      # stops what this started
#
# A second call finds the running cluster and leaves it alone. Only Debian packages are installed
# (slurmctld, slurmd, slurm-client, which pull in munge), through apt-get.
#
# What it sets up, and why (docs/slurm.md):
#   - munge authentication (what Debian's packages depend on anyway; Slurm 22.05 still has auth/none,
#     but munge is what every real cluster runs, so jobs here see the same thing);
#   - /etc/slurm/slurm.conf, marked as written by this script (a slurm.conf without the mark is never
#     overwritten): one node named `hostname -s` at 127.0.0.1 with the CPUs slurmd detects,
#     proctrack/linuxproc and task/none (no cgroups, which containers often do not delegate),
#     no accounting daemon, JobRequeue=1, MpiDefault=pmix (what Debian's OpenMPI 4.1 speaks), one
#     partition `local`;
#   - slurmctld and slurmd as root, daemonized, logs in /var/log/slurm, state in /var/spool/shardlm-slurm.
# Exit status: 0 when the node is idle (or already running jobs); 2 when this machine cannot run it at
# all (not root, no apt-get, packages not installable); 1 for anything else, with one line saying what.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/slurm/common.sh
source "$here/common.sh"

[[ $(id -u) -eq 0 ]] || cannot "must run as root (it installs packages and starts slurmctld and slurmd as root)"
mkdir -p "$SLURM_STATE_DIR/ctld" "$SLURM_STATE_DIR/d" "$SLURM_LOG_DIR" "$SLURM_RUN_DIR"

# --- 1. Packages -------------------------------------------------------------------------------------
need=()
for bin in slurmctld slurmd sinfo munged; do command -v "$bin" >/dev/null || need+=("$bin"); done
if ((${#need[@]})); then
  command -v apt-get >/dev/null || cannot "${need[*]} missing and no apt-get to install them (Debian 12 expected)"
  echo "installing Debian's Slurm packages (missing: ${need[*]})"
  # The packages' install scripts try to start the daemons through invoke-rc.d with Debian's default
  # configuration; there is no init system here and we start them ourselves below, so deny that for
  # the duration of the install (only if no policy is in place already, and removed afterwards).
  added_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\n# temporary, from shardlm scripts/slurm/start-cluster.sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    added_policy=1
  fi
  apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge; }
  # A fresh machine may have no package lists yet: update once and retry.
  ok=0
  apt_log=$SLURM_LOG_DIR/apt-get.log
  { apt_install || { apt-get update && apt_install; }; } >"$apt_log" 2>&1 && ok=1
  ((added_policy)) && rm -f /usr/sbin/policy-rc.d
  ((ok)) || cannot "apt-get could not install slurmctld slurmd slurm-client munge (see $apt_log)"
fi

# --- 2. Already running? -----------------------------------------------------------------------------
if daemon_alive slurmctld && daemon_alive slurmd && scontrol ping 2>/dev/null | grep -q UP; then
  echo "Slurm already running: $(sinfo -h -o '%P %D node(s) %t %c CPUs' | head -1)"
  exit 0
fi

# --- 3. munge ----------------------------------------------------------------------------------------
# Debian's munge package makes a key at install time; make one if it is missing (e.g. removed).
if [[ ! -s /etc/munge/munge.key ]]; then
  mungekey --create --keyfile=/etc/munge/munge.key || fail "mungekey could not create /etc/munge/munge.key"
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
fi
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  # munged refuses to run as root; it runs as its own user, as Debian's service would run it.
  install -d -o munge -g munge -m 755 /run/munge
  runuser -u munge -- /usr/sbin/munged || fail "munged did not start (see /var/log/munge/munged.log)"
  touch "$SLURM_RUN_DIR/munged.started"  # so stop-cluster.sh stops only a munged this script started
  for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n </dev/null | unmunge >/dev/null 2>&1 || fail "munged started but munge -n | unmunge fails"
fi

# --- 4. slurm.conf -----------------------------------------------------------------------------------
node=$(hostname -s)
if [[ -e "$SLURM_CONF_FILE" ]] && ! head -1 "$SLURM_CONF_FILE" | grep -qF "$SLURM_CONF_MARK"; then
  fail "$SLURM_CONF_FILE exists and was not written by this script; move it away to let it write its own"
fi
# The node's layout as slurmd sees it (CPUs, sockets, cores, threads), so that slurmd registers
# without a mismatch that would drain the node. RealMemory is left at its default: nothing here
# schedules by memory.
layout=$(slurmd -C | head -1 | grep -oE '(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=[0-9]+' | tr '\n' ' ')
[[ $layout == *CPUs=* ]] || fail "slurmd -C did not report this machine's CPUs"
mkdir -p "$(dirname "$SLURM_CONF_FILE")"
cat >"$SLURM_CONF_FILE" <<EOF
$SLURM_CONF_MARK; rewritten on each start
# A one-machine cluster for running shardlm's Slurm examples and tests (docs/slurm.md).
ClusterName=shardlm
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$SLURM_STATE_DIR/ctld
SlurmdSpoolDir=$SLURM_STATE_DIR/d
SlurmctldPidFile=$SLURM_RUN_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_RUN_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_LOG_DIR/slurmctld.log
SlurmdLogFile=$SLURM_LOG_DIR/slurmd.log
# No cgroups: processes are tracked through /proc and tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# Without slurmdbd there is no sacct; finished jobs stay visible to \`scontrol show job\` for an hour,
# and each job's end (state, exit code) is appended to jobcomp.log.
MinJobAge=3600
JobCompType=jobcomp/filetxt
JobCompLoc=$SLURM_LOG_DIR/jobcomp.log
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
NodeName=$node NodeAddr=127.0.0.1 ${layout}State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

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
