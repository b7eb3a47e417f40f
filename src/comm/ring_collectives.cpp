// Ring collectives (see ring_collectives.h for the algorithms and their invariants).
#include "comm/ring_collectives.h"

#include <algorithm>

namespace shardlm::comm {

RingShape ring_shape(RingOp op, int p, size_t n, size_t esize) {
  RingShape r;
  if (p < 1 || esize == 0) return r;
  const bool reduces = op != RingOp::AllGather;
  r.chunk_n = op == RingOp::AllReduce ? (n + size_t(p) - 1) / size_t(p) : n;
  // A reduction's chunk is cut into kRingLanes segments or more (of kRingMinSegmentBytes to
  // kRingSegmentBytes), so that even a small one has several in flight. An all-gather moves each
  // chunk whole (no scratch); MPI counts are ints, so at most 1 GiB a message.
  if (reduces) {
    const size_t quarter = (r.chunk_n + kRingLanes - 1) / kRingLanes * esize;
    r.segment_n = std::clamp(quarter, kRingMinSegmentBytes, kRingSegmentBytes) / esize;
  } else {
    r.segment_n = (size_t(1) << 30) / esize;
  }
  r.segment_n = std::max<size_t>(1, std::min(r.chunk_n, r.segment_n));
  r.segments = int((r.chunk_n + r.segment_n - 1) / r.segment_n);
  r.steps_per_segment = op == RingOp::AllReduce ? 2 * (p - 1) : p - 1;
  r.steps = r.chunk_n == 0 ? 0 : r.segments * r.steps_per_segment;
  if (r.steps == 0) return r;
  r.lanes = std::min(r.segments, kRingLanes);
  if (reduces) r.scratch_bytes = size_t(r.lanes) * 2 * r.segment_n * esize;
  return r;
}

}  // namespace shardlm::comm

#ifdef SHARDLM_HAVE_MPI

#include <fmt/format.h>

#include <cstring>
#include <numeric>

#include "comm/mpi_error.h"
#include "core/error.h"

namespace shardlm::comm {

namespace {
// dst[i] = a[i] + b[i]; dst may be a or b. bf16 adds in f32 and rounds once per element.
void sum_to(void* dst, const void* a, const void* b, size_t n, DType dtype) {
  if (dtype == DType::F32) {
    float* d = static_cast<float*>(dst);
    const float* x = static_cast<const float*>(a);
    const float* y = static_cast<const float*>(b);
    for (size_t i = 0; i < n; ++i) d[i] = x[i] + y[i];
    return;
  }
  bf16_t* d = static_cast<bf16_t*>(dst);
  const bf16_t* x = static_cast<const bf16_t*>(a);
  const bf16_t* y = static_cast<const bf16_t*>(b);
  for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
}

int wrap(int position, int p) { return ((position % p) + p) % p; }
}  // namespace

std::vector<int> ring_order(const std::vector<int>& host_of) {
  std::vector<int> order(host_of.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return host_of[size_t(a)] < host_of[size_t(b)]; });
  return order;
}

RingCollective::RingCollective(const Args& args) : a_(args) {
  SHARDLM_CHECK(a_.order && !a_.order->empty(), "ring collective: no ring order");
  SHARDLM_CHECK(a_.op == RingOp::AllGather || a_.dtype == DType::F32 || a_.dtype == DType::BF16,
                "ring collective: {} is not summed", dtype_name(a_.dtype));
  p_ = int(a_.order->size());
  pos_ = int(std::find(a_.order->begin(), a_.order->end(), a_.rank) - a_.order->begin());
  SHARDLM_CHECK(pos_ < p_, "ring collective: rank {} is not on the ring", a_.rank);
  esize_ = dtype_size(a_.dtype);
  const bool reduces = a_.op != RingOp::AllGather;
  shape_ = ring_shape(a_.op, p_, a_.n, esize_);

  if (a_.op == RingOp::AllGather) {  // this rank's own chunk, in place in the output
    char* own = at(a_.out, size_t(a_.rank) * a_.n);
    if (a_.in != own && a_.n > 0) std::memcpy(own, a_.in, a_.n * esize_);
  }
  if (p_ == 1 && a_.op == RingOp::ReduceScatter && a_.n > 0) std::memcpy(a_.out, a_.in, a_.n * esize_);
  if (shape_.steps == 0) return;
  if (reduces)
    scratch_ = Buffer(shape_.scratch_bytes, MemCategory::Communication, false, Device::CPU, mem_tag::kRingScratch);
  for (int l = 0; l < shape_.lanes; ++l) {
    Lane& lane = lane_[l];
    lane.steps = (shape_.segments - l + kLanes - 1) / kLanes * shape_.steps_per_segment;
    if (reduces) lane.scratch = at(scratch_.data(), size_t(l) * 2 * shape_.segment_n);
    post(l);
  }
}

RingCollective::~RingCollective() {
  // A collective is dropped before completing only when its process is ending (its request's
  // wait ended the job): leave MPI's requests to MPI_Abort rather than free buffers under them.
}

RingCollective::Chunk RingCollective::chunk(int position, int segment) const {
  const size_t c = size_t((*a_.order)[size_t(wrap(position, p_))]);
  const size_t total = a_.op == RingOp::AllReduce ? a_.n : size_t(p_) * a_.n;
  const size_t begin = std::min(total, c * shape_.chunk_n + size_t(segment) * shape_.segment_n);
  const size_t end = std::min({total, c * shape_.chunk_n + shape_.chunk_n, begin + shape_.segment_n});
  return {begin, end - begin};
}

void RingCollective::post(int l) {
  Lane& lane = lane_[l];
  const int spp = shape_.steps_per_segment, step = lane.step, seg = l + kLanes * (step / spp), s = step % spp;
  const bool reduce_step = a_.op == RingOp::ReduceScatter || (a_.op == RingOp::AllReduce && s < p_ - 1);
  const int next = (*a_.order)[size_t(wrap(pos_ + 1, p_))], prev = (*a_.order)[size_t(wrap(pos_ - 1, p_))];
  const void* send;
  void* recv;
  Chunk out_chunk, in_chunk;
  if (reduce_step) {
    out_chunk = chunk(pos_ - s - 1, seg);
    in_chunk = chunk(pos_ - s - 2, seg);
    const void* input = a_.op == RingOp::AllReduce ? a_.out : a_.in;
    send = s == 0 ? at(input, out_chunk.begin) : at(lane.scratch, size_t((s - 1) % 2) * shape_.segment_n);
    recv = at(lane.scratch, size_t(s % 2) * shape_.segment_n);
  } else {
    const int g = a_.op == RingOp::AllReduce ? s - (p_ - 1) : s;
    out_chunk = chunk(pos_ - g, seg);
    in_chunk = chunk(pos_ - g - 1, seg);
    send = at(a_.out, out_chunk.begin);
    recv = at(a_.out, in_chunk.begin);
  }
  // One tag per lane: messages of one tag between two ranks match in the order they were sent.
  const int tag = a_.tag * kLanes + l;
  check_mpi(MPI_Irecv(recv, int(in_chunk.len * esize_), MPI_BYTE, prev, tag, a_.comm, &lane.reqs[0]), "MPI_Irecv");
  check_mpi(MPI_Isend(send, int(out_chunk.len * esize_), MPI_BYTE, next, tag, a_.comm, &lane.reqs[1]), "MPI_Isend");
}

void RingCollective::finish_step(int l) {
  Lane& lane = lane_[l];
  const int spp = shape_.steps_per_segment, step = lane.step, seg = l + kLanes * (step / spp), s = step % spp;
  const bool reduce_step = a_.op == RingOp::ReduceScatter || (a_.op == RingOp::AllReduce && s < p_ - 1);
  if (!reduce_step) return;  // an all-gather step received straight into the output
  const Chunk got = chunk(pos_ - s - 2, seg);
  void* partial = at(lane.scratch, size_t(s % 2) * shape_.segment_n);
  const void* input = a_.op == RingOp::AllReduce ? a_.out : a_.in;
  if (s < p_ - 2) {  // a partial sum to pass on
    sum_to(partial, partial, at(input, got.begin), got.len, a_.dtype);
    return;
  }
  // The last reduce step received the sum of every other rank for this rank's own chunk.
  void* dst = a_.op == RingOp::AllReduce ? at(a_.out, got.begin) : at(a_.out, size_t(seg) * shape_.segment_n);
  sum_to(dst, partial, at(input, got.begin), got.len, a_.dtype);
}

bool RingCollective::test() {
  bool done = true;
  for (int l = 0; l < shape_.lanes; ++l) {
    Lane& lane = lane_[l];
    while (lane.step < lane.steps) {
      int flag = 0;
      check_mpi(MPI_Testall(2, lane.reqs, &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
      if (!flag) break;
      finish_step(l);
      const int next = lane.step + 1;
      lane.step = next;
      if (next < lane.steps) post(l);
    }
    done = done && lane.step == lane.steps;
  }
  return done;
}

int RingCollective::waiting_for() const { return (*a_.order)[size_t(wrap(pos_ - 1, p_))]; }

std::string RingCollective::progress() const {
  int done = 0;
  for (int l = 0; l < shape_.lanes; ++l) done += lane_[l].step;
  return fmt::format("step {} of {}", std::min(done + 1, shape_.steps), shape_.steps);
}

}  // namespace shardlm::comm

#endif  // SHARDLM_HAVE_MPI
