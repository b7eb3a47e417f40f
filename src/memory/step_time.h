// Step-time model: how long a training step takes on given hardware, per strategy and world size,
// from the same dry run that estimates memory (estimator.h). No second copy of the engine's plan:
// the dry run records rank 0's work in the order the engine does it (WorkEvent: the arithmetic of
// each op, each collective from issue to wait, on the shard or the replicate group), and this model
// replays that sequence on two clocks, compute and communication:
//   - compute runs the recorded FLOPs (matmuls, attention) at the achieved rate of one rank
//     (Hardware::flops_per_s). The bytes the memory-bound ops move (elementwise ops, norms, casts,
//     the optimizer) run at Hardware::memory_bytes_per_s when it is given; without it they are
//     folded into the FLOP rate, measured on real training. The two differ where a rank's shard
//     size changes and its FLOPs do not: a hybrid rank steps AdamW over twice the elements of a
//     FULL_SHARD rank of the same world (bench/RESULTS.md, 2026-11-27, session 13);
//   - a collective starts when it is issued and the links it uses are free (FIFO; a node's links
//     within it and its links to other nodes are two resources that run at once), and lasts
//     steps * latency + bytes / bandwidth, where the bandwidth is the slower of the rank's
//     intra-node link and its share of the node's inter-node link (below);
//   - a wait holds compute until its collective ends. With overlap off communication runs only
//     while compute waits: the step is their sum;
//   - on CPU ranks (Hardware::host_copy_bytes_per_s) every byte a rank sends also takes its cores'
//     time, TCP's and the shared-memory path's copies, added to the compute clock: on emulated
//     nodes where 4 ranks share 2 cores, the links at 10 Gbit/s cost compute that the overlap alone
//     did not show (bench/RESULTS.md, 2026-11-27).
//
// Bandwidth of a group spanning nodes (ring accounting, ranks placed node by node): a ring over
// n nodes with m of its ranks on each crosses out of every node once, and that link carries the V
// bytes each rank sends. The node's ranks belong to ranks_per_node / m such groups at once (all
// of HYBRID_SHARD's replicate groups reduce together), so a node sends (ranks_per_node / m) * V
// over its inter-node bandwidth. FULL_SHARD's one ring (m = ranks_per_node) moves V per node;
// HYBRID_SHARD's replicate groups (m = 1) move ranks_per_node * V, of a smaller V.
#pragma once

#include <string>
#include <vector>

#include "memory/estimator.h"

namespace shardlm::memory {

struct Hardware {
  double flops_per_s = 0;        // achieved by one rank on this model's training work, FLOP/s (its matmuls and
                                 // attention alone where memory_bytes_per_s is given)
  // The rate one rank's memory-bound ops move bytes (each tensor read and each written); 0: their
  // time is folded into flops_per_s.
  double memory_bytes_per_s = 0;
  double intra_bytes_per_s = 0;  // one rank's bandwidth to the others of its node
  double inter_bytes_per_s = 0;  // one node's bandwidth to the other nodes (all its ranks together)
  double intra_latency_s = 0;    // per ring step within a node
  double inter_latency_s = 0;    // per ring step of a ring that crosses nodes
  bool overlap = true;           // communication proceeds while compute runs (GPUs; CPU with spare cores)
  // CPU ranks: the rate at which a rank's own cores move the bytes it communicates (TCP's and the
  // shared-memory path's copies), time taken from its compute; 0: none (GPUs, whose copy engines and
  // NICs move the bytes).
  double host_copy_bytes_per_s = 0;
};

// Seconds one collective takes on `g` when nothing else uses the links: `bytes` what each rank
// sends (ring accounting), ranks_per_node as in the run.
double collective_seconds(DryCollective kind, int64_t bytes, const GroupPlace& g, int ranks_per_node,
                          const Hardware& hw);

struct StepTime {
  double step_s = 0;        // the predicted step
  double compute_s = 0;     // the recorded FLOPs at flops_per_s, + memory_s, + host_copy_s
  double memory_s = 0;      // the memory-bound ops' bytes at memory_bytes_per_s (0 when it is not given)
  double host_copy_s = 0;   // the bytes sent at host_copy_bytes_per_s (0 when it is not given)
  double comm_s = 0;        // every collective's duration, summed
  double exposed_comm_s = 0;  // step_s - compute_s: communication compute waited for
  double flops = 0;         // per rank per step, as recorded
  double memory_bytes = 0;  // per rank per step: what the memory-bound ops read and write
  double tokens = 0;        // trained per rank per step
  double tokens_per_s() const { return step_s > 0 ? tokens / step_s : 0; }
};

// The replay of e.step_work (the dry run of `in`) on `hw`. Throws an Error when hw lacks a figure
// the run needs (no FLOP/s; a bandwidth for a link the run uses).
StepTime predict_step_time(const EstimateInput& in, const Estimate& e, const Hardware& hw);

}  // namespace shardlm::memory
