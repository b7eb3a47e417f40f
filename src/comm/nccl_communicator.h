// The NCCL communicator: the Communicator interface over CUDA tensors, for GPU runs.
//
// Plain C++ (no CUDA or NCCL header), so any layer may include it; the implementation is built only
// when CMake found CUDA and NCCL (SHARDLM_HAVE_NCCL). Without them make_nccl_communicator throws.
//
// How a GPU run builds its world (docs/sharding.md, "GPU runs"):
//   auto world = comm::make_world_communicator();              // MPI under mpirun, else local
//   auto gpu = comm::make_nccl_communicator(*world, comm::local_rank_from_environment());
// The bootstrap (`world`) carries the NCCL unique id and CPU-side scalars; `gpu` and its splits
// carry the device tensors.
//
// Tensors: contiguous, f32 or bf16, in memory of the communicator's CUDA device (Device::CUDA and
// checked with cudaPointerGetAttributes). Sums are NCCL's native f32/bf16 sums; Avg is ncclAvg,
// which NCCL computes itself. That differs from MPI's sum-then-multiply-by-1/size only in rounding:
// NCCL scales by 1/size inside the reduction (for floating types before the sums, in the current
// NCCL releases), so when size is not a power of two the last bit may differ from MPI's result.
//
// Streams and ordering (no host synchronization on the collective path):
//   * Every collective of one communicator runs on that communicator's own stream, in issue order
//     (NCCL needs one order per communicator on every rank; a split gets a stream of its own).
//   * On issue, the comm stream waits for an event recorded on cuda::compute_stream(): the
//     collective sees every write enqueued on the compute stream before the call.
//   * The Request records a completion event on the comm stream. Request::wait() makes the compute
//     stream wait for it (cudaStreamWaitEvent) and returns at once: work enqueued on the compute
//     stream afterwards sees the result; the host does not. A host that wants to read the result
//     copies it on the compute stream and synchronizes that stream.
//   * So a prefetched all-gather (issue, enqueue other compute, then wait, then use) overlaps the
//     compute enqueued in between.
//
// Lifetimes (the caller's rules):
//   * `in` and `out` must stay allocated until the compute stream has passed the wait() of their
//     Request. Freeing through the caching allocator on the compute stream after wait() is safe
//     (the free is ordered after the collective); freeing or reusing them earlier is a race.
//   * Between issue and wait(), nothing may write `in` or `out` nor read `out` (the collective owns
//     them, as with MPI).
//   * The bootstrap communicator must outlive the NCCL communicator and all its splits: abort()
//     ends the job through it. Requests may outlive their communicator (they hold their events).
//   * All calls come from one host thread (the same rule as MPI's FUNNELED).
//
// Blocking calls: broadcast() is stream-ordered like a waited collective (no host sync).
// barrier() and all_reduce_sum() synchronize the host with the comm stream (and barrier with the
// compute stream too); while they wait they poll ncclCommGetAsyncError, so a failed peer becomes an
// Error instead of a hang when NCCL detects it.
//
// Errors: every NCCL or CUDA failure is a one-line shardlm::Error "rank R: nccl <op>: ...", R being
// the bootstrap (world) rank, <op> the collective, with ncclGetErrorString and ncclGetLastError.
// abort() calls ncclCommAbort (so no kernel of this rank waits on peers any more), then the
// bootstrap's abort: "shardlm: error: rank R: message" and MPI_Abort under MPI, the plain
// "shardlm: error: message" of one process otherwise; the process exits non-zero either way.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace shardlm::comm {

// True when this build has the NCCL communicator (CUDA and NCCL were found at configure time).
bool nccl_built();

// Collective over `bootstrap`: every rank of it calls this together. Selects CUDA device
// local_rank % device_count (cudaSetDevice, for the calling thread), makes the ncclUniqueId on
// bootstrap rank 0 and broadcasts its bytes over the bootstrap, then ncclCommInitRank with the
// bootstrap's rank and size. The compute stream must not exist yet on another device.
// Before the id is exchanged every rank learns whether some rank failed to get a device, so a
// rank without a GPU makes every rank throw instead of leaving the others waiting.
// Throws a one-line Error naming the cause: built without NCCL, no CUDA device (with CUDA's
// reason), or the NCCL/CUDA call that failed.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int local_rank);

// For tests and debugging: the cudaStream_t the NCCL communicator `c` runs its collectives on,
// or nullptr when `c` is not an NCCL communicator. Work a caller enqueues there delays the
// collectives issued after it.
void* nccl_stream_of(Communicator& c);

}  // namespace shardlm::comm
