#include "memory/step_time.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace shardlm::memory {

double collective_seconds(DryCollective kind, int64_t bytes, const GroupPlace& g, int ranks_per_node,
                          const Hardware& hw) {
  const int p = g.size;
  if (p <= 1) return 0;
  const bool crosses = g.nodes > 1;
  double steps = 0;
  switch (kind) {
    case DryCollective::AllGather:
    case DryCollective::ReduceScatter:
    case DryCollective::Broadcast: steps = p - 1; break;
    case DryCollective::AllReduce: steps = 2.0 * (p - 1); break;
    case DryCollective::Scalar: steps = 2 * std::ceil(std::log2(double(p))); break;  // a tree
  }
  const double latency = steps * (crosses ? hw.inter_latency_s : hw.intra_latency_s);
  if (bytes == 0) return latency;
  double seconds = 0;
  if (g.per_node > 1 || !crosses) {  // hops between ranks of one node
    if (hw.intra_bytes_per_s <= 0)
      throw Error("the run communicates within a node: the intra-node bandwidth must be > 0");
    seconds = double(bytes) / hw.intra_bytes_per_s;
  }
  if (crosses) {
    if (hw.inter_bytes_per_s <= 0)
      throw Error("the run communicates between nodes: the inter-node bandwidth must be > 0");
    const double groups_per_node = double(ranks_per_node) / double(g.per_node);
    seconds = std::max(seconds, groups_per_node * double(bytes) / hw.inter_bytes_per_s);
  }
  return latency + seconds;
}

StepTime predict_step_time(const EstimateInput& in, const Estimate& e, const Hardware& hw) {
  if (hw.flops_per_s <= 0) throw Error("the achieved FLOP/s per rank must be > 0");
  const GroupPlace shard = shard_group_place(in, e), replicate = replicate_group_place(in, e);
  const int rpn = ranks_per_node(in);
  StepTime st;
  st.tokens = double(in.micro_batch_size) * double(in.seq_len) * double(in.grad_accum);
  // The compute clock, and when each link finishes what it was given: a node's links within it
  // (NVLink, shared memory) and its links to other nodes (NICs) run at once; a collective of a
  // group that spans nodes holds both.
  double now = 0, intra_free = 0, inter_free = 0;
  std::vector<double> ends;  // by collective id
  for (const WorkEvent& w : e.step_work) {
    switch (w.kind) {
      case WorkEvent::Kind::Compute: {
        const double memory = hw.memory_bytes_per_s > 0 ? w.memory_bytes / hw.memory_bytes_per_s : 0;
        const double s = w.flops / hw.flops_per_s + memory;
        st.flops += w.flops;
        st.memory_bytes += w.memory_bytes;
        st.memory_s += memory;
        st.compute_s += s;
        now += s;
        break;
      }
      case WorkEvent::Kind::Issue: {
        const GroupPlace& g = w.group == WorkEvent::Group::Shard ? shard : replicate;
        const double d = collective_seconds(w.collective, w.bytes, g, rpn, hw);
        st.comm_s += d;
        if (hw.host_copy_bytes_per_s > 0) {  // the cores that compute also move the bytes
          const double copy = double(w.bytes) / hw.host_copy_bytes_per_s;
          st.host_copy_s += copy;
          st.compute_s += copy;
          now += copy;
        }
        // Without overlap the links run only while compute waits: a collective's time adds to the step.
        const bool crosses = g.nodes > 1, within = g.per_node > 1 || !crosses;
        const double start =
            hw.overlap ? std::max({now, within ? intra_free : 0.0, crosses ? inter_free : 0.0}) : now;
        const double end = start + d;
        if (!hw.overlap) now = end;
        if (within) intra_free = end;
        if (crosses) inter_free = end;
        if (ends.size() <= size_t(w.id)) ends.resize(size_t(w.id) + 1, 0);
        ends[size_t(w.id)] = end;
        break;
      }
      case WorkEvent::Kind::Wait:
        if (size_t(w.id) < ends.size()) now = std::max(now, ends[size_t(w.id)]);
        break;
    }
  }
  st.step_s = std::max({now, intra_free, inter_free});
  st.exposed_comm_s = st.step_s - st.compute_s;
  return st;
}

}  // namespace shardlm::memory
