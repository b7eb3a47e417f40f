#include "comm/communicator.h"
#include "comm/hosts.h"
#include "comm/ring_collectives.h"
#include "core/platform.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace shardlm::comm {

HostLayout single_host(int size) {
  return HostLayout{.hosts = {host_name()}, .host_of = std::vector<int>(size_t(size), 0)};
}

void Communicator::check_tensor(const char* op, const Tensor& t) const {
  SHARDLM_CHECK(t.defined() && t.is_contiguous() && t.device == device(), "{}: expected a contiguous {} tensor, got {}", op,
                device_name(device()), t.describe());
  SHARDLM_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "{}: expected f32 or bf16, got {}", op, t.describe());
}

void Communicator::check_gather(const char* op, const Tensor& full, const Tensor& part) const {
  check_tensor(op, full);
  check_tensor(op, part);
  SHARDLM_CHECK(full.dtype == part.dtype, "{}: dtypes differ ({} and {})", op, full.describe(), part.describe());
  SHARDLM_CHECK(full.numel() == part.numel() * size(), "{}: the full buffer has {} elements, expected {} x {}", op,
                full.numel(), size(), part.numel());
}

void Communicator::check_peer(const char* op, const Tensor& t, int peer) const {
  SHARDLM_CHECK(t.defined() && t.is_contiguous() && t.device == device(), "{}: expected a contiguous {} tensor, got {}", op,
                device_name(device()), t.describe());
  SHARDLM_CHECK(peer >= 0 && peer < size() && peer != rank(), "{}: rank {} of {} has no peer rank {}", op, rank(), size(),
                peer);
}

namespace {

class DoneRequest final : public Request {
 public:
  void wait() override {}
};

// World size 1: every collective is a copy or nothing.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "local"; }
  std::unique_ptr<Request> all_gather_async(const Tensor& out, const Tensor& in) override {
    check_gather("all_gather", out, in);
    if (out.data != in.data) std::memcpy(out.data, in.data, in.nbytes());
    ++stats_.calls;
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp) override {
    check_gather("reduce_scatter", in, out);
    if (out.data != in.data) std::memcpy(out.data, in.data, in.nbytes());
    ++stats_.calls;
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> all_reduce_async(const Tensor& buf, ReduceOp) override {
    check_tensor("all_reduce", buf);
    ++stats_.calls;
    return std::make_unique<DoneRequest>();
  }
  double all_reduce_sum(double value) override { return value; }
  void broadcast(const Tensor&, int root) override {
    SHARDLM_CHECK(root == 0, "broadcast: root {} out of range for 1 rank", root);
  }
  void broadcast_bytes(void*, size_t, int root) override {
    SHARDLM_CHECK(root == 0, "broadcast: root {} out of range for 1 rank", root);
  }
  void barrier() override {}
  void send(const Tensor&, int dst) override {
    throw Error(fmt::format("send to rank {}: a single process has no other rank (start the ranks with shardlm launch)",
                            dst));
  }
  void recv(const Tensor&, int src) override {
    throw Error(fmt::format("recv from rank {}: a single process has no other rank (start the ranks with shardlm "
                            "launch)",
                            src));
  }
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<LocalCommunicator>(); }
  [[noreturn]] void abort(const std::string& message, ErrorScope) override {
    std::fprintf(stderr, "shardlm: error: %s\n", message.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
};

// One rank's view of a group of `size` ranks in which nothing moves: collectives only count their
// bytes, and report their issue and wait to the thread's dry-run observer (core/alloc.h: the
// step-time model replays them). Tensors may have no memory (a dry run of the engine). A group
// whose real counterpart passes its reductions around the ring (ring_collectives.h) holds the
// ring's scratch, on the meta device, from issue to wait, as the ring holds it.
class ShapeCommunicator final : public Communicator {
  // Reports its wait once, when waited for or destroyed unwaited (which waits too).
  class ShapeRequest final : public Request {
   public:
    ShapeRequest(int64_t id, Buffer scratch) : id_(id), scratch_(std::move(scratch)) {}
    ~ShapeRequest() override { ShapeRequest::wait(); }
    void wait() override {
      if (!waited_) meta_wait(id_);
      waited_ = true;
      scratch_ = Buffer();
    }

   private:
    int64_t id_;
    Buffer scratch_;
    bool waited_ = false;
  };
  // counted: the bytes count_ring counts; buffer: the collective's buffer, as the MPI communicator
  // compares it with kRingMinBytes; n, dtype: the ring's (RingCollective::Args).
  std::unique_ptr<Request> issue(int64_t& field, size_t counted, DryCollective kind, RingOp op, size_t buffer, size_t n,
                                 DType dtype) {
    const int64_t before = field;
    count_ring(field, counted);
    Buffer scratch;
    if (ring_ && buffer >= kRingMinBytes) {
      const size_t bytes = ring_shape(op, size_, n, dtype_size(dtype)).scratch_bytes;
      if (bytes > 0) scratch = Buffer(bytes, MemCategory::Communication, false, Device::Meta, mem_tag::kRingScratch);
    }
    return std::make_unique<ShapeRequest>(meta_collective(this, kind, field - before), std::move(scratch));
  }

 public:
  ShapeCommunicator(int rank, int size, bool ring) : rank_(rank), size_(size), ring_(ring && size > 1) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return fmt::format("shape({} of {})", rank_, size_); }
  Device device() const override { return Device::Meta; }
  std::unique_ptr<Request> all_gather_async(const Tensor& out, const Tensor& in) override {
    return issue(stats_.all_gather_bytes, out.nbytes(), DryCollective::AllGather, RingOp::AllGather, out.nbytes(),
                 in.nbytes(), DType::U8);
  }
  std::unique_ptr<Request> reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp) override {
    return issue(stats_.reduce_scatter_bytes, in.nbytes(), DryCollective::ReduceScatter, RingOp::ReduceScatter,
                 in.nbytes(), size_t(out.numel()), in.dtype);
  }
  std::unique_ptr<Request> all_reduce_async(const Tensor& buf, ReduceOp) override {
    return issue(stats_.all_reduce_bytes, 2 * buf.nbytes(), DryCollective::AllReduce, RingOp::AllReduce,
                 buf.nbytes(), size_t(buf.numel()), buf.dtype);
  }
  double all_reduce_sum(double value) override {
    meta_wait(meta_collective(this, DryCollective::Scalar, 0));  // blocking: a latency
    return value;
  }
  void broadcast(const Tensor& buf, int root) override {
    count_broadcast(buf.nbytes(), root);
    meta_wait(meta_collective(this, DryCollective::Broadcast, int64_t(buf.nbytes())));
  }
  void broadcast_bytes(void*, size_t n, int root) override { count_broadcast(n, root); }
  void barrier() override {}
  void send(const Tensor& t, int) override {
    stats_.send_bytes += int64_t(t.nbytes());
    ++stats_.calls;
  }
  void recv(const Tensor&, int) override { ++stats_.calls; }
  std::unique_ptr<Communicator> split(int, int) override {
    throw Error("a shape-only communicator cannot be split");
  }
  [[noreturn]] void abort(const std::string& message, ErrorScope scope) override {
    throw Error(message, {.scope = scope});
  }

 private:
  int rank_, size_;
  bool ring_;
};

}  // namespace

namespace {
double g_collective_timeout = 600.0;
Activity g_activity;
}  // namespace

void set_collective_timeout(double seconds) { g_collective_timeout = seconds; }
double collective_timeout() { return g_collective_timeout; }
void set_activity(const Activity& a) { g_activity = a; }
std::string describe_activity() {
  std::string out = g_activity.step > 0 ? fmt::format("step {}", g_activity.step) : "";
  for (const std::string& part : {std::string(g_activity.what ? g_activity.what : ""),
                                 g_activity.unit ? "unit " + *g_activity.unit : std::string()})
    if (!part.empty()) out += (out.empty() ? "" : ", ") + part;
  return out;
}

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }
std::unique_ptr<Communicator> make_shape_communicator(int rank, int size, bool ring) {
  SHARDLM_CHECK(size >= 1 && rank >= 0 && rank < size, "rank {} of {}", rank, size);
  return std::make_unique<ShapeCommunicator>(rank, size, ring);
}

bool launched_by_mpi() {
  auto set = [](const char* v) { return std::getenv(v) != nullptr; };
  if (set("OMPI_COMM_WORLD_SIZE") || set("PMIX_RANK") || set("PMI_RANK")) return true;
  // srun: a Slurm step with more than one task.
  const char* ntasks = std::getenv("SLURM_STEP_NUM_TASKS");
  return ntasks && std::atoi(ntasks) > 1;
}

int local_rank_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
    const char* v = std::getenv(name);
    if (v && *v) {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      SHARDLM_CHECK(*end == '\0' && r >= 0 && r < (1 << 20), "environment variable {}={} is not a local rank", name, v);
      return int(r);
    }
  }
  return 0;
}

namespace {
// srun's per-node task counts, e.g. "2", "8(x2)", "8,8(x3),4": the count when every node has the
// same, else 0.
int uniform_slurm_tasks_per_node(const char* spec) {
  int count = 0;
  const char* p = spec;
  while (*p) {
    char* end = nullptr;
    const long n = std::strtol(p, &end, 10);
    if (end == p || n <= 0) return 0;
    if (count != 0 && n != count) return 0;
    count = int(n);
    p = end;
    if (*p == '(') {  // "(xM)": M nodes with this count
      p = std::strchr(p, ')');
      if (!p) return 0;
      ++p;
    }
    if (*p == ',') ++p;
    else if (*p) return 0;
  }
  return count;
}
}  // namespace

int ranks_per_node_from_environment() {
  auto positive = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::max(0, std::atoi(v)) : -1;  // -1: not set
  };
  // mpirun gives each node its own count: one that does not divide the world's size shows that the
  // nodes differ, and then no one count is right (0, as for srun's "5,3"). Hybrid meshes refuse such
  // a layout naming every host's count (shard/sharding.cpp), which this rank could not do alone.
  if (const int n = positive("OMPI_COMM_WORLD_LOCAL_SIZE"); n >= 0) {
    const int world = positive("OMPI_COMM_WORLD_SIZE");
    return n > 0 && world > 0 && world % n != 0 ? 0 : n;
  }
  if (const char* spec = std::getenv("SLURM_STEP_TASKS_PER_NODE"); spec && *spec)
    return uniform_slurm_tasks_per_node(spec);
  for (const char* name : {"SLURM_NTASKS_PER_NODE", "MPI_LOCALNRANKS"})
    if (const int n = positive(name); n >= 0) return n;
  return 0;
}

std::string describe_launcher() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  std::string who;
  if (!env("OMPI_COMM_WORLD_SIZE").empty()) {
    who = env("SLURM_JOB_ID").empty() ? "mpirun" : "mpirun inside Slurm job " + env("SLURM_JOB_ID");
  } else if (!env("SLURM_STEP_ID").empty() && launched_by_mpi()) {
    const std::string type = env("SLURM_MPI_TYPE");
    who = fmt::format("srun (Slurm job {}, step {}, {})", env("SLURM_JOB_ID"), env("SLURM_STEP_ID"),
                      type.empty() ? (env("PMIX_RANK").empty() ? "no PMI" : "PMIx") : type);
  } else if (launched_by_mpi()) {
    who = "an MPI launcher";
  } else {
    return "";
  }
  const int per_node = ranks_per_node_from_environment();
  std::string local = "none (0)";
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"})
    if (!env(name).empty()) {
      local = name;
      break;
    }
  return fmt::format("{}, {} ranks per node, local rank from {}", who,
                     per_node > 0 ? std::to_string(per_node) : std::string("unknown"), local);
}

#ifndef SHARDLM_HAVE_MPI
CommTiming timing() { return {}; }
HostLayout hosts(Communicator& c) { return single_host(c.size()); }
bool uses_shared_memory(const Communicator&) { return false; }
bool uses_ring(const Communicator&) { return false; }

std::unique_ptr<Communicator> make_world_communicator() {
  if (launched_by_mpi())
    throw Error("started by mpirun or srun, but this shardlm was built without MPI (install libopenmpi-dev and rebuild)");
  return make_local_communicator();
}
#endif

}  // namespace shardlm::comm
