// matmul on the GPU through cuBLASLt.
//
// Row-major to column-major: cuBLASLt is column-major, and a row-major [r, c] matrix is the
// column-major [c, r] matrix, i.e. its transpose. So the row-major C = op(A) op(B) is computed
// as the column-major C^T = op(B)^T op(A)^T: B is passed as cuBLASLt's first operand and A as
// its second, each with the transpose flag the caller gave it, and m, n swapped.
//
// Precision (the policy of a bf16 run): CUBLAS_COMPUTE_32F everywhere (f32 accumulation).
//  - Two f32 operands: exact f32 arithmetic (no TF32), like the CPU's sgemm. A bf16 C is computed
//    into an f32 workspace and rounded once at the end (cuBLASLt's f32 path has no bf16 output).
//  - At least one bf16 operand: bf16 tensor cores with f32 accumulation, C f32 or bf16 in place
//    (an f32 gradient accumulator with beta = 1 is read and written in f32). A bf16 operand is
//    never widened; an f32 operand beside a bf16 one (the f32 gradient buffers of the backward)
//    is rounded to a bf16 Workspace copy, since cuBLASLt takes no mixed A/B types. This is where
//    the CUDA op departs from the CPU reference, which widens the bf16 operand and multiplies in
//    exact f32: the results differ by at most 2^-8 * sum_k |a_ik| |b_kj| (one bf16 rounding of the
//    f32 operand) plus the f32 summation order (backend_ops states this tolerance).
//  - Should cuBLASLt have no bf16 algorithm for the shapes and alignments (odd leading
//    dimensions), the bf16 operands are widened and the exact f32 path runs.
// cuBLASLt's heuristic is asked once per (dtypes, transposes, M, N, K, pointer alignments) and
// its answer, the descriptors included, is cached; "no algorithm" (a count of 0, or
// CUBLAS_STATUS_NOT_SUPPORTED) is cached too and means "fall back" as above.
#include <cublasLt.h>
#include <dlfcn.h>

#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "core/device.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace shardlm::ops::gpu {

namespace {

// cuBLASLt is loaded on first use (dlopen), not linked: mapping its 540 MB library adds about
// 150 MB to the resident memory of every process that links it, which CPU runs and `shardlm
// convert` (whose memory bound is tested) must not pay. The pointers take their types from
// cublasLt.h, so a mismatch with the header is a compile error.
struct LtApi {
  decltype(&::cublasLtCreate) Create = nullptr;
  decltype(&::cublasLtGetStatusString) GetStatusString = nullptr;
  decltype(&::cublasLtMatmul) Matmul = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy = nullptr;
};

const LtApi& cublaslt() {
  static const LtApi api = [] {
    const std::string so = fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR);
    void* lib = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) throw Error(fmt::format("matmul: cannot load cuBLASLt ({}): {}", so, ::dlerror()));
    LtApi a;
    auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
      if (!fn) throw Error(fmt::format("matmul: {} has no symbol {}", so, name));
    };
    load(a.Create, "cublasLtCreate");
    load(a.GetStatusString, "cublasLtGetStatusString");
    load(a.Matmul, "cublasLtMatmul");
    load(a.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    load(a.MatmulDescCreate, "cublasLtMatmulDescCreate");
    load(a.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
    load(a.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    load(a.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    load(a.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    load(a.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    load(a.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    load(a.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
    return a;
  }();
  return api;
}

void lt_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(fmt::format("matmul: cuBLASLt {} failed: {}", what, cublaslt().GetStatusString(s)));
}

// The process-wide cuBLASLt handle and its workspace (cuBLASLt may use it for split-K), created
// on first use and kept: both are reused by every call on the compute stream, which orders them.
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;

struct LtContext {
  cublasLtHandle_t handle = nullptr;
  Buffer workspace;
};

LtContext& lt() {
  static std::once_flag once;
  static LtContext* ctx = nullptr;  // never destroyed: it may be needed until the process exits
  std::call_once(once, [] {
    auto* c = new LtContext();
    lt_check(cublaslt().Create(&c->handle), "create");
    c->workspace = Buffer(kLtWorkspaceBytes, MemCategory::Workspace, /*zero=*/false, Device::CUDA);
    ctx = c;
  });
  return *ctx;
}

// The largest power of two (up to 256) dividing the address: cuBLASLt's heuristic assumes
// 256-byte aligned pointers unless told otherwise, and row slices of a tensor need not be.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

cudaDataType_t lt_type(DType t) { return t == DType::F32 ? CUDA_R_32F : CUDA_R_16BF; }

// RAII for the three kinds of cuBLASLt descriptors.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  MatmulDesc() { lt_check(cublaslt().MatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor"); }
  ~MatmulDesc() { cublaslt().MatmulDescDestroy(d); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  // A column-major rows x cols matrix with leading dimension ld.
  Layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld) {
    lt_check(cublaslt().MatrixLayoutCreate(&l, t, uint64_t(rows), uint64_t(cols), ld), "matrix layout");
  }
  ~Layout() { cublaslt().MatrixLayoutDestroy(l); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { lt_check(cublaslt().MatmulPreferenceCreate(&p), "preference"); }
  ~Preference() { cublaslt().MatmulPreferenceDestroy(p); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  void set(cublasLtMatmulPreferenceAttributes_t a, uint64_t v) {
    lt_check(cublaslt().MatmulPreferenceSetAttribute(p, a, &v, sizeof(v)), "preference attribute");
  }
  void set(cublasLtMatmulPreferenceAttributes_t a, uint32_t v) {
    lt_check(cublaslt().MatmulPreferenceSetAttribute(p, a, &v, sizeof(v)), "preference attribute");
  }
};

// Everything about one matmul that does not change between calls of the same shape: the
// descriptors and the algorithm cuBLASLt's heuristic picked (or that it has none). Keyed by the
// dtypes, transposes, sizes and pointer alignments (the heuristic is told the alignments, so a
// plan found for 256-byte aligned pointers is never used with less aligned ones).
struct PlanKey {
  DType a, b, c;
  bool trans_a, trans_b;
  int64_t M, N, K;
  uint32_t align_a, align_b, align_c;
  bool operator==(const PlanKey& o) const {  // (CUDA sources are C++17: no defaulted ==)
    return a == o.a && b == o.b && c == o.c && trans_a == o.trans_a && trans_b == o.trans_b && M == o.M &&
           N == o.N && K == o.K && align_a == o.align_a && align_b == o.align_b && align_c == o.align_c;
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(uint64_t(k.a) | uint64_t(k.b) << 8 | uint64_t(k.c) << 16 | uint64_t(k.trans_a) << 24 |
        uint64_t(k.trans_b) << 25);
    mix(uint64_t(k.M));
    mix(uint64_t(k.N));
    mix(uint64_t(k.K));
    mix(uint64_t(k.align_a) | uint64_t(k.align_b) << 16 | uint64_t(k.align_c) << 32);
    return size_t(h);
  }
};

struct Plan {
  MatmulDesc desc;
  Layout l1, l2, lc;  // cuBLASLt's operand 1 (our B), operand 2 (our A), and C = D
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // false: cuBLASLt has no algorithm for this key (the caller falls back)

  // Stored (untransposed) column-major shapes: a row-major [rows, cols] matrix is column-major
  // [cols, rows] with ld = cols. A is [M, K] ([K, M] if trans_a), B is [K, N] ([N, K] if trans_b).
  explicit Plan(const PlanKey& k)
      : l1(lt_type(k.b), k.trans_b ? k.K : k.N, k.trans_b ? k.N : k.K, k.trans_b ? k.K : k.N),
        l2(lt_type(k.a), k.trans_a ? k.M : k.K, k.trans_a ? k.K : k.M, k.trans_a ? k.M : k.K),
        lc(lt_type(k.c), k.N, k.M, k.N) {
    // cuBLASLt's operand 1 is our B, operand 2 our A (see the top of the file).
    const cublasOperation_t op1 = k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op2 = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    lt_check(cublaslt().MatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &op1, sizeof(op1)), "transa");
    lt_check(cublaslt().MatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &op2, sizeof(op2)), "transb");

    Preference pref;
    pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kLtWorkspaceBytes));
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_b);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_a);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.align_c);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.align_c);

    cublasLtMatmulHeuristicResult_t heuristic{};
    int count = 0;
    const cublasStatus_t s = cublaslt().MatmulAlgoGetHeuristic(lt().handle, desc.d, l1.l, l2.l, lc.l, lc.l, pref.p, 1,
                                                               &heuristic, &count);
    // No algorithm is reported either as success with a count of 0 or as NOT_SUPPORTED (what
    // cuBLASLt returns when no heuristic applies to the configuration): both mean "fall back".
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) return;
    lt_check(s, "heuristic");
    if (count == 0 || heuristic.state != CUBLAS_STATUS_SUCCESS) return;
    algo = heuristic.algo;
    found = true;
  }
};

// The plans seen so far. A training run uses a few dozen shapes; should something cycle through
// many more (inference over varying lengths), the cache is emptied at kMaxPlans and refilled.
// Plans are shared_ptr so that emptying it never frees a plan a caller still holds.
constexpr size_t kMaxPlans = 4096;

std::shared_ptr<const Plan> plan_for(const PlanKey& key) {
  static std::mutex mu;
  static auto* plans = new std::unordered_map<PlanKey, std::shared_ptr<const Plan>, PlanKeyHash>();  // never destroyed
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = plans->find(key); it != plans->end()) return it->second;
  }
  auto plan = std::make_shared<const Plan>(key);  // the heuristic query, outside the lock
  std::lock_guard<std::mutex> lock(mu);
  if (plans->size() >= kMaxPlans) plans->clear();
  return plans->emplace(key, std::move(plan)).first->second;
}

// C = alpha op(A) op(B) + beta C with A, B both f32 or both bf16 (same dtype), C f32, or bf16
// when A and B are bf16. Shapes as validated by the front end; M, N and K > 0. Returns false,
// having done nothing, when cuBLASLt offers no algorithm for these types, shapes and alignments.
bool lt_matmul(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b, float alpha,
               float beta, int64_t M, int64_t N, int64_t K) {
  const PlanKey key{A.dtype,  B.dtype, C.dtype, trans_a, trans_b, M, N, K, alignment_of(A.data), alignment_of(B.data),
                    alignment_of(C.data)};
  const std::shared_ptr<const Plan> plan = plan_for(key);
  if (!plan->found) return false;
  LtContext& ctx = lt();
  lt_check(cublaslt().Matmul(ctx.handle, plan->desc.d, &alpha, B.data, plan->l1.l, A.data, plan->l2.l, &beta, C.data,
                             plan->lc.l, C.data, plan->lc.l, &plan->algo, ctx.workspace.data(), kLtWorkspaceBytes,
                             cuda::compute_stream()),
           "matmul");
  return true;
}

[[noreturn]] void no_algorithm(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b) {
  throw Error(fmt::format("matmul: cuBLASLt has no algorithm for C {} = op(A {}) op(B {}) (trans_a {}, trans_b {})",
                          C.describe(), A.describe(), B.describe(), trans_a, trans_b));
}

// A copy of `t` converted to `to`, in a Workspace buffer held by `holder`.
Tensor converted(const Tensor& t, DType to, Buffer& holder) {
  holder = Buffer(size_t(t.numel()) * dtype_size(to), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
  Tensor f = Tensor::view(holder.data(), to, t.shape.data(), t.ndim, Device::CUDA);
  cast(f, t);
  return f;
}

// The exact f32 path: f32 A and B, C f32 or (through an f32 workspace, rounded once) bf16.
void f32_matmul(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b, float alpha,
                float beta, int64_t M, int64_t N, int64_t K, const Tensor& origA, const Tensor& origB) {
  if (C.dtype == DType::F32) {
    if (!lt_matmul(C, A, B, trans_a, trans_b, alpha, beta, M, N, K)) no_algorithm(C, origA, origB, trans_a, trans_b);
    return;
  }
  Buffer c_hold(size_t(M * N) * sizeof(float), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
  const Tensor c = Tensor::view(c_hold.data(), DType::F32, {M, N}, Device::CUDA);
  if (beta != 0.0f) cast(c, C);
  if (!lt_matmul(c, A, B, trans_a, trans_b, alpha, beta, M, N, K)) no_algorithm(C, origA, origB, trans_a, trans_b);
  cast(C, c);
}

}  // namespace

void matmul(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b, float alpha, float beta) {
  const int64_t M = C.shape[0], N = C.shape[1];
  const int64_t K = trans_a ? A.shape[0] : A.shape[1];
  if (M == 0 || N == 0) return;
  if (K == 0) {
    // An empty sum: C = beta C. (cuBLASLt does not take k = 0.)
    if (beta == 0.0f)
      zero(C);
    else
      scale_inplace(C, beta);
    return;
  }
  const bool a16 = A.dtype == DType::BF16, b16 = B.dtype == DType::BF16;
  if (!a16 && !b16) {  // two f32 operands: exact f32 (no TF32), like the CPU's sgemm
    f32_matmul(C, A, B, trans_a, trans_b, alpha, beta, M, N, K, A, B);
    return;
  }
  // A bf16 operand: the bf16 policy. Tensor cores with f32 accumulation; an f32 operand (in
  // training, a gradient of the f32 backward buffers) is rounded to a bf16 copy, the bf16 one is
  // never widened. C is written in its own dtype (an f32 gradient accumulator with beta = 1 is
  // read and written as f32).
  {
    Buffer a_hold, b_hold;
    const Tensor a = a16 ? A : converted(A, DType::BF16, a_hold);
    const Tensor b = b16 ? B : converted(B, DType::BF16, b_hold);
    if (lt_matmul(C, a, b, trans_a, trans_b, alpha, beta, M, N, K)) return;
  }
  // cuBLASLt has no bf16 kernel for these shapes and alignments (odd leading dimensions): widen
  // the bf16 operands and take the exact f32 path, which has one for all.
  Buffer a_hold, b_hold;
  const Tensor a = a16 ? converted(A, DType::F32, a_hold) : A;
  const Tensor b = b16 ? converted(B, DType::F32, b_hold) : B;
  f32_matmul(C, a, b, trans_a, trans_b, alpha, beta, M, N, K, A, B);
}

}  // namespace shardlm::ops::gpu
