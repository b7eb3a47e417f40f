// The NCCL communicator (see nccl_communicator.h for the ordering and lifetime rules). The NCCL
// code is compiled only with CUDA and NCCL (SHARDLM_HAVE_NCCL); without them the factory throws.
#include "comm/nccl_communicator.h"

#include <fmt/format.h>

#ifndef SHARDLM_HAVE_NCCL

namespace shardlm::comm {

bool nccl_built() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int) {
  Error e("NCCL communicator: this shardlm was built without NCCL (it needs CUDA and nccl.h/libnccl when configured)");
  if (bootstrap.size() > 1) e.set_rank(bootstrap.rank());
  throw e;
}

void* nccl_stream_of(Communicator&) { return nullptr; }

}  // namespace shardlm::comm

#else  // SHARDLM_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "ops/cuda/runtime.h"

namespace shardlm::comm {

bool nccl_built() { return true; }

namespace {

// Every failure of this file: "rank R: nccl <op>: <what>", R the bootstrap (world) rank.
[[noreturn]] void fail(int rank, const char* op, const std::string& what) {
  Error e(fmt::format("nccl {}: {}", op, what));
  e.set_rank(rank);
  throw e;
}

void cuda_ok(cudaError_t err, int rank, const char* op, const char* call) {
  if (err == cudaSuccess) return;
  fail(rank, op, fmt::format("{}: CUDA error {}: {}", call, cudaGetErrorName(err), cudaGetErrorString(err)));
}

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  // ncclGetLastError holds NCCL's own explanation ("Duplicate GPU detected ..."), often the useful part.
  const char* last = ncclGetLastError(comm);
  std::string text = ncclGetErrorString(r);
  if (last && *last) text += fmt::format(" ({})", last);
  return text;
}

void nccl_ok(ncclResult_t r, ncclComm_t comm, int rank, const char* op, const char* call) {
  if (r != ncclSuccess) fail(rank, op, fmt::format("{}: {}", call, nccl_text(r, comm)));
}

ncclDataType_t nccl_type(DType d) { return d == DType::F32 ? ncclFloat32 : ncclBfloat16; }
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclAvg; }

// Makes `device` current for the calling thread for one call and restores the previous one, so a
// communicator works whatever device the caller left current (events and streams are per device).
class DeviceGuard {
 public:
  DeviceGuard(int device, int rank, const char* op) {
    cuda_ok(cudaGetDevice(&previous_), rank, op, "cudaGetDevice");
    if (previous_ != device) cuda_ok(cudaSetDevice(device), rank, op, "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// Completion events, reused: an event may be recorded again as soon as cudaStreamWaitEvent on it
// has returned (the wait already captured the record it waits for), so the pool holds only as
// many events as there are Requests not yet waited. Shared by a communicator, its Requests and
// nothing else; the last owner destroys the events. Timing is disabled: such events are cheap.
class EventPool {
 public:
  explicit EventPool(int device) : device_(device) {}
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);  // may run at exit, when CUDA is gone: ignore
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // Called with device_ current (the communicator's DeviceGuard).
  cudaEvent_t acquire(int rank, const char* op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), rank, op, "cudaEventCreateWithFlags");
    return e;
  }
  void release(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(e);
  }
  int device() const { return device_; }

 private:
  const int device_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

// A collective in flight: its completion event on the comm stream. wait() puts the event between
// the collective and whatever the compute stream runs next; it never blocks the host.
class NcclRequest final : public Request {
 public:
  NcclRequest(std::shared_ptr<EventPool> pool, cudaEvent_t done, int rank, const char* op)
      : pool_(std::move(pool)), done_(done), rank_(rank), op_(op) {}
  ~NcclRequest() override {
    if (done_) {
      try {
        wait();
      } catch (...) {
      }
    }
  }
  void wait() override {
    if (!done_) return;
    cudaEvent_t e = done_;
    done_ = nullptr;
    // The compute stream lives on the communicator's device (the factory checks); a stream may
    // wait on an event whatever device is current.
    const cudaError_t err = cudaStreamWaitEvent(cuda::compute_stream(), e, 0);
    pool_->release(e);
    cuda_ok(err, rank_, op_, "cudaStreamWaitEvent(compute stream, completion)");
  }

 private:
  std::shared_ptr<EventPool> pool_;
  cudaEvent_t done_;
  int rank_;
  const char* op_;
};

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (destroyed here, also when this constructor throws).
  NcclCommunicator(ncclComm_t comm, int device, int world_rank, Communicator* bootstrap)
      : comm_(comm), device_(device), world_rank_(world_rank), bootstrap_(bootstrap),
        events_(std::make_shared<EventPool>(device)) {
    try {
      DeviceGuard guard(device_, world_rank_, "init");
      nccl_ok(ncclCommCount(comm_, &size_), comm_, world_rank_, "init", "ncclCommCount");
      nccl_ok(ncclCommUserRank(comm_, &rank_), comm_, world_rank_, "init", "ncclCommUserRank");
      // Non-blocking: the comm stream must not synchronize with the legacy default stream either.
      // Highest priority: a collective's kernels use few SMs but every peer waits until they are
      // scheduled, so they should take SMs as soon as compute kernels free some.
      int least = 0, greatest = 0;
      cuda_ok(cudaDeviceGetStreamPriorityRange(&least, &greatest), world_rank_, "init", "cudaDeviceGetStreamPriorityRange");
      cuda_ok(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest), world_rank_, "init",
              "cudaStreamCreateWithPriority");
      cuda_ok(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), world_rank_, "init", "cudaEventCreateWithFlags");
    } catch (...) {
      release();
      throw;
    }
  }
  ~NcclCommunicator() override { release(); }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  Device device() const override { return Device::CUDA; }
  cudaStream_t stream() const { return stream_; }

  std::unique_ptr<Request> all_gather_async(const Tensor& out, const Tensor& in) override {
    const char* op = "all_gather";
    checked(op, [&] { check_gather(op, out, in); });
    check_memory(op, out);
    check_memory(op, in);
    DeviceGuard guard(device_, world_rank_, op);
    follow_compute(op);
    // In place when `in` is this rank's slice of `out`: NCCL's in-place rule is the same.
    nccl_ok(ncclAllGather(in.data, out.data, size_t(in.numel()), nccl_type(in.dtype), comm_, stream_), comm_, world_rank_,
            op, "ncclAllGather");
    count_ring(stats_.all_gather_bytes, out.nbytes());
    return completion(op);
  }

  std::unique_ptr<Request> reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp rop) override {
    const char* op = "reduce_scatter";
    checked(op, [&] { check_gather(op, in, out); });
    check_memory(op, out);
    check_memory(op, in);
    DeviceGuard guard(device_, world_rank_, op);
    follow_compute(op);
    nccl_ok(ncclReduceScatter(in.data, out.data, size_t(out.numel()), nccl_type(in.dtype), nccl_op(rop), comm_, stream_),
            comm_, world_rank_, op, "ncclReduceScatter");
    count_ring(stats_.reduce_scatter_bytes, in.nbytes());
    return completion(op);
  }

  std::unique_ptr<Request> all_reduce_async(const Tensor& buf, ReduceOp rop) override {
    const char* op = "all_reduce";
    checked(op, [&] { check_tensor(op, buf); });
    check_memory(op, buf);
    DeviceGuard guard(device_, world_rank_, op);
    follow_compute(op);
    nccl_ok(ncclAllReduce(buf.data, buf.data, size_t(buf.numel()), nccl_type(buf.dtype), nccl_op(rop), comm_, stream_),
            comm_, world_rank_, op, "ncclAllReduce");
    count_ring(stats_.all_reduce_bytes, 2 * buf.nbytes());
    return completion(op);
  }

  // Stream-ordered like a waited collective: the compute stream sees the root's bytes; the host
  // does not wait. Any dtype (bytes are broadcast), contiguous, in this device's memory.
  void broadcast(const Tensor& buf, int root) override {
    const char* op = "broadcast";
    if (root < 0 || root >= size_) fail(world_rank_, op, fmt::format("root {} out of range for {} ranks", root, size_));
    if (!buf.defined() || !buf.is_contiguous() || buf.device != Device::CUDA)
      fail(world_rank_, op, fmt::format("expected a contiguous cuda tensor, got {}", buf.describe()));
    check_memory(op, buf);
    DeviceGuard guard(device_, world_rank_, op);
    follow_compute(op);
    nccl_ok(ncclBroadcast(buf.data, buf.data, buf.nbytes(), ncclUint8, root, comm_, stream_), comm_, world_rank_, op,
            "ncclBroadcast");
    count_broadcast(buf.nbytes(), root);
    completion(op)->wait();
  }

  void broadcast_bytes(void*, size_t, int) override {
    fail(world_rank_, "broadcast", "host bytes go over the bootstrap communicator, not NCCL");
  }

  // Point to point, stream-ordered like broadcast: the compute stream sees a received tensor (and
  // may overwrite a sent one) after the call; the host does not wait. Bytes, so any dtype.
  void send(const Tensor& t, int dst) override { point_to_point("send", t, dst, true); }
  void recv(const Tensor& t, int src) override { point_to_point("recv", t, src, false); }

  // Synchronizes the host: returns when every rank has reached the barrier and this rank's work
  // enqueued before it (compute stream and comm stream) has finished.
  void barrier() override {
    const char* op = "barrier";
    DeviceGuard guard(device_, world_rank_, op);
    follow_compute(op);
    double* scalar = scalar_device(op);
    // An all-reduce of one value completes on a rank only after every rank has issued it.
    nccl_ok(ncclAllReduce(scalar, scalar, 1, ncclDouble, ncclSum, comm_, stream_), comm_, world_rank_, op,
            "ncclAllReduce");
    host_wait(op);
  }

  // Synchronizes the host with the comm stream (a round trip through an 8-byte device buffer);
  // ordered after this communicator's earlier collectives, not after the compute stream.
  double all_reduce_sum(double value) override {
    const char* op = "all_reduce_sum";
    DeviceGuard guard(device_, world_rank_, op);
    check_async(op);
    double* scalar = scalar_device(op);
    // Pinned, so both copies are asynchronous and host_wait can watch for NCCL errors meanwhile.
    *host_scalar_ = value;
    cuda_ok(cudaMemcpyAsync(scalar, host_scalar_, sizeof(double), cudaMemcpyHostToDevice, stream_), world_rank_, op,
            "cudaMemcpyAsync(to device)");
    nccl_ok(ncclAllReduce(scalar, scalar, 1, ncclDouble, ncclSum, comm_, stream_), comm_, world_rank_, op,
            "ncclAllReduce");
    cuda_ok(cudaMemcpyAsync(host_scalar_, scalar, sizeof(double), cudaMemcpyDeviceToHost, stream_), world_rank_, op,
            "cudaMemcpyAsync(to host)");
    host_wait(op);
    return *host_scalar_;
  }

  // Same color/key semantics as MPI_Comm_split (ranks ordered by key, ties by rank), except that
  // every rank must join some group: color must be >= 0 (the interface returns a communicator).
  std::unique_ptr<Communicator> split(int color, int key) override {
    const char* op = "split";
    if (color < 0) fail(world_rank_, op, fmt::format("color {} must be >= 0 (every rank joins a group)", color));
    DeviceGuard guard(device_, world_rank_, op);
    check_async(op);
    ncclComm_t sub = nullptr;
    // config nullptr: the child inherits this communicator's configuration (blocking).
    nccl_ok(ncclCommSplit(comm_, color, key, &sub, nullptr), comm_, world_rank_, op, "ncclCommSplit");
    return std::make_unique<NcclCommunicator>(sub, device_, world_rank_, bootstrap_);
  }

  [[noreturn]] void abort(const std::string& message, ErrorScope scope) override {
    // Abort first: this rank's kernels stop waiting on peers and NCCL releases its resources.
    // Then the bootstrap ends the job ("rank R: message" and MPI_Abort under MPI).
    if (comm_) {
      cudaSetDevice(device_);
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    bootstrap_->abort(message, scope);
    std::_Exit(1);  // the bootstrap's abort does not return; this keeps [[noreturn]] honest
  }

 private:
  // send/recv: bytes to or from `peer` on the comm stream (see send above).
  void point_to_point(const char* op, const Tensor& t, int peer, bool sending) {
    if (peer < 0 || peer >= size_ || peer == rank_)
      fail(world_rank_, op, fmt::format("rank {} of {} has no peer rank {}", rank_, size_, peer));
    if (!t.defined() || !t.is_contiguous() || t.device != Device::CUDA)
      fail(world_rank_, op, fmt::format("expected a contiguous cuda tensor, got {}", t.describe()));
    check_memory(op, t);
    DeviceGuard guard(device_, world_rank_, op);
    follow_compute(op);
    if (sending) {
      nccl_ok(ncclSend(t.data, t.nbytes(), ncclUint8, peer, comm_, stream_), comm_, world_rank_, op, "ncclSend");
      stats_.send_bytes += int64_t(t.nbytes());
    } else {
      nccl_ok(ncclRecv(t.data, t.nbytes(), ncclUint8, peer, comm_, stream_), comm_, world_rank_, op, "ncclRecv");
    }
    ++stats_.calls;
    completion(op)->wait();
  }

  // Runs a check of the base class and names this rank in its Error.
  template <class F>
  void checked(const char*, F&& f) const {
    try {
      f();
    } catch (Error& e) {
      e.set_rank(world_rank_);
      throw;
    }
  }

  // A Tensor says "cuda" but only the pointer tells which memory it is: host memory or another
  // device's would fail inside NCCL's kernels with an unhelpful illegal-address error.
  void check_memory(const char* op, const Tensor& t) const {
    cudaPointerAttributes a{};
    const cudaError_t err = cudaPointerGetAttributes(&a, t.data);
    if (err != cudaSuccess) {
      cudaGetLastError();  // not sticky, but do not leave it for the next check
      fail(world_rank_, op, fmt::format("{}: cudaPointerGetAttributes: {}", t.describe(), cudaGetErrorString(err)));
    }
    const bool device_memory = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
    if (!device_memory || a.device != device_) {
      const std::string where = device_memory ? fmt::format("memory of CUDA device {}", a.device)
                                : a.type == cudaMemoryTypeHost ? std::string("pinned host memory")
                                                                : std::string("host memory");
      fail(world_rank_, op, fmt::format("{} is {}, expected memory of CUDA device {}", t.describe(), where, device_));
    }
  }

  // A failure NCCL found after the call that caused it returned (a peer gone, a network error).
  void check_async(const char* op) const {
    ncclResult_t async = ncclSuccess;
    nccl_ok(ncclCommGetAsyncError(comm_, &async), comm_, world_rank_, op, "ncclCommGetAsyncError");
    if (async != ncclSuccess && async != ncclInProgress)
      fail(world_rank_, op, fmt::format("an earlier collective failed: {}", nccl_text(async, comm_)));
  }

  // The comm stream waits for everything enqueued on the compute stream so far. One event does for
  // every call: cudaStreamWaitEvent captures the record it waits for when it returns.
  void follow_compute(const char* op) {
    check_async(op);
    cuda_ok(cudaEventRecord(ready_, cuda::compute_stream()), world_rank_, op, "cudaEventRecord(compute stream)");
    cuda_ok(cudaStreamWaitEvent(stream_, ready_, 0), world_rank_, op, "cudaStreamWaitEvent(comm stream, compute)");
  }

  // The Request of the collective just enqueued on the comm stream.
  std::unique_ptr<Request> completion(const char* op) {
    cudaEvent_t done = events_->acquire(world_rank_, op);
    const cudaError_t err = cudaEventRecord(done, stream_);
    if (err != cudaSuccess) {
      events_->release(done);
      cuda_ok(err, world_rank_, op, "cudaEventRecord(comm stream)");
    }
    return std::make_unique<NcclRequest>(events_, done, world_rank_, op);
  }

  // Waits on the host for the comm stream, polling NCCL's asynchronous error state meanwhile: a
  // dead peer that NCCL detects becomes an Error rather than a hang. Past collective_timeout (the
  // watchdog, as the MPI path's), a peer that never arrives: one line naming the collective and
  // what the program was doing, then the communicator is aborted (its kernels stop waiting) and
  // the job ended.
  void host_wait(const char* op) {
    using Clock = std::chrono::steady_clock;
    const double limit = collective_timeout();
    const auto t0 = Clock::now();
    for (int spins = 0;; ++spins) {
      const cudaError_t err = cudaStreamQuery(stream_);
      if (err == cudaSuccess) return;
      if (err != cudaErrorNotReady) cuda_ok(err, world_rank_, op, "cudaStreamQuery(comm stream)");
      check_async(op);
      if (limit > 0 && (spins & 255) == 0 &&
          std::chrono::duration<double>(Clock::now() - t0).count() > limit)
        abort(fmt::format("{} ({}) did not complete within collective_timeout {:.0f} s on the NCCL communicator "
                          "(a peer stopped, died or is slower than the timeout); aborting it",
                          op, describe_activity(), limit),
              ErrorScope::this_rank);
      if (spins < 1000)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // The 8-byte device buffer of barrier() and all_reduce_sum(), and its pinned host twin.
  double* scalar_device(const char* op) {
    if (!scalar_) {
      cuda_ok(cudaMalloc(reinterpret_cast<void**>(&scalar_), sizeof(double)), world_rank_, op, "cudaMalloc");
      cuda_ok(cudaMallocHost(reinterpret_cast<void**>(&host_scalar_), sizeof(double)), world_rank_, op, "cudaMallocHost");
      cuda_ok(cudaMemsetAsync(scalar_, 0, sizeof(double), stream_), world_rank_, op, "cudaMemsetAsync");
    }
    return scalar_;
  }

  // Frees everything this object owns; errors are ignored (a destructor, or already failing).
  void release() noexcept {
    int previous = -1;
    const bool restore = cudaGetDevice(&previous) == cudaSuccess && previous != device_;
    cudaSetDevice(device_);
    // Work still in flight reads and writes the callers' buffers and scalar_: let it finish before
    // NCCL tears the communicator down (ncclCommDestroy would flush its collectives as well).
    if (stream_) cudaStreamSynchronize(stream_);
    if (comm_) {
      ncclCommDestroy(comm_);
      comm_ = nullptr;
    }
    if (scalar_) cudaFree(scalar_);
    if (host_scalar_) cudaFreeHost(host_scalar_);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
    scalar_ = nullptr;
    host_scalar_ = nullptr;
    ready_ = nullptr;
    stream_ = nullptr;
    if (restore) cudaSetDevice(previous);
  }

  ncclComm_t comm_ = nullptr;
  const int device_;
  const int world_rank_;             // the bootstrap's rank: what errors name
  Communicator* const bootstrap_;    // not owned; outlives this (see the header)
  std::shared_ptr<EventPool> events_;
  cudaStream_t stream_ = nullptr;    // owned: every collective of this communicator runs here
  cudaEvent_t ready_ = nullptr;      // owned: the compute stream's position at the latest issue
  double* scalar_ = nullptr;         // owned, lazily: barrier / all_reduce_sum
  double* host_scalar_ = nullptr;    // owned, lazily, pinned
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int local_rank) {
  const int world_rank = bootstrap.rank(), n = bootstrap.size();
  auto error = [&](const std::string& what) {
    Error e(fmt::format("NCCL communicator: {}", what));
    if (n > 1) e.set_rank(world_rank);
    return e;
  };
  if (local_rank < 0) throw error(fmt::format("local rank {} is negative", local_rank));

  // 1. Locally: a device, and on rank 0 the unique id. Failures are only recorded here, so that
  //    every rank reaches the agreement below whatever happened.
  std::string failure;
  int device = -1;
  ncclUniqueId id{};
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    failure = err != cudaSuccess ? fmt::format("no CUDA device (cudaGetDeviceCount: {}: {})", cudaGetErrorName(err),
                                               cudaGetErrorString(err))
                                 : std::string("no CUDA device (cudaGetDeviceCount found none)");
  } else {
    device = local_rank % count;
    const cudaError_t set = cudaSetDevice(device);
    if (set != cudaSuccess) {
      failure = fmt::format("cudaSetDevice({}): {}: {}", device, cudaGetErrorName(set), cudaGetErrorString(set));
    } else {
      try {
        // The compute stream belongs to the device current when it was first used; the Requests
        // order it against streams of `device`, so it must be on that device too.
        cudaStream_t compute = cuda::compute_stream();
#if CUDART_VERSION >= 12080
        int stream_device = -1;
        cuda::check(cudaStreamGetDevice(compute, &stream_device), "cudaStreamGetDevice(compute stream)", __FILE__,
                    __LINE__);
        if (stream_device != device)
          failure = fmt::format("the compute stream was created on CUDA device {} but this rank uses device {} "
                                "(make the NCCL communicator before any CUDA op runs)",
                                stream_device, device);
#else
        (void)compute;
#endif
      } catch (const Error& e) {
        failure = e.what();
      }
    }
    if (failure.empty() && world_rank == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) failure = fmt::format("ncclGetUniqueId: {}", nccl_text(r, nullptr));
    }
  }

  // 2. Agreement over the bootstrap: no rank enters the id broadcast or ncclCommInitRank (which
  //    wait for every rank) while another has given up.
  const double failed = bootstrap.all_reduce_sum(failure.empty() ? 0.0 : 1.0);
  if (!failure.empty()) throw error(failure);
  if (failed > 0) throw error(fmt::format("{} other rank(s) could not set up a CUDA device", failed));

  // 3. Rank 0's id to every rank, as bytes over the host bootstrap.
  bootstrap.broadcast_bytes(&id, sizeof(id), 0);

  // 4. The communicator: NCCL rank = bootstrap rank.
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, n, id, world_rank);
  if (r != ncclSuccess)
    throw error(fmt::format("ncclCommInitRank (rank {} of {}, CUDA device {}): {}", world_rank, n, device,
                            nccl_text(r, nullptr)));
  return std::make_unique<NcclCommunicator>(comm, device, world_rank, &bootstrap);
}

void* nccl_stream_of(Communicator& c) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&c);
  return nccl ? static_cast<void*>(nccl->stream()) : nullptr;
}

}  // namespace shardlm::comm

#endif  // SHARDLM_HAVE_NCCL
