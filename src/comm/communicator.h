// Communicator: the collectives the sharding engine needs, behind one interface.
//
// Implementations: LocalCommunicator (one process, no MPI), MpiCommunicator (OpenMPI; CPU ranks,
// and the bootstrap for NCCL) and the NCCL communicator (nccl_communicator.h; CUDA tensors, ordered
// against the compute stream instead of the host). Every collective has a non-blocking form
// returning a Request; the blocking form is that followed by wait(). Tensors must be contiguous, on
// the communicator's device (device()), f32 or bf16.
//
// Reductions: f32 is summed by MPI in f32. bf16 is summed by a custom MPI op that adds pairs in
// f32 and rounds each partial sum to bf16, as NCCL does for bf16; use reduce_dtype f32 in the
// mixed-precision policy when that rounding matters. Ranks on one node reduce buffers of 8 MiB and
// more through shared memory instead (shm_collectives.h): f32 summed in rank order, bf16 summed in
// f32 and rounded once. Avg = Sum, then a multiply by 1/size (MPI; the
// NCCL communicator uses NCCL's own average, see nccl_communicator.h).
//
// Byte accounting (stats()): for each collective, the bytes one rank sends with a ring algorithm:
// all-gather and reduce-scatter (size-1)/size of the full buffer, all-reduce twice that. These are
// the units of the ZeRO paper's communication volumes (2Ψ for DDP, 3Ψ for ZeRO-3 ...).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace shardlm::comm {

enum class ReduceOp { Sum, Avg };

struct CommStats {
  int64_t all_gather_bytes = 0, reduce_scatter_bytes = 0, all_reduce_bytes = 0, broadcast_bytes = 0;
  int64_t send_bytes = 0;  // point to point: the bytes this rank sent
  int64_t calls = 0;
  int64_t total() const {
    return all_gather_bytes + reduce_scatter_bytes + all_reduce_bytes + broadcast_bytes + send_bytes;
  }
};

// A collective in flight. wait() completes it (and applies any post-processing, such as the
// 1/size of an average); destroying an unwaited Request waits. For a CPU communicator "complete"
// means the host may read the result; for the NCCL communicator it means work enqueued on the
// compute stream afterwards sees the result (the host is not synchronized; see nccl_communicator.h).
class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  // Where the tensors of collectives must live: CPU for local and MPI, CUDA for NCCL.
  virtual Device device() const { return Device::CPU; }

  // out [size * n] = the concatenation of every rank's in [n]. `in` may be this rank's slice of out.
  virtual std::unique_ptr<Request> all_gather_async(const Tensor& out, const Tensor& in) = 0;
  // out [n] = rank's slice of the reduction of every rank's in [size * n].
  virtual std::unique_ptr<Request> reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) = 0;
  // buf = the reduction of every rank's buf, in place.
  virtual std::unique_ptr<Request> all_reduce_async(const Tensor& buf, ReduceOp op) = 0;
  virtual void broadcast(const Tensor& buf, int root) = 0;
  // n bytes of host memory from root to every rank (ids, small records). Host communicators only:
  // the NCCL communicator refuses (its bootstrap carries such bytes).
  virtual void broadcast_bytes(void* data, size_t n, int root) = 0;
  virtual void barrier() = 0;
  // Point to point: `t` (contiguous, on device(), any dtype: its bytes are sent) goes to rank
  // `dst`, which receives it into a tensor of the same byte size with recv(t, src). Blocking; sends
  // and receives between one pair of ranks match in the order they are issued. A pipeline of
  // layers (generation split over ranks, infer/generator.h) passes hidden states this way. One
  // rank has no peer: the local communicator refuses both.
  virtual void send(const Tensor& t, int dst) = 0;
  virtual void recv(const Tensor& t, int src) = 0;
  // Ranks with the same color form a new communicator, ordered by key (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Ends every rank of the job: prints "rank R: message" and exits non-zero. An error of scope
  // every_rank is printed once, by rank 0, which meets it too.
  [[noreturn]] virtual void abort(const std::string& message, ErrorScope scope) = 0;

  void all_gather(const Tensor& out, const Tensor& in) { all_gather_async(out, in)->wait(); }
  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) { reduce_scatter_async(out, in, op)->wait(); }
  void all_reduce(const Tensor& buf, ReduceOp op) { all_reduce_async(buf, op)->wait(); }
  // Sum of one double over ranks, in double (losses, squared norms, token counts).
  virtual double all_reduce_sum(double value) = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  // Validate a collective's tensors: contiguous f32/bf16 on device(); for gathers and scatters also
  // the same dtype and full = size x part. Errors name the op and the tensor (dtype, shape, device).
  void check_tensor(const char* op, const Tensor& t) const;
  void check_gather(const char* op, const Tensor& full, const Tensor& part) const;
  // Ring byte accounting shared by every implementation (see the top of this file): adds the bytes
  // one rank sends for a collective over a buffer of full_bytes, and counts the call.
  void count_ring(int64_t& field, size_t full_bytes) {
    field += int64_t(full_bytes) * (size() - 1) / size();
    ++stats_.calls;
  }
  // A broadcast: the root sends the buffer once (what the ring pipeline costs the root).
  void count_broadcast(size_t bytes, int root) {
    if (rank() == root) stats_.broadcast_bytes += int64_t(bytes);
    ++stats_.calls;
  }
  // Validates a point-to-point tensor and peer: contiguous, on device(), and a peer that is
  // another rank of this communicator. Errors name the op, the peer and the tensor.
  void check_peer(const char* op, const Tensor& t, int peer) const;
  CommStats stats_;
};

std::unique_ptr<Communicator> make_local_communicator();
// A group of `size` ranks seen from `rank` in which nothing is sent: every collective completes at
// once and only counts its bytes. Its tensors are on the meta device (core/alloc.h). For dry runs
// of the engine (the memory estimator). `ring`: the real group would pass its collectives around
// the ring (ring_collectives.h: CPU ranks over MPI, a group across nodes), whose scratch the dry
// run then holds as the ring does.
std::unique_ptr<Communicator> make_shape_communicator(int rank, int size, bool ring = false);

// The collective watchdog (MPI): every wait on a collective has a deadline of this many seconds
// (0: none; 600 unless set). When it passes, the waiting rank prints one line — which collective,
// what the program was doing (set_activity), how long it waited, and which ranks it can see are
// stopped or gone (ranks on its own node) — and ends the job with a non-zero exit, instead of
// hanging forever behind a stopped or deadlocked rank.
void set_collective_timeout(double seconds);
double collective_timeout();
// What the program is doing, for the watchdog's message ("step 12, unit model.layers.3"). Cheap to
// set on every visit: nothing is formatted until the message is. `unit` must outlive the setting
// (the engine's plan; the engine clears it when it goes).
struct Activity {
  int64_t step = 0;               // the training step (0: none)
  const char* what = "start-up";  // "evaluation", "token count", ... or null
  const std::string* unit = nullptr;
};
void set_activity(const Activity& a);
std::string describe_activity();

// Where communication time went, summed over this process's host communicators since start-up:
// busy = time during which at least one collective was in flight (issue to completion), waited =
// time the calling threads spent blocked on one. busy - waited is communication that ran behind
// compute. Zero for the local communicator; device (NCCL) collectives are not counted.
struct CommTiming {
  double busy_seconds = 0.0;
  double waited_seconds = 0.0;
  // The share of busy time nobody waited for (0 when nothing was communicated).
  double hidden_share() const { return busy_seconds > 0 ? std::max(0.0, 1.0 - waited_seconds / busy_seconds) : 0.0; }
};
CommTiming timing();

// True when this process was started by mpirun/mpiexec (OpenMPI) or srun with several tasks.
bool launched_by_mpi();
// This process's rank among the processes of its node, from the launcher's environment
// (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, LOCAL_RANK); 0 when none is set. Picks the GPU.
int local_rank_from_environment();
// How many ranks share this node, from the launcher's environment: mpirun's
// OMPI_COMM_WORLD_LOCAL_SIZE, srun's SLURM_STEP_TASKS_PER_NODE ("8", "8(x2)", "8,8"), sbatch's
// SLURM_NTASKS_PER_NODE, MPICH's MPI_LOCALNRANKS. 0 when none is set or when srun placed different
// numbers of tasks on different nodes ("5,3"), where no one count is right.
int ranks_per_node_from_environment();
// Who started the ranks, for the log: "srun (Slurm job 12, step 0, PMIx), 2 ranks per node, local
// rank from SLURM_LOCALID", "mpirun inside Slurm job 12, ...", "mpirun, ..."; empty for one process
// started by hand.
std::string describe_launcher();
// The world: MPI when launched by mpirun or srun (MPI is initialized here and finalized when the
// last MPI communicator is destroyed), otherwise the local communicator. Throws when launched by
// mpirun but built without MPI.
std::unique_ptr<Communicator> make_world_communicator();

}  // namespace shardlm::comm
