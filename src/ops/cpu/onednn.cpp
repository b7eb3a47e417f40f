// The CPU's bf16 path (ops/cpu_bf16.h) and its oneDNN matmul (ops/cpu/onednn.h).
//
// Primitives are created for plain row-major layouts given by strides (no "any" format): oneDNN's
// brgemm matmul reads them in place, so no reorder and no packed copy of our tensors is made. Its
// own scratchpad (the blocks it packs B into) is oneDNN's, like OpenBLAS's packing buffers: outside
// the MemoryTracker and the estimator (docs/memory.md).
#include "ops/cpu/onednn.h"

#include <cpuid.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <tuple>

#include <fmt/format.h>

#include "core/error.h"
#include "ops/cpu_bf16.h"

namespace shardlm::ops {

namespace {

struct Cpuid {
  bool avx512_bf16 = false, amx_bf16 = false, amx_tile = false;
};

Cpuid read_cpuid() {
  Cpuid c;
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid_max(0, nullptr) < 7) return c;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  c.amx_bf16 = (edx >> 22) & 1u;  // CPUID.(EAX=7,ECX=0):EDX[22]
  c.amx_tile = (edx >> 24) & 1u;  // CPUID.(EAX=7,ECX=0):EDX[24]
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  c.avx512_bf16 = (eax >> 5) & 1u;  // CPUID.(EAX=7,ECX=1):EAX[5]
  return c;
}

// Linux gives a process the AMX tile registers only on request; without it the first tile
// instruction raises SIGILL. Process-wide and idempotent (oneDNN makes the same request).
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
#else
  return false;
#endif
}

struct State {
  CpuBf16Status status;  // as decided at start-up
  std::string on_line, off_line;  // the status line with the path on and off, where there is hardware
  std::atomic<bool> enabled{false};
  std::atomic<bool> amx{false};
};

State& state() {
  static State* s = [] {
    auto* st = new State;
    const Cpuid id = read_cpuid();
    // oneDNN's own answer accounts for the OS (XSAVE state, AMX permission) and DNNL_MAX_CPU_ISA.
    const unsigned isa = unsigned(dnnl::get_effective_cpu_isa());
    constexpr unsigned kBf16Isa = unsigned(dnnl_cpu_isa_avx512_core_bf16), kAmxIsa = unsigned(dnnl_cpu_isa_avx512_core_amx);
    const bool onednn_bf16 = (isa & kBf16Isa) == kBf16Isa, onednn_amx = (isa & kAmxIsa) == kAmxIsa;
    const char* flags = id.amx_bf16 && id.avx512_bf16 ? "amx_bf16, avx512_bf16"
                        : id.amx_bf16                 ? "amx_bf16"
                        : id.avx512_bf16              ? "avx512_bf16"
                                                      : "";
    st->status.hardware = (id.avx512_bf16 || id.amx_bf16) && onednn_bf16;
    // 0: the f32 fallback; 1 or unset: the bf16 path where the hardware has it. A typo must not
    // silently keep the path it meant to switch off.
    const char* env = std::getenv("SHARDLM_CPU_BF16");
    if (env && *env && std::strcmp(env, "0") != 0 && std::strcmp(env, "1") != 0) {
      delete st;
      throw Error(fmt::format("environment variable SHARDLM_CPU_BF16: expected 0 (OpenBLAS in f32) or 1 (bf16 "
                              "through oneDNN where the CPU has it), got '{}'", env));
    }
    const bool off = env && std::strcmp(env, "0") == 0;
    st->status.enabled = st->status.hardware && !off;
    // Attention's block products (ops/cpu/attention.cpp) and decode's bf16 matmuls (the skinny
    // shapes of ops/cpu/matmul.cpp) use the tiles when the CPU has them and the OS grants them, else
    // AVX512-BF16's dot products and the f32 skinny kernel. oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA or
    // DNNL_MAX_CPU_ISA, e.g. AVX512_CORE_BF16) caps these kernels too: one switch gives an AMX machine
    // the paths of a CPU with AVX512-BF16 alone (AMD Zen 4), for comparing them.
    st->status.amx = st->status.hardware && onednn_amx && id.amx_bf16 && id.amx_tile && id.avx512_bf16 &&
                     request_amx_permission();
    const dnnl_version_t* v = dnnl_version();
    const std::string lib = fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
    st->on_line = fmt::format("bf16 matmuls through {} (this CPU has {}); {}", lib, flags,
                              st->status.amx ? "attention's block products and decode's matmuls on AMX tiles"
                              : id.amx_bf16 && !onednn_amx
                                  ? "attention's block products by AVX512-BF16 dot products (AMX capped by "
                                    "oneDNN's max ISA)"
                                  : "attention's block products by AVX512-BF16 dot products");
    st->off_line = fmt::format("bf16 operands widened to f32 for OpenBLAS: {} (this CPU has {})",
                               off ? "SHARDLM_CPU_BF16=0" : "switched off", flags);
    if (st->status.enabled)
      st->status.line = st->on_line;
    else if (st->status.hardware)
      st->status.line = st->off_line;
    else if (*flags)
      st->status.line = fmt::format("bf16 operands widened to f32 for OpenBLAS: {} dispatches no bf16 kernel here "
                                    "(DNNL_MAX_CPU_ISA, or the OS does not enable the state)", lib);
    else
      st->status.line = "bf16 operands widened to f32 for OpenBLAS: this CPU has neither avx512_bf16 nor amx_bf16";
    st->enabled = st->status.enabled;
    st->amx = st->status.amx;
    return st;
  }();
  return *s;
}

}  // namespace

CpuBf16Status cpu_bf16_status() {
  CpuBf16Status s = state().status;
  s.enabled = state().enabled.load();
  s.amx = state().amx.load();
  if (s.hardware) s.line = s.enabled ? state().on_line : state().off_line;
  return s;
}

bool cpu_bf16_enabled() { return state().enabled.load(std::memory_order_relaxed); }

void set_cpu_bf16_enabled(bool on) {
  SHARDLM_CHECK(!on || state().status.hardware, "set_cpu_bf16_enabled: {}", state().status.line);
  state().enabled = on;
}

bool cpu_bf16_amx() { return state().amx.load(std::memory_order_relaxed); }

void set_cpu_bf16_amx(bool on) {
  SHARDLM_CHECK(!on || state().status.amx, "set_cpu_bf16_amx: this CPU or OS gives no AMX tiles: {}",
                state().status.line);
  state().amx = on;
}

}  // namespace shardlm::ops

namespace shardlm::ops::cpu {

namespace {

using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, uint32_t, uint32_t, int>;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

const dnnl::engine& cpu_engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// A training run multiplies a few dozen distinct shapes; variable-length batches add one per length.
// The cache is emptied when it reaches this size, which bounds it without bookkeeping.
constexpr size_t kMaxCached = 512;

// A copy of the handle (a shared pointer): the cache may be emptied by another thread meanwhile.
dnnl::matmul primitive(const Key& key) {
  static std::mutex mu;
  static std::map<Key, dnnl::matmul> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMaxCached) cache.clear();
  const auto [M, N, K, ta, tb, c_bf16, alpha_bits, beta_bits, threads] = key;
  (void)threads;  // oneDNN reads omp_get_max_threads() when it makes the primitive: part of the key
  using dt = dnnl::memory::data_type;
  // Row-major A [M, K] is strides {K, 1}; its transpose stored as [K, M] is strides {1, M}.
  const dnnl::memory::desc a_md({M, K}, dt::bf16, ta ? dnnl::memory::dims{1, M} : dnnl::memory::dims{K, 1});
  const dnnl::memory::desc b_md({K, N}, dt::bf16, tb ? dnnl::memory::dims{1, K} : dnnl::memory::dims{N, 1});
  const dnnl::memory::desc c_md({M, N}, c_bf16 ? dt::bf16 : dt::f32, dnnl::memory::dims{N, 1});
  dnnl::primitive_attr attr;
  float alpha, beta;
  std::memcpy(&alpha, &alpha_bits, 4);
  std::memcpy(&beta, &beta_bits, 4);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);  // C = alpha * A B + beta * C, the sum read in C's dtype and added in f32
    attr.set_post_ops(po);
  }
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine());
    return cache.emplace(key, dnnl::matmul(pd)).first->second;
  } catch (const dnnl::error& e) {
    throw Error(fmt::format("matmul: oneDNN has no bf16 matmul for [{}x{}] x [{}x{}] (run with SHARDLM_CPU_BF16=0 "
                            "to use OpenBLAS): {}",
                            M, K, K, N, e.what()));
  }
}

}  // namespace

void onednn_matmul(void* c, DType c_dtype, const bf16_t* a, const bf16_t* b, int64_t M, int64_t N, int64_t K,
                   bool trans_a, bool trans_b, float alpha, float beta) {
  const bool c_bf16 = c_dtype == DType::BF16;
  const Key key{M, N, K, trans_a, trans_b, c_bf16, bits_of(alpha), bits_of(beta), omp_get_max_threads()};
  const dnnl::matmul p = primitive(key);
  // One stream per thread: a oneDNN stream is not to be shared between threads.
  thread_local dnnl::stream stream(cpu_engine());
  using dt = dnnl::memory::data_type;
  const dnnl::memory::desc a_md({M, K}, dt::bf16, trans_a ? dnnl::memory::dims{1, M} : dnnl::memory::dims{K, 1});
  const dnnl::memory::desc b_md({K, N}, dt::bf16, trans_b ? dnnl::memory::dims{1, K} : dnnl::memory::dims{N, 1});
  const dnnl::memory::desc c_md({M, N}, c_bf16 ? dt::bf16 : dt::f32, dnnl::memory::dims{N, 1});
  // oneDNN takes non-const handles; it only reads A and B.
  const dnnl::memory am(a_md, cpu_engine(), const_cast<bf16_t*>(a));
  const dnnl::memory bm(b_md, cpu_engine(), const_cast<bf16_t*>(b));
  const dnnl::memory cm(c_md, cpu_engine(), c);
  p.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  stream.wait();
}

}  // namespace shardlm::ops::cpu
