// Ring collectives over MPI point-to-point: the MPI communicator's path for groups whose ranks
// span nodes (shm_collectives.h is its path within one node).
//
// Open MPI 4.1 runs a non-blocking collective through libnbc, whose algorithms are not rings:
//   - MPI_Iallgather has a linear and a recursive-doubling algorithm (ompi_info), no ring: a
//     4-rank all-gather of 32 MiB across 2 emulated nodes took 1.6x the ring's time;
//   - MPI_Ireduce_scatter_block reduces the whole buffer to rank 0 (a binomial tree) and then
//     scatters it: the link into rank 0's node carries the whole buffer, then the link out of it
//     half of it again, one after the other, and rank 0 sums everything in one thread.
// Between 2 emulated nodes at 1 Gbit/s a FULL_SHARD step took 1.4x what the ring's bytes explain
// (bench/RESULTS.md, 2026-11-27). Here, as in NCCL's ring, every rank sends to the next and
// receives from the previous one in p - 1 steps, and the ring visits the ranks host by host, so
// it crosses between nodes once per node: each node's link carries (p - 1) / p of the buffer
// once for an all-gather or a reduce-scatter, and every rank sums its own share.
//
//   reduce-scatter: at step s the rank at ring position i sends the partial sum of the chunk of
//     ring position i - s - 1 (at s = 0 its own input) and receives that of i - s - 2, adding its
//     input to it; after p - 1 steps it holds the whole sum of its own chunk.
//   all-gather: at step s it sends the chunk of position i - s and receives that of i - s - 1,
//     straight into the output.
//   all-reduce: a reduce-scatter of the buffer cut into p chunks (the last ones shorter), then an
//     all-gather of the sums, in place.
// A reduction's chunks move in segments of at most kRingSegmentBytes, a whole ring pass per segment,
// so its scratch stays small whatever the buffer: kRingLanes segments are in flight at once, each lane
// with two segments of scratch (32 MiB at most). One message at a time would leave the link idle
// between messages: between 2 emulated nodes at 1 Gbit/s every message cost ~20 ms beyond its bytes
// (a 2-rank reduce-scatter of 32 MiB in 4 MiB segments took 222 ms where one 16 MiB message took
// 147 ms). An all-gather moves each chunk whole and needs no scratch.
// f32 is summed in f32; bf16 (the wire dtype) is summed in f32 and rounded to bf16 at every hop,
// as the MPI path's bf16 operation does. Chunk c's sum is accumulated in ring order starting
// after c's owner, so different chunks are summed in different orders (each only by one rank).
//
// Progress: each step is an MPI_Isend and an MPI_Irecv; test() (called by the communicator's
// progress thread, or by the waiting thread where there is none) tests them, and when both are
// done does the step's sum and posts the next step. Nothing blocks and nothing spins here.
//
// Lifetime: a RingCollective borrows the caller's buffers and communicator until test() has
// returned true; its scratch is its own (a Buffer charged to MemCategory::Communication).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/dtype.h"

namespace shardlm::comm {

enum class RingOp : uint8_t { AllGather, ReduceScatter, AllReduce };

// The MPI communicator takes the ring for collectives of this many bytes and more (the whole
// buffer); below, MPI's own algorithms answer in a round or two where the ring takes p - 1.
inline constexpr size_t kRingMinBytes = size_t(256) << 10;
// A reduction's chunks move in segments of kRingMinSegmentBytes to kRingSegmentBytes, kRingLanes at once.
inline constexpr size_t kRingSegmentBytes = size_t(4) << 20;
inline constexpr size_t kRingMinSegmentBytes = size_t(256) << 10;
inline constexpr int kRingLanes = 4;

// How a ring collective of p ranks over n elements of esize bytes (RingCollective::Args::n) is cut:
// computed here alone, for the ring itself and for the memory estimate's dry run, which holds its
// scratch as the ring does (comm/communicator.h, make_shape_communicator).
struct RingShape {
  size_t chunk_n = 0;       // elements per rank's chunk
  size_t segment_n = 0;     // elements per segment
  int segments = 0, steps_per_segment = 0, steps = 0, lanes = 0;
  size_t scratch_bytes = 0;  // held from issue to completion: two segments per lane, for reductions
};
RingShape ring_shape(RingOp op, int p, size_t n, size_t esize);

}  // namespace shardlm::comm

#ifdef SHARDLM_HAVE_MPI

#include <mpi.h>

namespace shardlm::comm {

// Where a communicator's ranks sit on the ring: by host (hosts in order of their lowest rank),
// then by rank, so that each host's ranks are neighbours. host_of[r]: a host index per rank.
std::vector<int> ring_order(const std::vector<int>& host_of);

class RingCollective {
 public:
  static constexpr int kLanes = kRingLanes;

  struct Args {
    RingOp op = RingOp::AllGather;
    MPI_Comm comm = MPI_COMM_NULL;  // the ring's own communicator (its tags are this module's)
    int tag = 0;                    // one per collective in flight on `comm`, the same on every rank
    const std::vector<int>* order = nullptr;  // ring position -> rank of comm (ring_order)
    int rank = 0;                   // this rank in comm
    DType dtype = DType::F32;       // reductions: f32, or bf16 (summed as bf16); an all-gather: any (u8: bytes)
    // AllGather: in [n] -> out [p * n]; `in` may be out's own slice.
    // ReduceScatter: in [p * n] -> out [n] (sums, unscaled).
    // AllReduce: out [n] in place (in unused), cut into p chunks of ceil(n / p).
    void* out = nullptr;
    const void* in = nullptr;
    size_t n = 0;  // elements, as above
  };
  // Posts the first step (a collective with nothing to move is done at once).
  explicit RingCollective(const Args& args);
  ~RingCollective();
  RingCollective(const RingCollective&) = delete;
  RingCollective& operator=(const RingCollective&) = delete;

  // Tests each lane's step in flight; when one has completed, sums what it received and posts
  // the lane's next step. True once the whole collective is done. Throws Error on an MPI failure.
  bool test();
  // Which rank (of comm) the steps in flight wait to hear from, and how far they are: for the watchdog.
  int waiting_for() const;
  std::string progress() const;  // "step 3 of 6"

 private:
  struct Chunk {
    size_t begin = 0, len = 0;  // elements
  };
  // A lane's steps: its segments (lane, lane + kLanes, ...) one after another, each a ring pass.
  struct Lane {
    std::atomic<int> step{0};  // the step in flight (read by the watchdog on another thread)
    int steps = 0;
    char* scratch = nullptr;   // reductions: two segments, received into alternately
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  };
  Chunk chunk(int position, int segment) const;  // a ring position's chunk, cut to one segment
  void post(int lane);                           // posts the lane's step in flight
  void finish_step(int lane);                    // the sum of a reduce step that has completed
  char* at(void* base, size_t elem) const { return static_cast<char*>(base) + elem * esize_; }
  const char* at(const void* base, size_t elem) const { return static_cast<const char*>(base) + elem * esize_; }

  Args a_;
  int p_ = 1, pos_ = 0;
  size_t esize_ = 4;
  RingShape shape_;
  Lane lane_[kLanes];
  Buffer scratch_;          // reductions: the lanes' scratch
};

}  // namespace shardlm::comm

#endif  // SHARDLM_HAVE_MPI
