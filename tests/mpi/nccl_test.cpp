// The NCCL communicator. Built in every configuration; ctest runs it four times:
//   * nccl_np1, nccl_np2 (the CPU part, everywhere): the factory's one-line Error when it cannot
//     run (no NCCL in the build, or no CUDA device) or, where every rank has a GPU, the working
//     communicator's identity; and the refusal of tensors on the wrong device by the shared check;
//   * nccl_gpu_np1, nccl_gpu_np2 (the GPU part, `--gpu`): the collectives against host-computed
//     results (f32 and bf16, Sum and Avg, in place and not), the ordering against the compute
//     stream without host synchronization, split, broadcast/barrier/all_reduce_sum, the byte
//     accounting and the refusal of CPU tensors and host pointers. Where a rank has no CUDA device
//     (or two ranks would share one, or the build has no NCCL) every rank prints why and exits with
//     kSkipped (77), which ctest reports as skipped (SKIP_RETURN_CODE), never as passed. A GPU that
//     is present but whose communicator cannot be made is a failure, not a skip.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl_communicator.h"
#include "mpi_test_main.h"

#ifdef SHARDLM_HAVE_NCCL
#include <cuda_runtime.h>

#include "ops/cuda/runtime.h"
#endif

using namespace shardlm;
using namespace shardlm::comm;

static Communicator* g_world = nullptr;
static std::unique_ptr<Communicator> g_nccl;  // made by setup() when every rank has a GPU
static std::string g_factory_error;           // what the factory threw, when it did
static std::string g_gpu_not_run;             // why the GPU part did not run ("" when it ran)
static std::string g_skip_reason;             // why the GPU part cannot run here (no device, no NCCL)
static bool g_gpu_mode = false;               // --gpu: run the GPU part only
constexpr int kSkipped = 77;                  // ctest's SKIP_RETURN_CODE for the GPU part

namespace {

bool one_line(const std::string& s) { return s.find('\n') == std::string::npos && s.find('\r') == std::string::npos; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---- what runs everywhere --------------------------------------------------------------------

TEST(NcclFactory, SaysWhyItCannotRun) {
  if (g_nccl) {  // the GPU part's own tests cover the working communicator
    EXPECT_EQ(g_nccl->name(), "nccl");
    EXPECT_EQ(g_nccl->device(), Device::CUDA);
    EXPECT_EQ(g_nccl->size(), g_world->size());
    EXPECT_EQ(g_nccl->rank(), g_world->rank());
    return;
  }
  if (!g_factory_error.empty()) {
    EXPECT_TRUE(one_line(g_factory_error)) << g_factory_error;
    EXPECT_NE(g_factory_error.find("NCCL communicator: "), std::string::npos) << g_factory_error;
  }
  if (!nccl_built()) {
    EXPECT_NE(g_factory_error.find("built without NCCL"), std::string::npos) << g_factory_error;
  } else {
#ifdef SHARDLM_HAVE_NCCL
    if (!cuda::available()) {
      // The cause and CUDA's own reason, e.g. "no CUDA device (cudaGetDeviceCount: cudaErrorNoDevice: ...)".
      EXPECT_NE(g_factory_error.find("no CUDA device (cudaGetDeviceCount"), std::string::npos) << g_factory_error;
    } else if (!g_factory_error.empty()) {
      // A GPU is here (and no two ranks share one, else setup did not call the factory).
      ADD_FAILURE() << "the NCCL communicator could not be made on a machine with a GPU: " << g_factory_error;
    }
#endif
  }
  if (g_world->size() > 1 && !g_factory_error.empty()) {
    EXPECT_NE(g_factory_error.find("rank "), std::string::npos) << g_factory_error;
  }
  EXPECT_EQ(nccl_stream_of(*g_world), nullptr);
}

TEST(NcclChecks, TensorsOnTheWrongDeviceAreRefused) {
  // The check every communicator shares (Communicator::check_tensor against device()): a CPU
  // communicator refuses a CUDA tensor before touching its memory, and says which device is wrong.
  auto local = make_local_communicator();
  EXPECT_EQ(local->device(), Device::CPU);
  float host[4] = {1, 2, 3, 4};
  const Tensor cuda_labelled = Tensor::view(host, DType::F32, {4}, Device::CUDA);
  const std::string e = error_of([&] { local->all_reduce(cuda_labelled, ReduceOp::Sum); });
  EXPECT_NE(e.find("all_reduce: expected a contiguous cpu tensor, got f32[4] on cuda"), std::string::npos) << e;
  const Tensor cpu = Tensor::view(host, DType::F32, {4});
  const std::string g = error_of([&] { local->all_gather(cpu, cuda_labelled); });
  EXPECT_NE(g.find("all_gather: expected a contiguous cpu tensor"), std::string::npos) << g;
  EXPECT_EQ(error_of([&] { local->all_reduce(cpu, ReduceOp::Sum); }), "");
}

// ---- the GPU part ----------------------------------------------------------------------------
#ifdef SHARDLM_HAVE_NCCL
namespace {

// Device memory for one test (freed by cudaFree, which waits for the device).
struct DeviceMemory {
  void* p = nullptr;
  explicit DeviceMemory(size_t bytes) { SHARDLM_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceMemory() { cudaFree(p); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  Tensor view(DType dt, int64_t n, int64_t offset = 0) const {
    return Tensor::view(static_cast<char*>(p) + size_t(offset) * dtype_size(dt), dt, {n}, Device::CUDA);
  }
};

cudaStream_t compute() { return cuda::compute_stream(); }

// Host values to device memory, on the compute stream (so every later collective is ordered after
// the copy), and back; download synchronizes the compute stream, as a host reader must.
void upload(const Tensor& t, const std::vector<float>& v) {
  std::vector<uint16_t> h16;
  const void* src = v.data();
  if (t.dtype == DType::BF16) {
    h16.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) h16[i] = f32_to_bf16(v[i]).bits;
    src = h16.data();
  }
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(t.data, src, t.nbytes(), cudaMemcpyHostToDevice, compute()));
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(compute()));  // the host vectors die on return
}

std::vector<float> download(const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  std::vector<uint16_t> h16(t.dtype == DType::BF16 ? out.size() : 0);
  void* dst = t.dtype == DType::BF16 ? static_cast<void*>(h16.data()) : static_cast<void*>(out.data());
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst, t.data, t.nbytes(), cudaMemcpyDeviceToHost, compute()));
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(compute()));
  if (t.dtype == DType::BF16)
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(bf16_t{h16[i]});
  return out;
}

float round_to(DType dt, float x) { return dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(x)) : x; }

// Equal for f32 sums of small integers; within bf16's rounding (or f32's for averages) otherwise.
void expect_close(DType dt, float got, float want, const std::string& where) {
  const float tol = dt == DType::BF16 ? std::abs(want) / 64.0f + 1e-6f : std::abs(want) * 1e-6f + 1e-6f;
  EXPECT_NEAR(got, want, tol) << where;
}

// A sleep the given stream must run through before its next work: delays that stream only.
void delay_stream(cudaStream_t s, int ms) {
  static int delay_ms = 0;
  delay_ms = ms;
  SHARDLM_CUDA_CHECK(cudaLaunchHostFunc(
      s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms)); }, nullptr));
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

const DType kDtypes[] = {DType::F32, DType::BF16};

void AllGather() {
  Communicator& c = *g_nccl;
  const int R = c.rank(), W = c.size(), n = 1000;
  for (DType dt : kDtypes) {
    // Values exact in bf16 (integers below 256).
    auto value = [](int r, int i) { return float(r * 16 + i % 16); };
    DeviceMemory in_mem(n * 4), out_mem(size_t(n) * W * 4);
    const Tensor in = in_mem.view(dt, n), out = out_mem.view(dt, int64_t(n) * W);
    std::vector<float> h(n), fill(size_t(n) * W, -1.0f);
    for (int i = 0; i < n; ++i) h[size_t(i)] = value(R, i);
    upload(in, h);
    upload(out, fill);
    c.all_gather(out, in);
    const std::vector<float> got = download(out);
    for (int r = 0; r < W; ++r)
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(got[size_t(r * n + i)], value(r, i)) << dtype_name(dt) << " rank " << R << " slice " << r << " i " << i;
    // In place: `in` is this rank's slice of `out`.
    upload(out, fill);
    upload(out.slice(int64_t(R) * n, int64_t(R + 1) * n), h);
    c.all_gather(out, out.slice(int64_t(R) * n, int64_t(R + 1) * n));
    EXPECT_EQ(download(out), got) << dtype_name(dt) << " in place";
  }
}

void ReduceScatter() {
  Communicator& c = *g_nccl;
  const int R = c.rank(), W = c.size(), n = 300;
  const float ranks_sum = float(W * (W + 1) / 2);  // sum of (r + 1)
  for (DType dt : kDtypes)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      DeviceMemory in_mem(size_t(n) * W * 4), out_mem(n * 4);
      const Tensor in = in_mem.view(dt, int64_t(n) * W), out = out_mem.view(dt, n);
      std::vector<float> h(size_t(n) * W);
      for (int j = 0; j < n * W; ++j) h[size_t(j)] = float((R + 1) * (j % 8));
      upload(in, h);
      c.reduce_scatter(out, in, op);
      const std::vector<float> got = download(out);
      for (int i = 0; i < n; ++i) {
        const int j = R * n + i;
        float want = ranks_sum * float(j % 8);
        if (op == ReduceOp::Avg) want /= float(W);
        expect_close(dt, got[size_t(i)], round_to(dt, want),
                     fmt::format("{} {} i {}", dtype_name(dt), op == ReduceOp::Sum ? "sum" : "avg", i));
      }
    }
}

void AllReduce() {
  Communicator& c = *g_nccl;
  const int R = c.rank(), W = c.size(), n = 777;
  for (DType dt : kDtypes)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      DeviceMemory mem(n * 4);
      const Tensor buf = mem.view(dt, n);
      std::vector<float> h(n);
      for (int i = 0; i < n; ++i) h[size_t(i)] = float((i % 5) - 2) * float(R + 1) + 0.5f;
      upload(buf, h);
      c.all_reduce(buf, op);
      const std::vector<float> got = download(buf);
      for (int i = 0; i < n; ++i) {
        float want = float((i % 5) - 2) * float(W * (W + 1) / 2) + 0.5f * float(W);
        if (op == ReduceOp::Avg) want /= float(W);
        expect_close(dt, got[size_t(i)], round_to(dt, want),
                     fmt::format("{} {} i {}", dtype_name(dt), op == ReduceOp::Sum ? "sum" : "avg", i));
      }
    }
  EXPECT_NEAR(c.all_reduce_sum(0.1 * (R + 1)), 0.1 * W * (W + 1) / 2, 1e-12);
}

void BroadcastAndBarrier() {
  Communicator& c = *g_nccl;
  const int R = c.rank(), W = c.size();
  DeviceMemory mem(64 * 4);
  const Tensor buf = mem.view(DType::F32, 64);
  std::vector<float> h(64);
  for (int i = 0; i < 64; ++i) h[size_t(i)] = float(R * 1000 + i);
  upload(buf, h);
  c.broadcast(buf, W - 1);
  const std::vector<float> got = download(buf);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(got[size_t(i)], float((W - 1) * 1000 + i));
  EXPECT_THROW(c.broadcast(buf, W), Error);
  c.barrier();
  // The barrier waits for the compute stream's earlier work too.
  delay_stream(compute(), 100);
  const auto t0 = std::chrono::steady_clock::now();
  c.barrier();
  EXPECT_GE(ms_since(t0), 90.0);
  EXPECT_EQ(cudaStreamQuery(compute()), cudaSuccess);
}

// The collective sees writes enqueued on the compute stream before the call, with no host sync:
// the compute stream is held back 500 ms, so an unordered collective would run on stale data.
void ProducerWritesBeforeIssueAreSeen() {
  Communicator& c = *g_nccl;
  const int R = c.rank(), W = c.size(), n = 4096;
  DeviceMemory in_mem(n * 4), out_mem(size_t(n) * W * 4);
  const Tensor in = in_mem.view(DType::F32, n), out = out_mem.view(DType::F32, int64_t(n) * W);
  upload(in, std::vector<float>(n, 0.0f));
  upload(out, std::vector<float>(size_t(n) * W, 0.0f));
  const auto t0 = std::chrono::steady_clock::now();
  delay_stream(compute(), 500);
  // Every byte 0x3F + R: a float pattern that differs per rank.
  SHARDLM_CUDA_CHECK(cudaMemsetAsync(in.data, 0x3F + R, in.nbytes(), compute()));
  auto req = c.all_gather_async(out, in);
  req->wait();
  EXPECT_LT(ms_since(t0), 250.0) << "issue and wait() blocked the host";
  const std::vector<float> got = download(out);
  for (int r = 0; r < W; ++r) {
    const uint8_t b = uint8_t(0x3F + r);
    uint32_t bits = uint32_t(b) * 0x01010101u;
    float want;
    std::memcpy(&want, &bits, 4);
    for (int i = 0; i < n; i += 97) ASSERT_EQ(got[size_t(r * n + i)], want) << "slice " << r << " i " << i;
  }
}

// After wait(), work on the compute stream sees the result, with no host sync: the comm stream is
// held back 500 ms, so a read not ordered after the collective would copy the stale fill.
void ConsumerAfterWaitSeesResult() {
  Communicator& c = *g_nccl;
  const int R = c.rank(), W = c.size(), n = 4096;
  DeviceMemory in_mem(n * 4), out_mem(size_t(n) * W * 4), other(n * 4);
  const Tensor in = in_mem.view(DType::F32, n), out = out_mem.view(DType::F32, int64_t(n) * W);
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[size_t(i)] = float(R * n + i);
  upload(in, h);
  upload(out, std::vector<float>(size_t(n) * W, -1.0f));
  auto* comm_stream = static_cast<cudaStream_t>(nccl_stream_of(c));
  ASSERT_NE(comm_stream, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  delay_stream(comm_stream, 500);
  auto req = c.all_gather_async(out, in);  // a prefetch ...
  SHARDLM_CUDA_CHECK(cudaMemsetAsync(other.p, 0, n * 4, compute()));  // ... overlapping other compute
  req->wait();
  EXPECT_LT(ms_since(t0), 250.0) << "issue and wait() blocked the host";
  const std::vector<float> got = download(out);  // enqueued on the compute stream after wait()
  for (int j = 0; j < n * W; j += 101) ASSERT_EQ(got[size_t(j)], float(j)) << "j " << j;
}

// More Requests in flight than the event pool has made so far, waited in reverse order.
void ManyRequestsInFlight() {
  Communicator& c = *g_nccl;
  const int R = c.rank(), W = c.size(), n = 256, k = 8;
  DeviceMemory in_mem(size_t(n) * k * 4), out_mem(size_t(n) * W * k * 4);
  std::vector<float> h(size_t(n) * k);
  for (size_t i = 0; i < h.size(); ++i) h[i] = float(R) + 0.25f * float(i % 4);
  upload(in_mem.view(DType::F32, int64_t(n) * k), h);
  std::vector<std::unique_ptr<Request>> reqs;
  for (int q = 0; q < k; ++q)
    reqs.push_back(c.all_gather_async(out_mem.view(DType::F32, int64_t(n) * W, int64_t(q) * n * W),
                                      in_mem.view(DType::F32, n, int64_t(q) * n)));
  for (int q = k - 1; q >= 0; --q) reqs[size_t(q)]->wait();
  reqs.clear();
  const std::vector<float> got = download(out_mem.view(DType::F32, int64_t(n) * W * k));
  for (int q = 0; q < k; ++q)
    for (int r = 0; r < W; ++r)
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(got[size_t((q * W + r) * n + i)], float(r) + 0.25f * float((q * n + i) % 4)) << q << " " << r << " " << i;
  // A Request destroyed unwaited still orders the compute stream (the interface: destroying waits).
  DeviceMemory buf(4);
  upload(buf.view(DType::F32, 1), {1.0f});
  c.all_reduce_async(buf.view(DType::F32, 1), ReduceOp::Sum).reset();
  EXPECT_EQ(download(buf.view(DType::F32, 1))[0], float(W));
}

void Split() {
  Communicator& c = *g_nccl;
  const int R = c.rank(), W = c.size();
  // Everyone, ordered by descending key: the ranks come out reversed.
  auto reversed = c.split(0, -R);
  EXPECT_EQ(reversed->size(), W);
  EXPECT_EQ(reversed->rank(), W - 1 - R);
  EXPECT_EQ(reversed->device(), Device::CUDA);
  EXPECT_NE(nccl_stream_of(*reversed), nccl_stream_of(c));  // a stream of its own
  // Pairs (a 2-wide shard group when W is even, else singletons), as the engine's mesh splits.
  const int width = W % 2 == 0 ? 2 : 1;
  auto shard = c.split(R / width, R);
  EXPECT_EQ(shard->size(), width);
  EXPECT_EQ(shard->rank(), R % width);
  DeviceMemory mem(4);
  const Tensor v = mem.view(DType::F32, 1);
  upload(v, {float(R)});
  shard->all_reduce(v, ReduceOp::Sum);
  const int base = R / width * width;
  EXPECT_EQ(download(v)[0], float(width == 2 ? 2 * base + 1 : base));
  // All-gather over the reversed communicator: slices in the reversed rank order.
  DeviceMemory g(size_t(W) * 4);
  reversed->all_gather(g.view(DType::F32, W), v);
  const std::vector<float> got = download(g.view(DType::F32, W));
  for (int s = 0; s < W; ++s) {
    const int r = W - 1 - s, b = r / width * width;
    EXPECT_EQ(got[size_t(s)], float(width == 2 ? 2 * b + 1 : b)) << "slice " << s;
  }
  const std::string e = error_of([&] { c.split(-1, 0); });
  EXPECT_NE(e.find("split: color -1 must be >= 0"), std::string::npos) << e;
}

void BytesFollowRingAccounting() {
  Communicator& c = *g_nccl;
  const int W = c.size(), n = 1000;
  DeviceMemory in_mem(n * 4), out_mem(size_t(n) * W * 4);
  const Tensor in = in_mem.view(DType::F32, n), out = out_mem.view(DType::F32, int64_t(n) * W);
  upload(in, std::vector<float>(n, 1.0f));
  c.reset_stats();
  c.all_gather(out, in);
  c.reduce_scatter(in, out, ReduceOp::Sum);
  c.all_reduce(out, ReduceOp::Sum);
  c.broadcast(in, 0);
  const int64_t full = int64_t(n) * W * 4;
  EXPECT_EQ(c.stats().all_gather_bytes, full * (W - 1) / W);
  EXPECT_EQ(c.stats().reduce_scatter_bytes, full * (W - 1) / W);
  EXPECT_EQ(c.stats().all_reduce_bytes, 2 * full * (W - 1) / W);
  EXPECT_EQ(c.stats().broadcast_bytes, c.rank() == 0 ? int64_t(n) * 4 : 0);
  EXPECT_EQ(c.stats().calls, 4);
  // bf16 counts its own bytes.
  c.reset_stats();
  c.all_reduce(out_mem.view(DType::BF16, int64_t(n) * W), ReduceOp::Sum);
  EXPECT_EQ(c.stats().all_reduce_bytes, 2 * (full / 2) * (W - 1) / W);
}

void WrongTensorsAreRefused() {
  Communicator& c = *g_nccl;
  const int W = c.size();
  std::vector<float> host(size_t(4) * W);
  DeviceMemory mem(size_t(4) * W * 4);
  const Tensor cpu = Tensor::view(host.data(), DType::F32, {4});
  const Tensor dev = mem.view(DType::F32, 4), dev_full = mem.view(DType::F32, 4 * int64_t(W));
  std::string e = error_of([&] { c.all_reduce(cpu, ReduceOp::Sum); });
  EXPECT_NE(e.find(fmt::format("rank {}: all_reduce: expected a contiguous cuda tensor, got f32[4] on cpu", g_world->rank())),
            std::string::npos)
      << e;
  // A host pointer labelled CUDA: the pointer's memory type tells.
  e = error_of([&] { c.all_reduce(Tensor::view(host.data(), DType::F32, {4}, Device::CUDA), ReduceOp::Sum); });
  EXPECT_NE(e.find("nccl all_reduce: f32[4] on cuda is host memory, expected memory of CUDA device"), std::string::npos)
      << e;
  e = error_of([&] { c.all_gather(dev_full, Tensor::view(host.data(), DType::F32, {4}, Device::CUDA)); });
  EXPECT_NE(e.find("nccl all_gather:"), std::string::npos) << e;
  e = error_of([&] { c.all_gather(dev_full, mem.view(DType::BF16, 4)); });
  EXPECT_NE(e.find("all_gather: dtypes differ"), std::string::npos) << e;
  e = error_of([&] { c.reduce_scatter(dev, dev, ReduceOp::Sum); });
  if (W > 1) {
    EXPECT_NE(e.find("reduce_scatter: the full buffer has"), std::string::npos) << e;
  }
  e = error_of([&] { c.all_reduce(Tensor::view(mem.p, DType::I32, {4}, Device::CUDA), ReduceOp::Sum); });
  EXPECT_NE(e.find("expected f32 or bf16"), std::string::npos) << e;
  e = error_of([&] { c.broadcast(cpu, 0); });
  EXPECT_NE(e.find("broadcast: expected a contiguous cuda tensor"), std::string::npos) << e;
  // Still usable after refusals (nothing was enqueued).
  upload(dev, {1, 1, 1, 1});
  c.all_reduce(dev, ReduceOp::Sum);
  EXPECT_EQ(download(dev)[3], float(W));
}

class FnTest : public ::testing::Test {
 public:
  explicit FnTest(void (*f)()) : f_(f) {}
  void TestBody() override { f_(); }

 private:
  void (*f_)();
};

struct GpuTest {
  const char* name;
  void (*fn)();
};
const GpuTest kGpuTests[] = {
    {"AllGather", AllGather},
    {"ReduceScatter", ReduceScatter},
    {"AllReduce", AllReduce},
    {"BroadcastAndBarrier", BroadcastAndBarrier},
    {"ProducerWritesBeforeIssueAreSeen", ProducerWritesBeforeIssueAreSeen},
    {"ConsumerAfterWaitSeesResult", ConsumerAfterWaitSeesResult},
    {"ManyRequestsInFlight", ManyRequestsInFlight},
    {"Split", Split},
    {"BytesFollowRingAccounting", BytesFollowRingAccounting},
    {"WrongTensorsAreRefused", WrongTensorsAreRefused},
};
constexpr int kNumGpuTests = int(sizeof(kGpuTests) / sizeof(kGpuTests[0]));

}  // namespace
#else
constexpr int kNumGpuTests = 0;  // the GPU tests are compiled only with NCCL
#endif

// Before the tests: make the NCCL communicator when every rank has a GPU of its own, and register
// the GPU tests only then. Collective over the world: every rank takes the same branch.
static void setup(Communicator& world) {
  int local_devices = 0;
#ifdef SHARDLM_HAVE_NCCL
  if (cudaGetDeviceCount(&local_devices) != cudaSuccess) {
    cudaGetLastError();
    local_devices = 0;
  }
#endif
  const int local_rank = local_rank_from_environment();
  // NCCL refuses two ranks on one GPU; count the ranks that would share one.
  const bool crowded = local_devices > 0 && local_rank >= local_devices;
  const double crowded_ranks = world.all_reduce_sum(crowded ? 1.0 : 0.0);
  const double ranks_without_gpu = world.all_reduce_sum(local_devices == 0 ? 1.0 : 0.0);
  if (!nccl_built())
    g_skip_reason = "this build has no NCCL";
  else if (ranks_without_gpu > 0)
    g_skip_reason = fmt::format("{} of {} rank(s) have no CUDA device", ranks_without_gpu, world.size());
  if (crowded_ranks > 0) {
    g_gpu_not_run = fmt::format("{} rank(s) would share a GPU ({} CUDA device(s) on this node, {} ranks)", crowded_ranks,
                                local_devices, world.size());
    g_skip_reason = g_gpu_not_run;
    return;
  }
  try {
    g_nccl = make_nccl_communicator(world, local_rank);
  } catch (const Error& e) {
    g_factory_error = e.what();
    g_gpu_not_run = g_factory_error;
  }
  if (g_gpu_mode) ::testing::GTEST_FLAG(filter) = "NcclGpu.*";
#ifdef SHARDLM_HAVE_NCCL
  if (g_nccl && g_gpu_mode)
    for (const GpuTest& t : kGpuTests) {
      void (*fn)() = t.fn;
      ::testing::RegisterTest("NcclGpu", t.name, nullptr, nullptr, __FILE__, __LINE__,
                              [fn]() -> ::testing::Test* { return new FnTest(fn); });
    }
#endif
  if (world.rank() == 0 && g_gpu_mode) {
    if (g_nccl)
      std::printf("nccl_test: GPU part runs: %d tests on %d rank(s)\n", kNumGpuTests, world.size());
    else
      std::printf("nccl_test: GPU part did not run (%s): %s\n",
                  nccl_built() ? fmt::format("{} GPU tests not registered", kNumGpuTests).c_str()
                               : "GPU tests are built only with NCCL",
                  g_gpu_not_run.c_str());
    std::fflush(stdout);
  }
}

int main(int argc, char** argv) {
  // --gpu selects the GPU part (the nccl_gpu_np* tests); without it, the CPU part runs.
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--gpu")
      g_gpu_mode = true;
    else
      args.push_back(argv[i]);
  }
  int n = int(args.size());
  args.push_back(nullptr);
  bool gpu_ran = false;
  int rank = 0;
  shardlm::testing::MpiTestHooks hooks;
  hooks.before = setup;
  hooks.after = [&gpu_ran, &rank](Communicator& world) {
    gpu_ran = world.all_reduce_sum(g_nccl ? 1.0 : 0.0) == double(world.size());
    rank = world.rank();
    g_nccl.reset();  // before the bootstrap it was made over
  };
  const int rc = shardlm::testing::run_mpi_tests(n, args.data(), g_world, hooks);
  if (rc != 0 || !g_gpu_mode || gpu_ran) return rc;
  // The GPU part did not run: a skip where this machine cannot run it, a failure where it should.
  if (!g_skip_reason.empty()) {
    if (rank == 0) std::printf("nccl_test: SKIPPED: GPU part cannot run here: %s\n", g_skip_reason.c_str());
    return kSkipped;
  }
  if (rank == 0) std::printf("nccl_test: FAILED: a GPU is present but the NCCL communicator could not be made: %s\n",
              g_gpu_not_run.c_str());
  return 1;
}
