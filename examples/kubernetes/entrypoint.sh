#!/usr/bin/env bash
# The container entry of shardlm's pods under Kubeflow Trainer's MPI runtime (runtime.yaml,
# docs/kubernetes.md): the same image and script in every pod, in one of two roles.
#
#   entrypoint.sh node                   a node pod: runs sshd in the foreground, through which mpirun
#                                        on the launcher starts this pod's ranks
#   entrypoint.sh launcher [key=value]   the launcher pod: `shardlm launch` over the pods of the
#                                        hostfile Kubeflow Trainer mounts, `train --config $CONFIG
#                                        resume_from=auto key=value...`
#
# Environment:
#   CONFIG            launcher: the training YAML (required), on the volume every pod mounts; its
#                     output_dir must be there too (checkpoints are written by every rank)
#   SHARDLM           the shardlm executable (default: shardlm on PATH)
#   HOSTFILE          launcher: the OpenMPI hostfile (default: $OMPI_MCA_orte_default_hostfile, which
#                     Kubeflow Trainer sets to /etc/mpi/hostfile)
#   NPROC_PER_NODE    launcher: ranks per node pod (default: $OMPI_MCA_orte_set_default_slots, which
#                     Kubeflow Trainer sets to numProcPerNode, else the hostfile's first slots=)
#   THREADS_PER_RANK  launcher: OpenMP threads per rank (default: shardlm launch's, this pod's cores /
#                     ranks per node)
#   SSHD              node: the ssh daemon's command line (default: /usr/sbin/sshd -De -f
#                     /home/mpiuser/.sshd_config, the Kubeflow MPI images' convention)
#
# Every start is `resume_from=auto`: the first one starts from the model, a restarted pod group from
# the newest complete checkpoint in output_dir.
#
# Stopping (Kubernetes sends SIGTERM to the first process of each container of a pod it deletes, and
# SIGKILL terminationGracePeriodSeconds later):
#   - node: SIGTERM is passed once to the shardlm ranks running in this pod. A rank that gets it
#     stops every rank of the job after the same step (the ranks agree on it), and they write a
#     checkpoint and exit 0 (save_on_signal). The script waits until this pod's ranks are gone, then
#     stops sshd and exits 0. So whether the whole pod group is deleted (a TrainJob deleted or
#     suspended, a preemption) or one node pod alone (its Kubernetes node drained), the job saves.
#   - launcher: SIGTERM is noted, not passed on: a second signal to a rank ends it at once, without
#     saving, and the node pods have passed it already. The script waits for the job to end. (A
#     launcher pod deleted alone is not saved: mpirun dies with it, and its ranks with mpirun.)
#   - launcher exit status: launch's, except 75 when the run was stopped by a signal with a complete
#     checkpoint: the training is not finished, so the pod group must not count as succeeded; with
#     the runtime's failurePolicy the JobSet restarts it, and the new launcher resumes. (A pod whose
#     SIGTERM comes late, after the job agreed to stop and saved, may kill its ranks as they end:
#     mpirun then exits non-zero; the checkpoint is complete all the same, and the exit is 75.)
# shellcheck disable=SC2317  # stop_node runs from a trap
set -euo pipefail

self=entrypoint.sh
say() { echo "$self: $*" >&2; }
SHARDLM=${SHARDLM:-shardlm}

# The pids of the shardlm ranks in this pod: processes named shardlm that mpirun started (they have
# OMPI_COMM_WORLD_RANK) in this pod's network namespace. In a pod that is every such process the
# pod's PID namespace shows; on a machine shared by several emulated pods (tests), it keeps to ours.
pod_ranks() {
  local p comm
  for p in /proc/[0-9]*; do
    { read -r comm <"$p/comm"; } 2>/dev/null || continue
    [[ $comm == shardlm && $p/ns/net -ef /proc/$$/ns/net ]] || continue
    { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -q '^OMPI_COMM_WORLD_RANK=' && echo "${p#/proc/}"
  done
  return 0
}

node() {
  local sshd_cmd
  read -r -a sshd_cmd <<<"${SSHD:-/usr/sbin/sshd -De -f /home/mpiuser/.sshd_config}"
  "${sshd_cmd[@]}" &
  sshd=$!
  trap stop_node TERM INT
  status=0
  wait "$sshd" || status=$?
  say "${sshd_cmd[0]} exited with status $status"
  exit "$status"
}
stop_node() {
  local ranks
  trap '' TERM INT  # once: a second signal would end the ranks without a checkpoint
  mapfile -t ranks < <(pod_ranks)
  if ((${#ranks[@]})); then
    say "SIGTERM: passed to this pod's ranks (pids ${ranks[*]}); they stop after their current step and save"
    kill -TERM "${ranks[@]}" 2>/dev/null || true
    while [[ -n $(pod_ranks) ]]; do sleep 0.5; done
    say "this pod's ranks have exited"
  fi
  kill -TERM "$sshd" 2>/dev/null || true
  wait "$sshd" 2>/dev/null || true
  exit 0
}

launcher() {
  local hostfile nnodes per_node args log status
  [[ -n ${CONFIG:-} && -f $CONFIG ]] || { say "set CONFIG to the training YAML (CONFIG=${CONFIG:-} is not a file)"; exit 2; }
  hostfile=${HOSTFILE:-${OMPI_MCA_orte_default_hostfile:-/etc/mpi/hostfile}}
  [[ -f $hostfile ]] || { say "no hostfile at $hostfile (Kubeflow Trainer's MPI runtime mounts it; or set HOSTFILE)"; exit 2; }
  nnodes=$(grep -cE '^[[:space:]]*[^#[:space:]]' "$hostfile" || true)
  per_node=${NPROC_PER_NODE:-${OMPI_MCA_orte_set_default_slots:-$(grep -m1 -oE 'slots=[0-9]+' "$hostfile" | cut -d= -f2)}}
  [[ $nnodes -ge 1 && $per_node =~ ^[1-9][0-9]*$ ]] ||
    { say "$hostfile: expected node lines with slots=N (found $nnodes nodes, ${per_node:-no} ranks per node)"; exit 2; }
  args=(--nproc-per-node "$per_node" --nnodes "$nnodes" --hostfile "$hostfile")
  [[ -z ${THREADS_PER_RANK:-} ]] || args+=(--threads-per-rank "$THREADS_PER_RANK")
  trap 'say "SIGTERM: left to the node pods, which pass it to their ranks; waiting for the job to end"' TERM INT
  log=$(mktemp)
  # In the foreground: a trap runs once the pipeline has ended, and launch's output is seen as it comes.
  status=0
  "$SHARDLM" launch "${args[@]}" -- train --config "$CONFIG" resume_from=auto "$@" 2>&1 | tee "$log" || status=${PIPESTATUS[0]}
  # Stopped with a complete checkpoint: 75, whatever launch's status. (Pods get their SIGTERM at
  # slightly different times: a rank whose pod's SIGTERM comes after the job agreed to stop, and after
  # it saved, may die of it while ending, and mpirun then reports that rank and exits non-zero.)
  if grep -qE "^stopped by a signal after step [0-9]+: checkpoint .* is complete" "$log"; then
    rm -f "$log"
    say "the run was stopped and saved its checkpoint (launch exit $status); exit 75 so that the pod group is restarted and resumes"
    exit 75
  fi
  rm -f "$log"
  exit "$status"
}

case ${1:-} in
  node) node ;;
  launcher) shift; launcher "$@" ;;
  *) say "usage: $self node | launcher [key=value ...]"; exit 2 ;;
esac
