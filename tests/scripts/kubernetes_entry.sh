#!/usr/bin/env bash
# examples/kubernetes/entrypoint.sh, the container entry of the Kubeflow Trainer MPI runtime, run as
# the pods run it, on emulated nodes (scripts/cluster/: a network and UTS namespace per node): node 1
# is the launcher pod, nodes 2 and 3 the node pods (2 ranks each), with the hostfile and OMPI_MCA_*
# settings Kubeflow Trainer gives the launcher, in an environment as bare as a container's. The rsh
# agent stands in for ssh, and `sleep` for the node pods' sshd. There is no Kubernetes here: what the
# kubelet does is done by hand, SIGTERM to each pod's first process (the entry).
#   1. a pod group runs to the end: the launcher exits 0 with the final model; SIGTERM to an idle node
#      pod ends it at once, exit 0;
#   2. the pod group deleted past step 20 (SIGTERM to all three entries at once): the node pods pass
#      it to their ranks, which checkpoint; every entry exits within the grace period (node pods 0,
#      the launcher 75: stopped, to be restarted), and no process is left in any pod;
#   3. the pod group started again resumes (resume_from=auto) and ends with run 1's weights, bit for bit;
#   4. one node pod deleted alone (its Kubernetes node drained): the whole job checkpoints and the
#      launcher exits 75, while the other node pod runs on.
# Needs root (namespaces); exits 77 (reported skipped) with the reason where it cannot run.
# Usage: kubernetes_entry.sh SHARDLM SOURCE_DIR WORKDIR
set -euo pipefail
shardlm=$(realpath "$1")
src=$(realpath "$2")
work=$3
# shellcheck source=tests/scripts/common.sh
source "$src/tests/scripts/common.sh"
entry=$src/examples/kubernetes/entrypoint.sh
t_start=$(date +%s)
name=ke$$
emulated_cluster "$name" --nodes 3
rm -rf "$work" && mkdir -p "$work"
# What Kubeflow Trainer's ConfigMap holds: the node pods, numProcPerNode slots each.
printf '%s slots=2\n%s slots=2\n' "$name-node2" "$name-node3" >"$work/hostfile"
tiny_run "$shardlm" "$work"

# pod NODE ROLE LOG ARGS...: the entry on emulated node NODE as a container starts it (a bare
# environment: the image's PATH, the runtime's env), in the background; its pid is appended to bg.
pod() {
  local node=$1 role=$2 log=$3
  shift 3
  "$src/scripts/cluster/run.sh" "$name" "$node" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root SHARDLM="$shardlm" \
    CONFIG="$work/run.yaml" THREADS_PER_RANK=1 SSHD="sleep 100000" \
    OMPI_MCA_orte_default_hostfile="$work/hostfile" OMPI_MCA_orte_set_default_slots=2 \
    OMPI_MCA_orte_keep_fqdn_hostnames=true OMPI_MCA_plm_rsh_agent="$cluster/node-shell" \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$entry" "$role" "$@" >"$log" 2>&1 &
  bg+=($!)
}
# group LOG RUN ARGS...: a pod group (launcher on node 1, node pods on 2 and 3) training into
# $work/RUN, its entries' output in $work/LOG.log (the launcher), LOG.node2.log and LOG.node3.log;
# sets launcher, node2, node3 to the entries' pids.
group() {
  local log=$1 run=$2
  shift 2
  pod 2 node "$work/$log.node2.log"
  node2=$!
  pod 3 node "$work/$log.node3.log"
  node3=$!
  pod 1 launcher "$work/$log.log" output_dir="$work/$run" "$@"
  launcher=$!
}
# exits PID SECONDS: sets rc to the exit status of entry PID once it has ended, within SECONDS
# (else fail). Not in $(...): only this shell can wait for its children.
exits() {
  for _ in $(seq $(($2 * 10))); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  ! kill -0 "$1" 2>/dev/null || fail "entry pid $1 still runs $2 s later"
  rc=0
  wait "$1" || rc=$?
}
# pod_processes NODE...: the processes left in those pods (their network namespaces).
pod_processes() { for n in "$@"; do ip netns pids "shardlm-$name-node$n"; done; }

echo "1. a pod group run to the end:"
group full full
exits "$launcher" 300
[[ $rc == 0 ]] || { cat "$work/full.log"; fail "the launcher exited $rc"; }
grep -q "^resume_from: auto: no complete checkpoint" "$work/full.log" || fail "the first start did not say resume_from: auto found nothing"
grep -qE "^pre-flight: 4 ranks on 2 hosts \($name-node2: 0,1; $name-node3: 2,3\)" "$work/full.log" ||
  { grep "^pre-flight" "$work/full.log"; fail "the ranks are not 2 on each node pod"; }
[[ -f $work/full/model.safetensors ]] || fail "no final model"
kill -TERM "$node2" "$node3"
for p in "$node2" "$node3"; do exits "$p" 10; [[ $rc == 0 ]] || fail "an idle node pod exited $rc on SIGTERM"; done
echo "  launcher exit 0 with the final model (4 ranks on the 2 node pods); idle node pods exit 0 on SIGTERM"

echo "2. the pod group deleted past step 20 (SIGTERM to every pod):"
group cut cut save_every=1000
wait_step "$work/cut.log" 20 120
kill -TERM "$launcher" "$node2" "$node3"
grace=60
exits "$launcher" $grace && rc_l=$rc
exits "$node2" $grace && rc_2=$rc
exits "$node3" $grace && rc_3=$rc
[[ $rc_l == 75 && $rc_2 == 0 && $rc_3 == 0 ]] ||
  { tail -n 5 "$work"/cut*.log; fail "exit statuses: launcher $rc_l (expected 75), node pods $rc_2 and $rc_3 (expected 0)"; }
for n in 2 3; do
  grep -q "SIGTERM: passed to this pod's ranks" "$work/cut.node$n.log" ||
    { cat "$work/cut.node$n.log"; fail "node pod $n did not pass SIGTERM to its ranks"; }
done
grep -q "SIGTERM: left to the node pods" "$work/cut.log" || fail "the launcher did not note SIGTERM"
step=$(stopped_at "$work/cut.log" "$work/cut")
for _ in $(seq 50); do left=$(pod_processes 1 2 3); [[ -z $left ]] && break; sleep 0.1; done  # daemons ending
[[ -z $left ]] || { ps -o pid,args -p "${left//$'\n'/,}"; fail "processes left in the pods after their entries ended"; }
echo "  stopped after step $step with a complete checkpoint; launcher exit 75, node pods 0, within $grace s; nothing left running"

echo "3. the pod group started again:"
group restart cut save_every=1000
exits "$launcher" 300
[[ $rc == 0 ]] || { tail -n 5 "$work/restart.log"; fail "the restarted launcher exited $rc"; }
grep -q "^resumed from $(printf "%s/cut/checkpoints/step_%08d" "$work" "$step")" "$work/restart.log" ||
  fail "the restarted pod group did not resume from step $step"
cmp "$work/full/model.safetensors" "$work/cut/model.safetensors" || fail "the resumed run's final weights differ from run 1's"
kill -TERM "$node2" "$node3"
exits "$node2" 10 && exits "$node3" 10
echo "  resumed from step $step: final weights identical to the uninterrupted run"

echo "4. one node pod deleted alone:"
group drain drain save_every=1000
wait_step "$work/drain.log" 20 120
kill -TERM "$node3"
exits "$node3" $grace && rc_3=$rc
exits "$launcher" $grace && rc_l=$rc
[[ $rc_l == 75 && $rc_3 == 0 ]] || { tail -n 5 "$work"/drain*.log; fail "exit statuses: launcher $rc_l (expected 75), node pod 3 $rc_3 (expected 0)"; }
step=$(stopped_at "$work/drain.log" "$work/drain")
kill -0 "$node2" || fail "node pod 2 ended although only node pod 3 was deleted"
kill -TERM "$node2"
exits "$node2" 10
echo "  every rank stopped after step $step with a complete checkpoint; launcher exit 75; node pod 2 ran on"
echo "kubernetes entry checks passed in $(($(date +%s) - t_start)) s"
