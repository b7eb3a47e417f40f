// Shared-memory collectives for ranks on one node (the MPI communicator's intra-node path).
//
// Open MPI's collectives over shared memory move the data well, but a reduction runs in one
// thread inside MPI at ~0.5 GB/s on the development machine (bench/RESULTS.md, "communication
// microbenchmark"), and a non-blocking collective progresses only while some thread is inside
// MPI. Here the ranks of a communicator that all live on one node share a window (MPI-3
// MPI_Win_allocate_shared): each rank owns a staging slot of two halves of kHalfBytes, and every
// collective streams through the slots chunk by chunk, each rank doing its own share of the
// work with plain (vectorized) loops:
//   all-gather:     each rank copies its chunk into its slot; after a barrier, every rank copies
//                   every slot out.
//   reduce-scatter: each rank copies the parts meant for the others into its slot; after a
//                   barrier, rank r sums part r of every slot (its own part from its input), in
//                   rank order, and scales (Avg).
//   all-reduce:     copy in; barrier; rank r sums the r-th of `size` portions into its own slot;
//                   barrier; every rank copies every portion out.
// Chunks alternate between a slot's two halves, so one barrier per chunk suffices: a rank
// overwrites a half only after every rank arrived at the barrier of the chunk after the one that
// last used it, that is after every rank finished reading it.
//
// Every rank sums in the same order, so an all-reduce leaves bit-identical results everywhere.
// f32 is summed in f32. bf16 is summed in f32 over all ranks and rounded to bf16 once (nearer to
// the exact sum than the MPI path's round-per-addition).
//
// Barriers are a per-rank arrival counter in the window: a rank spins briefly, then sleeps on a
// futex on the counter of the rank it waits for (shared mappings: the futex works across
// processes). The collectives of one group run in issue order on a worker thread of this process,
// so they progress while the caller computes; `threaded` false runs each at issue instead (no
// overlap: SHARDLM_PROGRESS_THREAD=0). SHARDLM_COMM_THREADS (default 1) sets the OpenMP threads
// each rank's copies and sums use.
//
// Lifetime: the group belongs to one MPI communicator and must be destroyed (collectively, on
// every rank, before the communicator is freed) after every collective it ran has completed. The
// buffers of a collective must stay valid until its `done` has been called.
#pragma once

#ifdef SHARDLM_HAVE_MPI

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace shardlm::comm {

class ShmGroup {
 public:
  // Bytes of one half of a rank's staging slot: a chunk's share of one rank.
  static constexpr size_t kHalfBytes = size_t(8) << 20;
  // Below a chunk a collective is latency-bound: each one here costs two thread hand-offs and a
  // barrier, where MPI's small-message algorithms answer in microseconds (bench/RESULTS.md). The
  // communicator sends smaller buffers through MPI.
  static constexpr size_t kMinBytes = kHalfBytes;

  // Collective over `comm`: the group of its ranks when they all share one node and SHARDLM_SHM is
  // not 0, else nullptr (the caller uses MPI). A node without room for the window (a small
  // /dev/shm) also gets nullptr, on every rank alike, with a warning from the group's rank 0.
  static std::unique_ptr<ShmGroup> create(MPI_Comm comm, bool threaded);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  using Done = std::function<void()>;
  // out [size * bytes] = every rank's in [bytes] in rank order; `in` may be this rank's slice of out.
  void all_gather(void* out, const void* in, size_t bytes, Done done);
  // out [count] = scale * (sum over ranks of their in [size * count], part `rank`).
  void reduce_scatter(void* out, const void* in, size_t count, DType dtype, float scale, Done done);
  // buf [count] = scale * (sum over ranks of buf), in place.
  void all_reduce(void* buf, size_t count, DType dtype, float scale, Done done);

  // For the watchdog's message: "rank 3 has not reached it" while the worker waits for a rank at
  // a barrier (3 is its MPI_COMM_WORLD rank); empty otherwise.
  std::string holdup() const;
  // The OpenMP threads each rank's copies and sums use (SHARDLM_COMM_THREADS).
  int threads() const;

 private:
  struct Impl;
  explicit ShmGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardlm::comm

#endif  // SHARDLM_HAVE_MPI
