// Shared-memory collectives (see shm_collectives.h for the algorithms and their invariants).
#ifdef SHARDLM_HAVE_MPI

#include "comm/shm_collectives.h"

#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_error.h"
#include "core/float_bits.h"
#include "core/platform.h"

namespace shardlm::comm {

namespace {

// The first bytes of each rank's piece of the window: its arrival counter, alone in a page so
// that the spinning readers of one rank's counter never share a line with another's data.
constexpr size_t kControlBytes = 4096;
using Counter = std::atomic<uint32_t>;
static_assert(Counter::is_always_lock_free && sizeof(Counter) == sizeof(uint32_t),
              "the futex needs a plain 32-bit word");

long futex(Counter* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Elements summed per block: the accumulator stays in L1 while the sources stream through.
constexpr size_t kSumBlock = 2048;

template <class T>
float load_as_f32(const T* p, size_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return p[i];
  } else {
    uint32_t u = bits::bf16_to_f32(p[i]);
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
}

// out[i] = scale * (src[0][i] + src[1][i] + ... ), i < n, summed in f32 in source order; T is
// float or uint16_t (bf16 bits, rounded once at the end). `out` may be one of the sources.
template <class T>
void sum_into(T* out, const T* const* src, int nsrc, size_t n, float scale, int threads) {
  const size_t blocks = (n + kSumBlock - 1) / kSumBlock;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && blocks > 1)
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = b * kSumBlock, m = std::min(kSumBlock, n - lo);
    alignas(64) float acc[kSumBlock];
    for (size_t i = 0; i < m; ++i) acc[i] = load_as_f32(src[0], lo + i);
    for (int s = 1; s < nsrc; ++s)
      for (size_t i = 0; i < m; ++i) acc[i] += load_as_f32(src[s], lo + i);
    if (scale != 1.0f)
      for (size_t i = 0; i < m; ++i) acc[i] *= scale;
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(out + lo, acc, m * sizeof(float));
    } else {
      for (size_t i = 0; i < m; ++i) {
        uint32_t u;
        std::memcpy(&u, &acc[i], sizeof u);
        out[lo + i] = bits::f32_to_bf16(u);
      }
    }
  }
}

void sum_any(void* out, const void* const* src, int nsrc, size_t n, DType dtype, float scale, int threads) {
  if (dtype == DType::F32)
    sum_into(static_cast<float*>(out), reinterpret_cast<const float* const*>(src), nsrc, n, scale, threads);
  else
    sum_into(static_cast<uint16_t*>(out), reinterpret_cast<const uint16_t* const*>(src), nsrc, n, scale, threads);
}

// memcpy split over `threads` OpenMP threads (pieces of at least 256 KiB).
void copy(void* dst, const void* src, size_t bytes, int threads) {
  if (dst == src || bytes == 0) return;
  const size_t piece = std::max<size_t>(size_t(256) << 10, (bytes + size_t(threads) - 1) / size_t(threads));
  const size_t pieces = (bytes + piece - 1) / piece;
  if (threads <= 1 || pieces <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < pieces; ++i) {
    const size_t lo = i * piece;
    std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, std::min(piece, bytes - lo));
  }
}

int comm_threads_from_environment() {
  const char* env = std::getenv("SHARDLM_COMM_THREADS");
  if (!env || !*env) return 1;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < 1 || n > 1024)
    throw Error(fmt::format("SHARDLM_COMM_THREADS='{}': expected a thread count from 1 to 1024", env));
  return int(n);
}

}  // namespace

struct ShmGroup::Impl {
  MPI_Win win = MPI_WIN_NULL;
  int rank = 0, size = 1;
  std::vector<int> world_ranks;  // [size]
  std::vector<Counter*> arrived;  // [size]: each rank's barrier count, in its piece of the window
  std::vector<char*> slot;        // [size]: each rank's two halves of kHalfBytes
  int threads = 1;

  // Worker state: only the thread running jobs touches these (the caller's, when not threaded).
  uint32_t barriers = 0;  // barriers this rank has arrived at
  uint64_t chunks = 0;    // chunks run: the parity picks the half
  std::atomic<int> waiting_for{-1};  // the rank the worker waits for at a barrier, or -1

  bool threaded = false;
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> jobs;  // guarded by mu
  bool stopping = false;                   // guarded by mu

  char* half(int r) const { return slot[size_t(r)] + (chunks & 1) * kHalfBytes; }

  void submit(std::function<void()> job) {
    if (!threaded) {
      job();
      return;
    }
    {
      std::lock_guard lock(mu);
      jobs.push_back(std::move(job));
    }
    cv.notify_one();
  }

  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stopping || !jobs.empty(); });
        if (jobs.empty()) return;  // stopping, and nothing left
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      job();
    }
  }

  // Every rank arrives, then waits until every other rank has arrived at the same barrier.
  void barrier() {
    const uint32_t k = ++barriers;
    Counter* mine = arrived[size_t(rank)];
    mine->store(k, std::memory_order_release);
    futex(mine, FUTEX_WAKE, INT_MAX, nullptr);
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      Counter* theirs = arrived[size_t(p)];
      auto reached = [&](uint32_t seen) { return int32_t(seen - k) >= 0; };  // wraps after 2^32 barriers
      bool done = false;
      for (int spin = 0; spin < 4000 && !done; ++spin) {
        done = reached(theirs->load(std::memory_order_acquire));
        if (!done) cpu_relax();
      }
      if (done) continue;
      waiting_for.store(p, std::memory_order_relaxed);
      for (;;) {
        const uint32_t seen = theirs->load(std::memory_order_acquire);
        if (reached(seen)) break;
        // A bounded sleep: a wake lost to a dying peer costs at most this, and nothing else.
        const timespec slice{0, 50'000'000};
        futex(theirs, FUTEX_WAIT, seen, &slice);
      }
      waiting_for.store(-1, std::memory_order_relaxed);
    }
  }
};

std::unique_ptr<ShmGroup> ShmGroup::create(MPI_Comm comm, bool threaded) {
  int size = 1;
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  const char* env = std::getenv("SHARDLM_SHM");
  if (size == 1 || (env && std::string(env) == "0")) return nullptr;
  // Every rank sees the same answer: all on one node, or not.
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  if (node_size != size) return nullptr;
  // Asserted, not assumed: a window joins the ranks of one host. (MPI's SHARED split says so; with
  // hosts emulated on one machine, each a namespace with its own hostname, it is what keeps them apart.)
  char host[64] = {};
  std::strncpy(host, host_name().c_str(), sizeof(host) - 1);
  std::vector<char> hosts(sizeof(host) * size_t(size));
  check_mpi(MPI_Allgather(host, int(sizeof(host)), MPI_CHAR, hosts.data(), int(sizeof(host)), MPI_CHAR, comm),
            "MPI_Allgather");
  for (int p = 1; p < size; ++p)
    if (std::strncmp(hosts.data(), &hosts[size_t(p) * sizeof(host)], sizeof(host)) != 0)
      throw Error(fmt::format("internal error: a shared-memory group would join hosts {} and {}", hosts.data(),
                              &hosts[size_t(p) * sizeof(host)]));

  auto impl = std::make_unique<Impl>();
  impl->size = size;
  check_mpi(MPI_Comm_rank(comm, &impl->rank), "MPI_Comm_rank");
  impl->threads = comm_threads_from_environment();
  impl->threaded = threaded;

  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");  // each rank's piece on its own pages
  void* base = nullptr;
  const int rc = MPI_Win_allocate_shared(MPI_Aint(kControlBytes + 2 * kHalfBytes), 1, info, comm, &base, &impl->win);
  MPI_Info_free(&info);
  // A node without room for the window (a small /dev/shm) falls back to MPI on every rank alike.
  int ok = rc == MPI_SUCCESS ? 1 : 0, all_ok = 0;
  check_mpi(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");
  if (!all_ok) {
    if (ok) MPI_Win_free(&impl->win);
    if (impl->rank == 0)
      std::fprintf(stderr, "shardlm: warning: no shared-memory window for %d ranks on this node; collectives use MPI\n",
                   size);
    return nullptr;
  }
  new (base) Counter(0);  // each rank initializes its own counter; the barrier below publishes it
  check_mpi(MPI_Barrier(comm), "MPI_Barrier");
  impl->arrived.resize(size_t(size));
  impl->slot.resize(size_t(size));
  for (int p = 0; p < size; ++p) {
    MPI_Aint bytes = 0;
    int disp = 0;
    void* piece = nullptr;
    check_mpi(MPI_Win_shared_query(impl->win, p, &bytes, &disp, &piece), "MPI_Win_shared_query");
    impl->arrived[size_t(p)] = static_cast<Counter*>(piece);
    impl->slot[size_t(p)] = static_cast<char*>(piece) + kControlBytes;
  }
  MPI_Group group, world;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int p = 0; p < size; ++p) ranks[size_t(p)] = p;
  impl->world_ranks.resize(size_t(size));
  MPI_Group_translate_ranks(group, size, ranks.data(), world, impl->world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);

  if (threaded) impl->worker = std::thread([p = impl.get()] { p->run(); });
  return std::unique_ptr<ShmGroup>(new ShmGroup(std::move(impl)));
}

ShmGroup::ShmGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ShmGroup::~ShmGroup() {
  if (impl_->worker.joinable()) {
    {
      std::lock_guard lock(impl_->mu);
      impl_->stopping = true;
    }
    impl_->cv.notify_all();
    impl_->worker.join();
  }
  MPI_Win_free(&impl_->win);
}

std::string ShmGroup::holdup() const {
  const int p = impl_->waiting_for.load(std::memory_order_relaxed);
  if (p < 0) return {};
  return fmt::format("rank {} has not reached it", impl_->world_ranks[size_t(p)]);
}

int ShmGroup::threads() const { return impl_->threads; }

void ShmGroup::all_gather(void* out, const void* in, size_t bytes, Done done) {
  impl_->submit([s = impl_.get(), out = static_cast<char*>(out), in = static_cast<const char*>(in), bytes,
                 done = std::move(done)] {
    for (size_t o = 0; o < bytes; o += kHalfBytes, ++s->chunks) {
      const size_t m = std::min(kHalfBytes, bytes - o);
      copy(s->half(s->rank), in + o, m, s->threads);
      s->barrier();
      for (int p = 0; p < s->size; ++p) {
        char* dst = out + size_t(p) * bytes + o;
        copy(dst, p == s->rank ? in + o : s->half(p), m, s->threads);  // own part: a no-op when in place
      }
    }
    done();
  });
}

void ShmGroup::reduce_scatter(void* out, const void* in, size_t count, DType dtype, float scale, Done done) {
  impl_->submit([s = impl_.get(), out = static_cast<char*>(out), in = static_cast<const char*>(in), count, dtype,
                 scale, done = std::move(done)] {
    const size_t es = dtype_size(dtype);
    const size_t per = kHalfBytes / (size_t(s->size) * es);  // elements of each part per chunk
    std::vector<const void*> src(size_t(s->size));
    for (size_t o = 0; o < count; o += per, ++s->chunks) {
      const size_t m = std::min(per, count - o);
      // [size][per] in my slot: the parts of this chunk meant for each other rank.
      for (int p = 0; p < s->size; ++p)
        if (p != s->rank) copy(s->half(s->rank) + size_t(p) * per * es, in + (size_t(p) * count + o) * es, m * es, s->threads);
      s->barrier();
      for (int p = 0; p < s->size; ++p)
        src[size_t(p)] = p == s->rank ? in + (size_t(s->rank) * count + o) * es : s->half(p) + size_t(s->rank) * per * es;
      sum_any(out + o * es, src.data(), s->size, m, dtype, scale, s->threads);
    }
    done();
  });
}

void ShmGroup::all_reduce(void* buf, size_t count, DType dtype, float scale, Done done) {
  impl_->submit([s = impl_.get(), buf = static_cast<char*>(buf), count, dtype, scale, done = std::move(done)] {
    const size_t es = dtype_size(dtype);
    const size_t per = kHalfBytes / es;
    std::vector<const void*> src(size_t(s->size));
    for (size_t o = 0; o < count; o += per, ++s->chunks) {
      const size_t m = std::min(per, count - o);
      auto lo = [&](int r) { return m * size_t(r) / size_t(s->size); };  // portion r is [lo(r), lo(r + 1))
      copy(s->half(s->rank), buf + o * es, m * es, s->threads);
      s->barrier();
      const size_t a = lo(s->rank), b = lo(s->rank + 1);
      for (int p = 0; p < s->size; ++p) src[size_t(p)] = s->half(p) + a * es;
      sum_any(s->half(s->rank) + a * es, src.data(), s->size, b - a, dtype, scale, s->threads);
      s->barrier();
      for (int p = 0; p < s->size; ++p)
        copy(buf + (o + lo(p)) * es, s->half(p) + lo(p) * es, (lo(p + 1) - lo(p)) * es, s->threads);
    }
    done();
  });
}

}  // namespace shardlm::comm

#endif  // SHARDLM_HAVE_MPI
