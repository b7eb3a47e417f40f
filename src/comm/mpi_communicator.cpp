// The MPI communicator (OpenMPI). Compiled only when MPI was found (SHARDLM_HAVE_MPI).
#ifdef SHARDLM_HAVE_MPI

#include <fmt/format.h>
#include <mpi.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>

#include "comm/communicator.h"
#include "comm/hosts.h"
#include "comm/mpi_error.h"
#include "comm/ring_collectives.h"
#include "comm/shm_collectives.h"
#include "core/platform.h"
#include "core/timeline.h"
#include "ops/ops.h"

namespace shardlm::comm {

namespace {

// MPI is initialized once per process and finalized when the last communicator goes away.
int g_live_comms = 0;
bool g_we_initialized = false;
MPI_Op g_bf16_sum = MPI_OP_NULL;

// a[i] += b[i] for bf16 bit patterns, adding in f32 and rounding each result to bf16.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16_t* a = static_cast<const bf16_t*>(in);
  bf16_t* b = static_cast<bf16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}


using Clock = std::chrono::steady_clock;

// ---- ending the job -------------------------------------------------------------------------------

// How long a rank that has reported a fatal error waits for MPI_Abort to take it down before it
// ends itself. MPI_Abort asks mpirun to kill every rank; mpirun's teardown needs every node's
// daemon, and with one node's link down it waited over 90 s while the ranks that had reported the
// hang lived on. A rank whose error is out needs nothing more from anyone: it must end, whatever
// the launcher does.
constexpr auto kAbortGrace = std::chrono::seconds(3);

// How long a rank other than 0 that met an every-rank error waits for rank 0 to end the job before
// printing the error itself (MpiCommunicator::abort). Rank 0's MPI_Abort normally ends it well
// within a second; the 2 s once allowed were passed under load on emulated nodes.
constexpr auto kEveryRankGrace = std::chrono::seconds(20);

// MPI_Abort, with this process's end guaranteed within kAbortGrace. Call after printing the error.
[[noreturn]] void end_job() {
  std::fflush(stderr);
  std::fflush(stdout);
  // A thread, not alarm(): MPI_Abort may block in any thread, and the thread's _exit needs no
  // signal disposition of ours. Armed before the call, since MPI_Abort may never return.
  std::thread([] {
    std::this_thread::sleep_for(kAbortGrace);
    std::_Exit(1);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

// ---- the collective watchdog ----------------------------------------------------------------------

// Every world rank's host and pid, exchanged once when the world is made, so a rank whose
// collective timed out can look at its node's peers in /proc.
struct Peer {
  int pid = 0;
  char host[64] = {};
};
std::vector<Peer> g_peers;
int g_world_rank = 0;

void exchange_peers() {
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Peer me;
  me.pid = int(::getpid());
  std::strncpy(me.host, host_name().c_str(), sizeof(me.host) - 1);
  g_peers.resize(size_t(size));
  check_mpi(MPI_Allgather(&me, int(sizeof(Peer)), MPI_BYTE, g_peers.data(), int(sizeof(Peer)), MPI_BYTE, MPI_COMM_WORLD),
        "MPI_Allgather");
}

// "rank 2 (pid 812) is stopped, rank 3 (pid 813) is gone": the peers on this node that cannot be
// taking part (their state in /proc/PID/stat is T, t or Z, or the process no longer exists).
std::string stuck_peers() {
  const std::string host = host_name().substr(0, sizeof(Peer::host) - 1);  // as the peers stored theirs
  std::string out;
  for (size_t r = 0; r < g_peers.size(); ++r) {
    if (int(r) == g_world_rank || std::strncmp(g_peers[r].host, host.c_str(), sizeof(Peer::host)) != 0) continue;
    std::ifstream stat(fmt::format("/proc/{}/stat", g_peers[r].pid));
    std::string line;
    const char* what = nullptr;
    if (!std::getline(stat, line)) {
      what = "gone";
    } else {
      const size_t close = line.rfind(')');
      const char state = close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
      if (state == 'T' || state == 't') what = "stopped";
      if (state == 'Z' || state == 'X') what = "gone";
    }
    if (what) out += fmt::format("{}rank {} (pid {}) is {}", out.empty() ? "" : ", ", r, g_peers[r].pid, what);
  }
  return out;
}

// ---- liveness across nodes -------------------------------------------------------------------------

// A rank cannot see another node's processes in /proc, and MPI reports nothing about a peer whose
// link is down: its messages just never arrive. So every rank answers pings on a communicator of
// their own (the progress thread tests for them every round, and at least every 100 ms when idle;
// without the thread, the waits do), and a rank whose collective timed out pings the ranks of the
// other nodes: those that do not answer within a moment are named, with their host.
MPI_Comm g_ping_comm = MPI_COMM_NULL;
MPI_Request g_ping_req = MPI_REQUEST_NULL;  // the posted receive of the next ping; guarded by g_ping_mu
int g_ping_in = 0;
std::mutex g_ping_mu;  // answer_pings runs on the progress thread and on waiting threads
constexpr int kPingTag = 1, kPongTag = 2;
const int kPong = 0;

void start_answering_pings() {
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &g_ping_comm), "MPI_Comm_dup");
  check_mpi(MPI_Irecv(&g_ping_in, 1, MPI_INT, MPI_ANY_SOURCE, kPingTag, g_ping_comm, &g_ping_req), "MPI_Irecv");
}

// Answers every ping that has arrived. Best effort: an MPI error here must not end a healthy rank.
void answer_pings() {
  std::lock_guard lock(g_ping_mu);
  while (g_ping_req != MPI_REQUEST_NULL) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Test(&g_ping_req, &flag, &st) != MPI_SUCCESS || !flag) return;
    MPI_Request pong;
    if (MPI_Isend(&kPong, 1, MPI_INT, st.MPI_SOURCE, kPongTag, g_ping_comm, &pong) == MPI_SUCCESS)
      MPI_Request_free(&pong);
    if (MPI_Irecv(&g_ping_in, 1, MPI_INT, MPI_ANY_SOURCE, kPingTag, g_ping_comm, &g_ping_req) != MPI_SUCCESS)
      g_ping_req = MPI_REQUEST_NULL;
  }
}

void stop_answering_pings() {
  std::lock_guard lock(g_ping_mu);
  if (g_ping_req != MPI_REQUEST_NULL) {
    MPI_Cancel(&g_ping_req);
    MPI_Wait(&g_ping_req, MPI_STATUS_IGNORE);
  }
  if (g_ping_comm != MPI_COMM_NULL) MPI_Comm_free(&g_ping_comm);
}

// "rank 2 on node2 does not answer, rank 3 on node2 does not answer": the ranks on other nodes
// that did not answer a ping within `patience`. Empty when all did. `remote` counts the ranks asked.
std::string silent_remote_peers(std::chrono::milliseconds patience, int& remote) {
  remote = 0;
  if (g_ping_comm == MPI_COMM_NULL) return "";
  const char* mine = g_peers[size_t(g_world_rank)].host;
  std::vector<int> ranks;
  std::vector<MPI_Request> pongs;
  std::vector<int> in(g_peers.size());
  static const int ping = 0;
  for (size_t r = 0; r < g_peers.size(); ++r) {
    if (std::strncmp(g_peers[r].host, mine, sizeof(Peer::host)) == 0) continue;
    MPI_Request send, recv;
    if (MPI_Isend(&ping, 1, MPI_INT, int(r), kPingTag, g_ping_comm, &send) != MPI_SUCCESS ||
        MPI_Irecv(&in[r], 1, MPI_INT, int(r), kPongTag, g_ping_comm, &recv) != MPI_SUCCESS)
      continue;
    MPI_Request_free(&send);  // an unreachable peer's ping may never go; the job is ending anyway
    ranks.push_back(int(r));
    pongs.push_back(recv);
  }
  remote = int(ranks.size());
  const auto until = Clock::now() + patience;
  for (int answered = 0; answered < remote && Clock::now() < until;) {
    answer_pings();  // another node's rank may be asking us the same
    answered = 0;
    for (MPI_Request& p : pongs) {
      int flag = p == MPI_REQUEST_NULL;
      if (!flag) MPI_Test(&p, &flag, MPI_STATUS_IGNORE);
      answered += flag;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (pongs[i] == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&pongs[i]);
    MPI_Request_free(&pongs[i]);
    out += fmt::format("{}rank {} on {} does not answer", out.empty() ? "" : ", ", ranks[i],
                       g_peers[size_t(ranks[i])].host);
  }
  return out;
}

// ---- progress --------------------------------------------------------------------------------------

// MPI moves a non-blocking collective's data only while some thread of the process is inside an
// MPI call. A gather issued ahead of a unit's compute would otherwise sit until the compute ended
// and the engine waited on it: nothing would overlap. So one progress thread per process (MPI is
// initialized with MPI_THREAD_MULTIPLE) tests every collective in flight and marks each complete;
// waits only watch that mark. It sleeps ~100 us between rounds of tests (after a short spin for
// the small, latency-bound collectives): each test moves a large fragment over shared memory, and
// a spinning thread would take half a core from the compute threads it is meant to hide behind.
// Where MPI grants less than MPI_THREAD_MULTIPLE, there is no thread and the waiting thread drives
// the same polls itself (no overlap, as before).
// A collective in flight: an MPI request the progress thread tests, a ring collective
// (ring_collectives.h) whose steps it advances, or (external) one that a shared-memory group
// (shm_collectives.h) runs and reports complete through Progress::complete.
struct InFlight {
  MPI_Request req = MPI_REQUEST_NULL;
  std::shared_ptr<RingCollective> ring;
  bool external = false;
  std::function<std::string()> holdup;  // ring, external: who it waits for, for the watchdog ("" if nobody)
  const char* op = "";
  Clock::time_point issued;
  Clock::time_point completed;  // when a test found it complete; guarded by Progress::mu_
  bool done = false;            // guarded by Progress::mu_
};

class Progress {
 public:
  // Starts the thread (MPI initialized with MPI_THREAD_MULTIPLE).
  void start() { thread_ = std::thread([this] { run(); }); }
  // Stops the thread before MPI_Finalize (every collective has been waited on by then).
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    work_.notify_all();
    thread_.join();
  }
  bool threaded() const { return thread_.joinable(); }

  std::shared_ptr<InFlight> add(MPI_Request req, const char* op) {
    auto f = std::make_shared<InFlight>();
    f->req = req;
    return track(std::move(f), op);
  }
  // A ring collective (its first step already posted), advanced by the polls.
  std::shared_ptr<InFlight> add_ring(std::shared_ptr<RingCollective> ring, const char* op,
                                     std::function<std::string()> holdup) {
    auto f = std::make_shared<InFlight>();
    f->ring = std::move(ring);
    f->holdup = std::move(holdup);
    return track(std::move(f), op);
  }
  // A collective completed by someone else's call to complete() (a shared-memory group's worker).
  std::shared_ptr<InFlight> add_external(const char* op, std::function<std::string()> holdup) {
    auto f = std::make_shared<InFlight>();
    f->external = true;
    f->holdup = std::move(holdup);
    return track(std::move(f), op);
  }
  void complete(InFlight* f) {
    finish({f});
    done_.notify_all();
  }

  // Waits up to `slice` for `f` to complete; true when it has. Without the thread, this thread
  // tests the collectives itself.
  bool wait_for(const InFlight& f, std::chrono::microseconds slice) {
    if (!threaded()) {
      const auto until = Clock::now() + slice;
      do {
        poll_round();
        std::lock_guard lock(mu_);
        if (f.done) return true;
      } while (Clock::now() < until);
      return false;
    }
    std::unique_lock lock(mu_);
    return done_.wait_for(lock, slice, [&] { return f.done; });
  }

  // A wait on `f` that began at `begin` has returned: counts the time from `begin` to the
  // collective's completion (the waiter's wake-up latency is not communication), so waits always lie
  // within busy time.
  void add_waited(const InFlight& f, Clock::time_point begin) {
    std::lock_guard lock(mu_);
    timing_.waited_seconds += std::max(0.0, std::chrono::duration<double>(f.completed - begin).count());
  }
  CommTiming timing() {
    std::lock_guard lock(mu_);
    CommTiming t = timing_;
    if (!active_.empty()) t.busy_seconds += std::chrono::duration<double>(Clock::now() - busy_since_).count();
    return t;
  }

 private:
  std::shared_ptr<InFlight> track(std::shared_ptr<InFlight> f, const char* op) {
    f->op = op;
    f->issued = Clock::now();
    {
      std::lock_guard lock(mu_);
      if (active_.empty()) busy_since_ = f->issued;
      active_.push_back(f);
    }
    work_.notify_one();
    return f;
  }

  // Marks `finished` done (now) and closes the busy interval when nothing is left in flight.
  void finish(const std::vector<InFlight*>& finished) {
    const auto now = Clock::now();
    std::lock_guard lock(mu_);
    for (InFlight* f : finished) {
      f->done = true;
      f->completed = now;
      timeline::record(f->op, "comm", timeline::kCommTrack, f->issued, now);
    }
    std::erase_if(active_, [](const auto& f) { return f->done; });
    if (active_.empty()) timing_.busy_seconds += std::chrono::duration<double>(now - busy_since_).count();
  }

  // Tests every MPI collective in flight once (a ring's step in flight, and the steps after it that
  // complete at once), marking the completed ones done.
  void poll_round() {
    answer_pings();
    std::vector<std::shared_ptr<InFlight>> snapshot;
    {
      std::lock_guard lock(mu_);
      snapshot = active_;
    }
    std::vector<InFlight*> finished;
    for (const auto& f : snapshot) {
      if (f->external) continue;
      if (f->ring) {
        if (f->ring->test()) finished.push_back(f.get());
        continue;
      }
      int flag = 0;
      check_mpi(MPI_Test(&f->req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
      if (flag) finished.push_back(f.get());
    }
    if (finished.empty()) return;
    finish(finished);
    done_.notify_all();
  }

  void run() {
    auto spin_until = Clock::now();
    for (;;) {
      {
        std::unique_lock lock(mu_);
        if (active_.empty()) {
          // Idle: still answer pings (see "liveness") every 100 ms.
          if (!work_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping_ || !active_.empty(); })) {
            lock.unlock();
            answer_pings();
            continue;
          }
          spin_until = Clock::now() + std::chrono::microseconds(500);
        }
        if (stopping_ && active_.empty()) return;
      }
      try {
        poll_round();
      } catch (const Error& e) {
        std::fprintf(stderr, "shardlm: error: rank %d: %s\n", g_world_rank, e.what());
        end_job();
      }
      if (Clock::now() > spin_until) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  std::mutex mu_;
  std::condition_variable work_, done_;
  std::vector<std::shared_ptr<InFlight>> active_;
  bool stopping_ = false;
  Clock::time_point busy_since_;
  CommTiming timing_;
  std::thread thread_;
};

// Never destroyed: a rank that exits without finalizing MPI must not join (or terminate on) the
// thread during static destruction.
Progress& g_progress = *new Progress;

// Waits for a collective until the collective timeout passes; then names what hung and ends the job.
void wait_or_abort(const InFlight& f) {
  const double limit = collective_timeout();
  const auto begin = Clock::now();
  auto last = begin;
  double waited = 0;     // seconds since begin, as of `last`
  double suspended = 0;  // seconds this process itself did not run (it was stopped, then continued)
  for (;;) {
    // Short slices first (most collectives complete within a few ms), then 100 ms ones: the
    // watchdog only needs to look now and then.
    const auto slice = waited < 0.02 ? std::chrono::microseconds(100) : std::chrono::microseconds(100000);
    if (g_progress.wait_for(f, slice)) break;
    const auto now = Clock::now();
    const double gap = std::chrono::duration<double>(now - last).count();
    if (gap > 1.0) suspended += gap;  // slices are at most 0.1 s apart: a gap of seconds is our own stop
    last = now;
    waited = std::chrono::duration<double>(now - begin).count();
    if (limit <= 0 || waited < limit) continue;
    if (suspended > 0.5 * waited) {
      std::fprintf(stderr, "shardlm: error: rank %d: this rank was stopped for %.0f s in %s (%s); ending the job\n",
                   g_world_rank, suspended, f.op, describe_activity().c_str());
      end_job();
    }
    std::string stuck = stuck_peers();
    int remote = 0;
    if (stuck.empty()) stuck = silent_remote_peers(std::chrono::milliseconds(1500), remote);
    if (!stuck.empty() && remote > 0) stuck += " (its node or its link may be down)";
    // A shared-memory collective or a ring knows which rank it waits for, stopped or not: named when
    // every rank is there and answers.
    if (const std::string holdup = f.holdup ? f.holdup() : std::string(); stuck.empty() && !holdup.empty())
      stuck = holdup + (remote > 0 ? " (no rank on this node is stopped or gone, and every rank on the other nodes "
                                     "answers: it may be in another collective, or slower than the timeout)"
                                   : " (no rank on this node is stopped or gone: it may be in another collective, or "
                                     "slower than the timeout)");
    if (stuck.empty() && remote > 0)
      stuck = "no rank on this node is stopped or gone, and every rank on the other nodes answers (one may be in "
              "another collective, or slower than the timeout)";
    std::fprintf(stderr,
                 "shardlm: error: rank %d: %s (%s) did not complete within collective_timeout %.0f s: %s; ending the "
                 "job\n",
                 g_world_rank, f.op, describe_activity().c_str(), limit,
                 stuck.empty() ? "no rank on this node is stopped or gone (a rank on another node may be, or one is "
                                 "slower than the timeout)"
                               : stuck.c_str());
    std::fflush(stderr);
    // The other live ranks wait in the same collective and time out within moments: give them a
    // second to say what they see before the job is taken down.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    end_job();
  }
  g_progress.add_waited(f, begin);
  if (timeline::recording()) timeline::record(fmt::format("wait: {}", f.op), "wait", timeline::kMainTrack, begin, Clock::now());
}

MPI_Datatype mpi_type(DType d) { return d == DType::F32 ? MPI_FLOAT : MPI_UINT16_T; }
MPI_Op mpi_sum(DType d) { return d == DType::F32 ? MPI_SUM : g_bf16_sum; }

class MpiRequest final : public Request {
 public:
  MpiRequest(MPI_Request r, const char* op, std::function<void()> after)
      : flight_(g_progress.add(r, op)), after_(std::move(after)) {}
  explicit MpiRequest(std::shared_ptr<InFlight> flight, std::function<void()> after = nullptr)
      : flight_(std::move(flight)), after_(std::move(after)) {}
  ~MpiRequest() override {
    if (!done_) {
      try {
        wait();
      } catch (...) {
      }
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    wait_or_abort(*flight_);
    if (after_) after_();
  }

 private:
  std::shared_ptr<InFlight> flight_;
  std::function<void()> after_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    ++g_live_comms;
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Ranks that share one node reduce and gather through shared memory (shm_collectives.h).
    shm_ = ShmGroup::create(comm_, g_progress.threaded());
    if (!shm_ && size_ > 1) make_ring();
  }
  ~MpiCommunicator() override {
    shm_.reset();  // collective, before the communicator goes
    if (ring_comm_ != MPI_COMM_NULL) MPI_Comm_free(&ring_comm_);
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
    if (--g_live_comms == 0 && g_we_initialized) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) {
        g_progress.stop();
        stop_answering_pings();
        if (g_bf16_sum != MPI_OP_NULL) MPI_Op_free(&g_bf16_sum);
        MPI_Finalize();
      }
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  std::unique_ptr<Request> all_gather_async(const Tensor& out, const Tensor& in) override {
    check_gather("all_gather", out, in);
    if (use_shm(out.nbytes(), false)) {
      count_ring(stats_.all_gather_bytes, out.nbytes());
      auto f = shm_flight("all-gather");
      shm_->all_gather(out.data, in.data, in.nbytes(), [f] { g_progress.complete(f.get()); });
      return std::make_unique<MpiRequest>(f);
    }
    if (use_ring(out.nbytes())) {
      count_ring(stats_.all_gather_bytes, out.nbytes());
      return ring_request({.op = RingOp::AllGather, .dtype = DType::U8, .out = out.data, .in = in.data,
                           .n = in.nbytes()},
                          "all-gather", nullptr);
    }
    const int n = int(in.numel());
    const char* slice = static_cast<const char*>(out.data) + in.nbytes() * size_t(rank_);
    const void* send = in.data == slice ? MPI_IN_PLACE : in.data;
    MPI_Request r;
    check_mpi(MPI_Iallgather(send, n, mpi_type(in.dtype), out.data, n, mpi_type(in.dtype), comm_, &r), "MPI_Iallgather");
    count_ring(stats_.all_gather_bytes, out.nbytes());
    return std::make_unique<MpiRequest>(r, "all-gather", nullptr);
  }

  std::unique_ptr<Request> reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override {
    check_gather("reduce_scatter", in, out);
    if (use_shm(in.nbytes(), true)) {
      count_ring(stats_.reduce_scatter_bytes, in.nbytes());
      auto f = shm_flight("reduce-scatter");
      shm_->reduce_scatter(out.data, in.data, size_t(out.numel()), in.dtype, scale_of(op),
                           [f] { g_progress.complete(f.get()); });
      return std::make_unique<MpiRequest>(f);
    }
    if (use_ring(in.nbytes())) {
      count_ring(stats_.reduce_scatter_bytes, in.nbytes());
      return ring_request({.op = RingOp::ReduceScatter, .dtype = in.dtype, .out = out.data, .in = in.data,
                           .n = size_t(out.numel())},
                          "reduce-scatter", averager(out, op));
    }
    MPI_Request r;
    check_mpi(MPI_Ireduce_scatter_block(in.data, out.data, int(out.numel()), mpi_type(in.dtype), mpi_sum(in.dtype), comm_, &r),
          "MPI_Ireduce_scatter_block");
    count_ring(stats_.reduce_scatter_bytes, in.nbytes());
    return std::make_unique<MpiRequest>(r, "reduce-scatter", averager(out, op));
  }

  std::unique_ptr<Request> all_reduce_async(const Tensor& buf, ReduceOp op) override {
    check_tensor("all_reduce", buf);
    if (use_shm(buf.nbytes(), true)) {
      count_ring(stats_.all_reduce_bytes, 2 * buf.nbytes());
      auto f = shm_flight("all-reduce");
      shm_->all_reduce(buf.data, size_t(buf.numel()), buf.dtype, scale_of(op), [f] { g_progress.complete(f.get()); });
      return std::make_unique<MpiRequest>(f);
    }
    if (use_ring(buf.nbytes())) {
      count_ring(stats_.all_reduce_bytes, 2 * buf.nbytes());
      return ring_request({.op = RingOp::AllReduce, .dtype = buf.dtype, .out = buf.data, .n = size_t(buf.numel())},
                          "all-reduce", averager(buf, op));
    }
    MPI_Request r;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf.data, int(buf.numel()), mpi_type(buf.dtype), mpi_sum(buf.dtype), comm_, &r),
          "MPI_Iallreduce");
    count_ring(stats_.all_reduce_bytes, 2 * buf.nbytes());
    return std::make_unique<MpiRequest>(r, "all-reduce", averager(buf, op));
  }

  double all_reduce_sum(double value) override {
    double out = 0.0;
    MPI_Request r;
    check_mpi(MPI_Iallreduce(&value, &out, 1, MPI_DOUBLE, MPI_SUM, comm_, &r), "MPI_Iallreduce");
    wait_or_abort(*g_progress.add(r, "all-reduce of a scalar"));
    return out;
  }

  void broadcast(const Tensor& buf, int root) override {
    SHARDLM_CHECK(root >= 0 && root < size_, "broadcast: root {} out of range for {} ranks", root, size_);
    bcast(buf.data, buf.nbytes(), root);
    count_broadcast(buf.nbytes(), root);
  }

  void broadcast_bytes(void* data, size_t n, int root) override {
    SHARDLM_CHECK(root >= 0 && root < size_, "broadcast: root {} out of range for {} ranks", root, size_);
    bcast(data, n, root);
    count_broadcast(n, root);
  }

  void barrier() override {
    MPI_Request r;
    check_mpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
    wait_or_abort(*g_progress.add(r, "barrier"));
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    return std::make_unique<MpiCommunicator>(sub);
  }

  [[noreturn]] void abort(const std::string& message, ErrorScope scope) override {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    // Rank 0 prints and ends the job at once. Another rank first gives rank 0's MPI_Abort time to
    // end it unprinted, so that an error many ranks meet is printed once:
    // - an every-rank error is rank 0's to print. On a loaded machine the teardown can take seconds
    //   to reach another node's ranks, so this rank waits kEveryRankGrace before printing it itself
    //   (rank 0 should have met it too, but must not be the only way the error gets out);
    // - an error of its own waits two seconds (rank 0 may meet the same one), so that a rank alone
    //   in trouble still ends the job in seconds.
    if (world_rank != 0)
      std::this_thread::sleep_for(scope == ErrorScope::every_rank ? kEveryRankGrace : std::chrono::seconds(2));
    std::fprintf(stderr, "shardlm: error: rank %d: %s\n", world_rank, message.c_str());
    end_job();
  }

  // Point to point, non-blocking underneath so that the watchdog names a peer that never sends
  // (or never receives: a large message waits for its receiver) instead of hanging. One tag: the
  // messages between two ranks match in the order they are issued.
  static constexpr int kPointToPointTag = 7;
  void send(const Tensor& t, int dst) override {
    check_peer("send", t, dst);
    MPI_Request r;
    check_mpi(MPI_Isend(t.data, int(t.nbytes()), MPI_BYTE, dst, kPointToPointTag, comm_, &r), "MPI_Isend");
    wait_or_abort(*g_progress.add(r, "send"));
    stats_.send_bytes += int64_t(t.nbytes());
    ++stats_.calls;
  }

  void recv(const Tensor& t, int src) override {
    check_peer("recv", t, src);
    MPI_Request r;
    check_mpi(MPI_Irecv(t.data, int(t.nbytes()), MPI_BYTE, src, kPointToPointTag, comm_, &r), "MPI_Irecv");
    wait_or_abort(*g_progress.add(r, "recv"));
    ++stats_.calls;
  }

 private:
  void bcast(void* data, size_t n, int root) {
    MPI_Request r;
    check_mpi(MPI_Ibcast(data, int(n), MPI_BYTE, root, comm_, &r), "MPI_Ibcast");
    wait_or_abort(*g_progress.add(r, "broadcast"));
  }
  // Which collectives take the shared-memory path (bench/RESULTS.md, 2026-11-24, bench/comm.sh):
  // reductions of a chunk or more — MPI sums in one thread, the group at memory speed on every
  // rank at once: 4-9x faster reduce-scatters at unit sizes — and all-gathers only when the group
  // copies with several threads: MPI already moves a large gather in one copy (single-copy
  // shared memory), where the group needs two (in, out), and single-threaded it was 1.1-1.5x slower.
  bool use_shm(size_t full_bytes, bool reduction) const {
    return shm_ && full_bytes >= ShmGroup::kMinBytes && (reduction || shm_->threads() > 1);
  }
  // Which collectives take the ring (ring_collectives.h): those of a group that spans nodes and has
  // no shared-memory path, from kRingMinBytes (below it a collective is latency-bound, and MPI's
  // algorithms answer in one or two rounds where the ring takes p - 1). SHARDLM_RING=0 leaves every
  // collective to MPI (to compare); SHARDLM_RING=1 takes the ring for every size, within one node
  // too (so that one machine can test it: with SHARDLM_SHM=0).
  bool use_ring(size_t full_bytes) const {
    return ring_comm_ != MPI_COMM_NULL && (ring_always_ || full_bytes >= kRingMinBytes);
  }
  // Collective (every rank of comm_ constructs its communicator together).
  void make_ring() {
    const char* env = std::getenv("SHARDLM_RING");
    const std::string mode = env ? env : "";
    if (mode != "" && mode != "auto" && mode != "0" && mode != "1")
      throw Error(fmt::format("SHARDLM_RING={}: expected 0 (MPI's collectives), 1 (the ring for every group and "
                              "size) or auto (the ring between nodes; the default)",
                              mode));
    if (mode == "0") return;
    ring_always_ = mode == "1";
    const HostLayout layout = comm::hosts(*this);
    if (layout.hosts.size() < 2 && !ring_always_) return;
    ring_order_ = std::make_shared<const std::vector<int>>(ring_order(layout.host_of));
    // "rank 3 on node2" per rank of comm_, in world ranks as every other message names them.
    MPI_Group mine, world;
    check_mpi(MPI_Comm_group(comm_, &mine), "MPI_Comm_group");
    check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
    std::vector<int> local(static_cast<size_t>(size_)), global(static_cast<size_t>(size_));
    std::iota(local.begin(), local.end(), 0);
    check_mpi(MPI_Group_translate_ranks(mine, size_, local.data(), world, global.data()), "MPI_Group_translate_ranks");
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    auto names = std::make_shared<std::vector<std::string>>();
    for (int r = 0; r < size_; ++r)
      names->push_back(
          fmt::format("rank {} on {}", global[size_t(r)], layout.hosts[size_t(layout.host_of[size_t(r)])]));
    ring_names_ = std::move(names);
    check_mpi(MPI_Comm_dup(comm_, &ring_comm_), "MPI_Comm_dup");
  }
  std::unique_ptr<Request> ring_request(RingCollective::Args args, const char* op, std::function<void()> after) {
    args.comm = ring_comm_;
    // The same sequence on every rank: one tag per collective (times the lanes: below 32767, the
    // least MPI_TAG_UB MPI allows).
    args.tag = ring_tag_ = ring_tag_ % (32000 / RingCollective::kLanes) + 1;
    args.order = ring_order_.get();
    args.rank = rank_;
    auto ring = std::make_shared<RingCollective>(args);
    // The flight holds the ring, and the ring borrows the order: the holdup keeps both alive.
    auto holdup = [r = ring.get(), names = ring_names_, order = ring_order_] {
      return fmt::format("{} has not sent {} of the ring", (*names)[size_t(r->waiting_for())], r->progress());
    };
    auto f = g_progress.add_ring(std::move(ring), op, std::move(holdup));
    return std::make_unique<MpiRequest>(std::move(f), std::move(after));
  }
  std::shared_ptr<InFlight> shm_flight(const char* op) {
    return g_progress.add_external(op, [g = shm_.get()] { return g->holdup(); });
  }
  float scale_of(ReduceOp op) const { return op == ReduceOp::Avg ? 1.0f / float(size_) : 1.0f; }
  std::function<void()> averager(const Tensor& t, ReduceOp op) const {
    if (op != ReduceOp::Avg || size_ == 1) return nullptr;
    const float s = 1.0f / float(size_);
    return [t, s] { ops::scale_inplace(t, s); };
  }

  friend HostLayout comm::hosts(Communicator&);
  friend bool comm::uses_shared_memory(const Communicator&);
  friend bool comm::uses_ring(const Communicator&);
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<ShmGroup> shm_;  // null: the ranks span nodes (or SHARDLM_SHM=0); MPI collectives
  // The ring (use_ring): its own communicator (null: no ring), order and rank names for the watchdog.
  MPI_Comm ring_comm_ = MPI_COMM_NULL;
  bool ring_always_ = false;
  int ring_tag_ = 0;
  std::shared_ptr<const std::vector<int>> ring_order_;
  std::shared_ptr<const std::vector<std::string>> ring_names_;
};

}  // namespace

CommTiming timing() { return g_progress.timing(); }

HostLayout hosts(Communicator& c) {
  auto* m = dynamic_cast<MpiCommunicator*>(&c);
  if (!m) return single_host(c.size());
  const int rank = m->rank_, size = m->size_;
  // The lowest rank of each rank's shared-memory group stands for its host.
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(m->comm_, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int lowest = rank;
  check_mpi(MPI_Allreduce(&rank, &lowest, 1, MPI_INT, MPI_MIN, node), "MPI_Allreduce");
  MPI_Comm_free(&node);
  std::vector<int> lowest_of(size_t(size), 0);
  check_mpi(MPI_Allgather(&lowest, 1, MPI_INT, lowest_of.data(), 1, MPI_INT, m->comm_), "MPI_Allgather");
  char mine[sizeof(Peer::host)] = {};
  std::strncpy(mine, host_name().c_str(), sizeof(mine) - 1);
  std::vector<char> names(size_t(size) * sizeof(mine));
  check_mpi(MPI_Allgather(mine, int(sizeof(mine)), MPI_CHAR, names.data(), int(sizeof(mine)), MPI_CHAR, m->comm_),
            "MPI_Allgather");
  HostLayout out;
  std::vector<int> host_of_lowest(size_t(size), -1);
  for (int r = 0; r < size; ++r) {
    int& h = host_of_lowest[size_t(lowest_of[size_t(r)])];
    if (h < 0) {  // ranks go up, so a host's lowest rank comes first
      h = int(out.hosts.size());
      out.hosts.emplace_back(&names[size_t(r) * sizeof(mine)]);
    }
    out.host_of.push_back(h);
  }
  return out;
}

bool uses_shared_memory(const Communicator& c) {
  const auto* m = dynamic_cast<const MpiCommunicator*>(&c);
  return m && m->shm_ != nullptr;
}

bool uses_ring(const Communicator& c) {
  const auto* m = dynamic_cast<const MpiCommunicator*>(&c);
  return m && m->ring_comm_ != MPI_COMM_NULL;
}


std::unique_ptr<Communicator> make_world_communicator() {
  if (!launched_by_mpi()) return make_local_communicator();
#ifdef OPEN_MPI
  // srun started the ranks, but not through PMIx (--mpi=none or pmi2): OpenMPI 4 has no other way to
  // learn its rank from Slurm, and MPI_Init would abort with a page of text on every rank.
  if (!std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("PMIX_RANK") && std::getenv("SLURM_STEP_NUM_TASKS")) {
    const char* type = std::getenv("SLURM_MPI_TYPE");
    throw Error(fmt::format("srun started {} tasks without PMIx (--mpi={}); this OpenMPI learns ranks from "
                            "Slurm only through PMIx: run srun --mpi=pmix (srun --mpi=list shows what Slurm has)",
                            std::getenv("SLURM_STEP_NUM_TASKS"), type && *type ? type : "none"));
  }
#endif
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // MULTIPLE: the progress thread tests collectives while the main thread issues others.
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    g_we_initialized = true;
  }
  int level = 0;
  MPI_Query_thread(&level);
  // SHARDLM_PROGRESS_THREAD=0 leaves progress to the waits (no overlap): for measuring the thread.
  const char* want = std::getenv("SHARDLM_PROGRESS_THREAD");
  const bool wanted = !want || std::string(want) != "0";
  if (level == MPI_THREAD_MULTIPLE && wanted && !g_progress.threaded()) g_progress.start();
  if (g_bf16_sum == MPI_OP_NULL) check_mpi(MPI_Op_create(&bf16_sum, 1, &g_bf16_sum), "MPI_Op_create");
  // Errors come back as return codes (turned into shardlm Errors) instead of aborting inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  exchange_peers();
  start_answering_pings();
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
}

}  // namespace shardlm::comm

#endif  // SHARDLM_HAVE_MPI
