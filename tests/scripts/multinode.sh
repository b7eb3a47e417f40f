#!/usr/bin/env bash
# Two nodes for real, emulated on this machine (scripts/cluster/, docs/multinode.md): 2 nodes x 2
# ranks, each node a network namespace with its own hostname, TCP between them, ranks started on the
# second node through OpenMPI's rsh agent with a fresh environment (as ssh gives).
#  1. FULL_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2, NO_SHARD, and LoRA and QLoRA under HYBRID_SHARD,
#     through `shardlm launch --nnodes 2 --hostfile` and through plain mpirun: the losses of 8 steps
#     equal one process's (1e-5 relative);
#  2. every rank prints its mesh (SHARDLM_PRINT_MESH, given to launch only: settings reach every
#     node's ranks): a hybrid shard group is the ranks of one node, and only groups within one node
#     use shared memory, and every group across the nodes (and none within one) takes the ring
#     collectives; SHARDLM_SHM=0 given to launch turns shared memory off on both nodes;
#  3. mpirun --map-by node (ranks 0,2 on one node, 1,3 on the other): hybrid shard groups still
#     follow the hosts, losses unchanged; nodes of 3 and 1 ranks: refused in one line naming both;
#  4. a checkpoint written on 2x2 resumes on one node (2 ranks) to the same losses;
#  5. the second node's processes killed: every rank of the first exits within collective_timeout +
#     8 s, and the job's output names the lost host;
#  6. the second node's link set down: every rank of both nodes exits within collective_timeout + 8 s
#     on its own (mpirun cannot reach the far side), the first node's naming the second's ranks and host.
# Needs root (namespaces); exits 77 (reported skipped) with the reason where it cannot run.
# Usage: multinode.sh SHARDLM SOURCE_DIR WORKDIR
set -euo pipefail
shardlm=$(realpath "$1")
src=$2
work=$3
# shellcheck source=tests/scripts/common.sh
source "$src/tests/scripts/common.sh"
ctl=$src/scripts/cluster
t_start=$(date +%s)
name=mt$$
emulated_cluster "$name" --nodes 2 --slots 2
rm -rf "$work" && mkdir -p "$work"
host1=$name-node1 host2=$name-node2
hostfile=$cluster/hostfile
# On node 1, as a user logged in to the head node would, with the cluster's OpenMPI settings.
on1() { "$ctl/run.sh" "$name" 1 bash -c "source $cluster/env && cd $work && exec \"\$@\"" on1 "$@"; }

"$shardlm" init --preset tiny --out "$work/init" --seed 3 >/dev/null
cat > "$work/run.yaml" <<YAML
model: $work/init
output_dir: $work/out
data: {train: builtin:addition, digits: 2, train_examples: 4000, eval_examples: 64}
seq_len: 16
micro_batch_size: 4
max_steps: 8
optimizer: {lr: 1e-3}
eval_every: 0
accuracy_examples: 0
progress: none
collective_timeout: 10
YAML
{ cat "$work/run.yaml"; printf 'lora:\n  rank: 8\n  alpha: 16\n  target_modules: all-linear\n'; } > "$work/lora.yaml"

# Global batch 16: one process x 16 rows, 4 ranks x 4.
"$shardlm" train --config "$work/run.yaml" output_dir="$work/ref" micro_batch_size=16 >/dev/null
"$shardlm" train --config "$work/lora.yaml" output_dir="$work/ref_lora" micro_batch_size=16 >/dev/null
"$shardlm" train --config "$work/lora.yaml" output_dir="$work/ref_qlora" micro_batch_size=16 lora.quantize_base=nf4 \
  >/dev/null

# same_as RUN REF: RUN's 8 losses (from rank 0's metrics) equal one process's REF, to 1e-5 relative.
same_as() { same_losses "$work/$1" "$work/$2" "$1"; }
# check_mesh LOG HYBRID: 4 mesh lines, 2 ranks per host; under HYBRID every shard group is the 2
# ranks of the rank's own host; a group that uses shared memory never spans hosts.
check_mesh() {
  local log=$1 hybrid=$2 lines
  lines=$(grep "^mesh: rank" "$log" || true)
  [[ $(wc -l <<<"$lines") -eq 4 && $(grep -c " on $host1:" <<<"$lines") -eq 2 && $(grep -c " on $host2:" <<<"$lines") -eq 2 ]] ||
    { cat "$log"; fail "$log: expected a mesh line from each of 4 ranks, 2 per node (SHARDLM_PRINT_MESH did not reach every node?)"; }
  while read -r line; do
    # "mesh: rank R on HOST: shard group [R@H R@H] shared memory, replicate group [R@H R@H] ring"
    local me shard shm_groups
    me=$(sed -E 's/^mesh: rank [0-9]+ on ([^:]+):.*/\1/' <<<"$line")
    shard=$(sed -E 's/.*shard group \[([^]]*)\].*/\1/' <<<"$line")
    if [[ $hybrid == 1 ]]; then
      [[ $(tr ' ' '\n' <<<"$shard" | grep -vc "@$me$" || true) -eq 0 && $(wc -w <<<"$shard") -eq 2 ]] ||
        fail "a shard group is not the ranks of one node: $line"
    fi
    shm_groups=$(grep -oE '\[[^]]*\] shared memory' <<<"$line" || true)
    while read -r g; do  # [all]: the world, which spans both nodes here
      [[ -z $g ]] && continue
      [[ $g != "[all]"* && $(grep -oE '@[^] ]+' <<<"$g" | sort -u | wc -l) -eq 1 ]] || fail "shared memory across hosts: $line"
    done <<<"$shm_groups"
    # Every group that spans both hosts goes around the ring (src/comm/ring_collectives.h), and no
    # group within one host does.
    local g hosts_in
    while read -r g; do
      [[ -z $g || $g == *"[self]"* ]] && continue
      [[ $g == *"[all]"* ]] && hosts_in=2 || hosts_in=$(grep -oE '@[^] ]+' <<<"$g" | sort -u | wc -l)
      if [[ $hosts_in -ge 2 ]]; then
        [[ $g == *"] ring" ]] || fail "a group across hosts does not use the ring: $line"
      else
        [[ $g != *"] ring" ]] || fail "a group within one host uses the ring: $line"
      fi
    done < <(grep -oE '(shard|replicate) group \[[^]]*\]( shared memory| ring)?' <<<"$line")
  done <<<"$lines"
}

runs=(full:FULL_SHARD:run hybrid:HYBRID_SHARD:run hz2:_HYBRID_SHARD_ZERO2:run noshard:NO_SHARD:run
  lora:HYBRID_SHARD:lora qlora:HYBRID_SHARD:qlora)
args_of() {  # the train arguments of a run spec  tag:STRATEGY:kind
  local strategy kind
  IFS=: read -r _ strategy kind <<<"$1"
  local cfg=$work/run.yaml extra=()
  [[ $kind != run ]] && cfg=$work/lora.yaml
  [[ $kind == qlora ]] && extra=(lora.quantize_base=nf4)
  echo train --config "$cfg" sharding_strategy="$strategy" "${extra[@]}"
}
ref_of() { case $1 in lora:*) echo ref_lora ;; qlora:*) echo ref_qlora ;; *) echo ref ;; esac; }

echo "1-2. 2 nodes x 2 ranks through shardlm launch --nnodes 2 --hostfile (SHARDLM_PRINT_MESH given to launch alone):"
for spec in "${runs[@]}"; do
  tag=${spec%%:*}
  # shellcheck disable=SC2046
  SHARDLM_PRINT_MESH=1 on1 "$shardlm" launch --nproc-per-node 2 --nnodes 2 --hostfile "$hostfile" -- \
    $(args_of "$spec") output_dir="$work/l_$tag" > "$work/l_$tag.log" 2>&1 || { cat "$work/l_$tag.log"; fail "launch $tag failed"; }
  same_as "l_$tag" "$(ref_of "$spec")"
  check_mesh "$work/l_$tag.log" "$([[ $spec == *HYBRID* ]] && echo 1 || echo 0)"
done
grep -q "shard group \[0@$host1 1@$host1\] shared memory" "$work/l_hybrid.log" ||
  { grep "^mesh" "$work/l_hybrid.log"; fail "the hybrid shard group on $host1 does not use shared memory"; }
echo "  hybrid shard groups: $(grep "^mesh: rank [02] " "$work/l_hybrid.log" | sed -E 's/.*shard group (\[[^]]*\]).*/\1/' | tr '\n' ' ')"
# SHARDLM_SHM=0 given to launch: no group of either node uses shared memory (before the fix, node 2's
# ranks kept it, took other collective paths than node 1's, and the job hung).
SHARDLM_SHM=0 SHARDLM_PRINT_MESH=1 on1 "$shardlm" launch --nproc-per-node 2 --nnodes 2 --hostfile "$hostfile" -- \
  train --config "$work/run.yaml" sharding_strategy=HYBRID_SHARD output_dir="$work/l_noshm" > "$work/l_noshm.log" 2>&1 ||
  { cat "$work/l_noshm.log"; fail "launch with SHARDLM_SHM=0 failed"; }
check_mesh "$work/l_noshm.log" 1
! grep -q "shared memory" "$work/l_noshm.log" || { grep "^mesh" "$work/l_noshm.log"; fail "SHARDLM_SHM=0 did not reach every rank"; }
same_as l_noshm ref
echo "  SHARDLM_SHM=0 given to launch: no rank on either node uses shared memory"
# bf16 on the wire: gathers in param_dtype bf16, reductions in reduce_dtype bf16 (the shard
# group's, and under hybrid the all-reduce across the nodes). Reductions round partial sums to bf16,
# which one process's bf16 run does not do, so the losses follow it to 1e-4 (seen: 2e-5), while
# f32's differ from it by more (seen: 3e-4): the runs did compute and communicate in bf16.
bf16=(mixed_precision.param_dtype=bf16 mixed_precision.reduce_dtype=bf16)
"$shardlm" train --config "$work/run.yaml" output_dir="$work/ref_bf16" micro_batch_size=16 "${bf16[@]}" >/dev/null
for strategy in FULL_SHARD HYBRID_SHARD; do
  on1 "$shardlm" launch --nproc-per-node 2 --nnodes 2 --hostfile "$hostfile" -- train --config "$work/run.yaml" \
    sharding_strategy=$strategy "${bf16[@]}" output_dir="$work/l_bf16_$strategy" > "$work/l_bf16_$strategy.log" 2>&1 ||
    { cat "$work/l_bf16_$strategy.log"; fail "launch bf16 $strategy failed"; }
  same_losses "$work/l_bf16_$strategy" "$work/ref_bf16" "bf16 on the wire, $strategy" 0 1e-4
done
! same_losses "$work/ref_bf16" "$work/ref" "bf16 against f32" 0 1e-4 >/dev/null 2>&1 ||
  fail "one process's bf16 losses equal f32's to 1e-4: bf16 is not in effect"

echo "1. the same through plain mpirun:"
mpirun_on1() {  # mpirun_on1 LOG MPIRUN_ARGS... -- TRAIN_ARGS...
  local log=$1; shift
  local margs=()
  while [[ $1 != -- ]]; do margs+=("$1"); shift; done
  shift
  on1 mpirun --hostfile "$hostfile" --bind-to none -x OMP_NUM_THREADS=1 -x SHARDLM_PRINT_MESH=1 "${margs[@]}" \
    "$shardlm" "$@" > "$log" 2>&1
}
for spec in "${runs[@]}"; do
  tag=${spec%%:*}
  # shellcheck disable=SC2046
  mpirun_on1 "$work/m_$tag.log" -np 4 --map-by ppr:2:node -- $(args_of "$spec") output_dir="$work/m_$tag" ||
    { cat "$work/m_$tag.log"; fail "mpirun $tag failed"; }
  same_as "m_$tag" "$(ref_of "$spec")"
done

echo "3. mpirun --map-by node (ranks 0,2 on $host1, 1,3 on $host2), HYBRID_SHARD:"
mpirun_on1 "$work/m_bynode.log" -np 4 --map-by node -- train --config "$work/run.yaml" sharding_strategy=HYBRID_SHARD \
  output_dir="$work/m_bynode" || { cat "$work/m_bynode.log"; fail "mpirun --map-by node failed"; }
check_mesh "$work/m_bynode.log" 1
grep -q "^mesh: rank 0 on $host1: shard group \[0@$host1 2@$host1\]" "$work/m_bynode.log" ||
  { grep "^mesh" "$work/m_bynode.log"; fail "--map-by node: rank 0's shard group is not ranks 0 and 2 of $host1"; }
same_as m_bynode ref
echo "  shard groups: $(grep "^mesh: rank [01] " "$work/m_bynode.log" | sed -E 's/.*shard group (\[[^]]*\]).*/\1/' | tr '\n' ' ')"
printf '%s slots=3\n%s slots=1\n' "$host1" "$host2" > "$work/unequal"
if on1 mpirun --hostfile "$work/unequal" --bind-to none -x OMP_NUM_THREADS=1 -np 4 "$shardlm" train \
  --config "$work/run.yaml" sharding_strategy=HYBRID_SHARD output_dir="$work/m_unequal" > "$work/m_unequal.log" 2>&1; then
  fail "nodes of 3 and 1 ranks were accepted for HYBRID_SHARD"
fi
errors=$(grep "shardlm: error:" "$work/m_unequal.log" || true)
[[ $(wc -l <<<"$errors") -eq 1 && $errors == *"$host1 3 ranks, $host2 1 rank"* ]] ||
  { cat "$work/m_unequal.log"; fail "unequal nodes: expected one error line naming both hosts and counts"; }
echo "  nodes of 3 and 1 ranks: $errors"

echo "4. the 2x2 hybrid run's step-4 checkpoint resumed on one node (2 ranks, FULL_SHARD):"
on1 "$shardlm" launch --nproc-per-node 2 --nnodes 2 --hostfile "$hostfile" -- train --config "$work/run.yaml" \
  sharding_strategy=HYBRID_SHARD save_every=4 output_dir="$work/ck" > "$work/ck.log" 2>&1 || { cat "$work/ck.log"; fail "2x2 with checkpoints failed"; }
same_as ck ref
on1 "$shardlm" launch --nproc-per-node 2 -- train --config "$work/run.yaml" micro_batch_size=8 \
  resume_from="$work/ck/checkpoints/step_00000004" output_dir="$work/ck1" > "$work/ck1.log" 2>&1 ||
  { cat "$work/ck1.log"; fail "resuming on one node failed"; }
/usr/bin/python3 - "$work/ck1/metrics.jsonl" "$work/ref/metrics.jsonl" <<'PY'
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if "loss" in r}
got, ref = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(got) == [5, 6, 7, 8], sorted(got)
rel = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in got)
assert rel <= 1e-5, f"resumed losses {got} differ from {ref}"
print(f"  steps 5-8 resumed on one node equal one process's (largest relative difference {rel:.1e})")
PY

# ---- failures: a long hybrid run, then node 2's processes killed or its link downed ----
rank_pids() {  # rank_pids NODE...: "RANK:PID" of the job's ranks on those nodes
  for n in "$@"; do
    for p in $(ip netns pids "shardlm-$name-node$n"); do
      r=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p') || true
      [[ -n $r ]] && grep -q "train" "/proc/$p/cmdline" 2>/dev/null && echo "$r:$p"
    done
  done
}
start_long() {  # start_long TAG: a 2x2 hybrid run through launch that trains until stopped
  on1 "$shardlm" launch --nproc-per-node 2 --nnodes 2 --hostfile "$hostfile" -- train --config "$work/run.yaml" \
    sharding_strategy=HYBRID_SHARD max_steps=1000000 progress=lines log_every=20 output_dir="$work/$1" > "$work/$1.log" 2>&1 &
  job=$!
  bg+=("$job")
  for _ in $(seq 300); do grep -q "^step 40/" "$work/$1.log" 2>/dev/null && break; sleep 0.1; done
  grep -q "^step 40/" "$work/$1.log" || { cat "$work/$1.log"; fail "$1: training did not start"; }
  [[ $(rank_pids 1 2 | wc -l) -eq 4 ]] || fail "$1: expected 4 ranks, found: $(rank_pids 1 2)"
}
# wait_gone LIMIT_S RANK:PID...: waits until every one of these processes is gone; prints the seconds.
wait_gone() {
  local limit=$1 t0 left; shift
  t0=$(date +%s%N)
  while :; do
    left=()
    for rp in "$@"; do  # a zombie has ended (its parent may not have reaped it yet)
      [[ -d /proc/${rp#*:} && $(awk '{print $3}' "/proc/${rp#*:}/stat" 2>/dev/null) != Z ]] && left+=("$rp")
    done
    [[ ${#left[@]} -eq 0 ]] && break
    (( ($(date +%s%N) - t0) / 1000000 < limit * 1000 )) || { echo "ranks (rank:pid) still alive $limit s later: ${left[*]}"; return 1; }
    sleep 0.1
  done
  echo $(( ($(date +%s%N) - t0) / 1000000 ))
}
limit=18  # collective_timeout 10 + 8

echo "5. $host2's processes killed (kill -9, ranks and OpenMPI daemon):"
start_long kill
mapfile -t survivors < <(rank_pids 1)
# shellcheck disable=SC2046
kill -KILL $(ip netns pids "shardlm-$name-node2")
ms=$(wait_gone $limit "${survivors[@]}") || { cat "$work/kill.log"; fail "$ms"; }
for _ in $(seq 50); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
kill -0 "$job" 2>/dev/null && fail "launch still runs after $host2 was killed and $host1's ranks ended"
rc=0; wait "$job" || rc=$?
[[ $rc -ne 0 ]] || fail "the job exited 0 after $host2 was killed"
grep -q "$host2" "$work/kill.log" || { cat "$work/kill.log"; fail "nothing names the lost host $host2"; }
echo "  $host1's ranks gone $ms ms after the kill; launch exit $rc; the output names $host2:"
grep -m 2 -E "$host2|rank [23]" "$work/kill.log" | sed 's/^/    /'

echo "6. $host2's link set down (its switch port: packets dropped, nobody told):"
start_long linkdown
mapfile -t all < <(rank_pids 1 2)
"$ctl/link.sh" "$name" 2 down
ms=$(wait_gone $limit "${all[@]}") || { cat "$work/linkdown.log"; fail "$ms"; }
echo "  all 4 ranks (both nodes) gone $ms ms after the link went down; $host1's ranks said:"
grep "did not complete within collective_timeout" "$work/linkdown.log" | sed 's/^/    /'
for r in 0 1; do
  grep -Eq "rank $r: .*rank [23] on $host2 does not answer" "$work/linkdown.log" ||
    { cat "$work/linkdown.log"; fail "rank $r did not name the ranks of $host2"; }
done
# mpirun's teardown waits for node 2's daemon (its TCP connection has not failed yet): not the ranks'
# business, and not checked; reported.
if kill -0 "$job" 2>/dev/null; then
  "$ctl/link.sh" "$name" 2 up
  for _ in $(seq 100); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$job" 2>/dev/null && state="still runs 10 s after the link came back up" || state="ended once the link came back up"
  echo "  launch (mpirun) outlived the ranks, waiting for $host2's daemon; it $state"
else
  echo "  launch (mpirun) ended too"
fi
echo "multinode checks passed in $(( $(date +%s) - t_start )) s"
