// matmul on the GPU through cuBLASLt.
//
// Row-major to column-major: cuBLASLt is column-major, and a row-major [r, c] matrix is the
// column-major [c, r] matrix, i.e. its transpose. So the row-major C = op(A) op(B) is computed
// as the column-major C^T = op(B)^T op(A)^T: B is passed as cuBLASLt's first operand and A as
// its second, each with the transpose flag the caller gave it, and m, n swapped.
//
// Precision: CUBLAS_COMPUTE_32F everywhere (f32 accumulation). With f32 operands this is exact
// f32 arithmetic (no TF32), like the CPU's sgemm; with two bf16 operands the products are exact
// in f32 and tensor cores accumulate in f32 (if cuBLASLt has no bf16 kernel for the shapes and
// alignments, both are widened and the f32 path runs). Mixed operands (one f32, one bf16) have
// the bf16 one widened to f32 in a Workspace buffer (exact), as the CPU does; a bf16 C with f32
// operands is computed into an f32 workspace and rounded once at the end, since cuBLASLt's f32
// path has no bf16 output.
#include <cublasLt.h>
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <type_traits>

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
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  // A column-major rows x cols matrix with leading dimension ld.
  Layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld) {
    lt_check(cublaslt().MatrixLayoutCreate(&l, t, uint64_t(rows), uint64_t(cols), ld), "matrix layout");
  }
  ~Layout() { cublaslt().MatrixLayoutDestroy(l); }
};
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { lt_check(cublaslt().MatmulPreferenceCreate(&p), "preference"); }
  ~Preference() { cublaslt().MatmulPreferenceDestroy(p); }
  void set(cublasLtMatmulPreferenceAttributes_t a, uint64_t v) {
    lt_check(cublaslt().MatmulPreferenceSetAttribute(p, a, &v, sizeof(v)), "preference attribute");
  }
  void set(cublasLtMatmulPreferenceAttributes_t a, uint32_t v) {
    lt_check(cublaslt().MatmulPreferenceSetAttribute(p, a, &v, sizeof(v)), "preference attribute");
  }
};

// C = alpha op(A) op(B) + beta C with A, B both f32 or both bf16 (same dtype), C f32, or bf16
// when A and B are bf16. Shapes as validated by the front end; M, N and K > 0 (K is implied by
// the layouts and the transposes). Returns false, having done nothing, when cuBLASLt offers no
// algorithm for these types, shapes and alignments.
bool lt_matmul(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b, float alpha,
               float beta, int64_t M, int64_t N) {
  LtContext& ctx = lt();
  MatmulDesc desc;
  // cuBLASLt's operand 1 is our B, operand 2 our A (see the top of the file).
  const cublasOperation_t op1 = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op2 = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt_check(cublaslt().MatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &op1, sizeof(op1)), "transa");
  lt_check(cublaslt().MatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &op2, sizeof(op2)), "transb");

  // Stored (untransposed) column-major shapes: B row-major [rows_b, cols_b] is column-major
  // [cols_b, rows_b] with ld = cols_b; likewise A and C.
  const Layout l1(lt_type(B.dtype), B.shape[1], B.shape[0], B.shape[1]);
  const Layout l2(lt_type(A.dtype), A.shape[1], A.shape[0], A.shape[1]);
  const Layout lc(lt_type(C.dtype), N, M, N);

  Preference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kLtWorkspaceBytes));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(B.data));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(A.data));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(C.data));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(C.data));

  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  lt_check(cublaslt().MatmulAlgoGetHeuristic(ctx.handle, desc.d, l1.l, l2.l, lc.l, lc.l, pref.p, 1, &heuristic, &found),
           "heuristic");
  if (found == 0) return false;
  lt_check(cublaslt().Matmul(ctx.handle, desc.d, &alpha, B.data, l1.l, A.data, l2.l, &beta, C.data, lc.l, C.data, lc.l,
                          &heuristic.algo, ctx.workspace.data(), kLtWorkspaceBytes, cuda::compute_stream()),
           "matmul");
  return true;
}

[[noreturn]] void no_algorithm(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b) {
  throw Error(fmt::format("matmul: cuBLASLt has no algorithm for C {} = op(A {}) op(B {}) (trans_a {}, trans_b {})",
                          C.describe(), A.describe(), B.describe(), trans_a, trans_b));
}

// An f32 copy of a bf16 tensor in a Workspace buffer held by `holder`.
Tensor widen(const Tensor& t, Buffer& holder) {
  holder = Buffer(size_t(t.numel()) * sizeof(float), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
  Tensor f = Tensor::view(holder.data(), DType::F32, t.shape.data(), t.ndim, Device::CUDA);
  cast(f, t);
  return f;
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
  // Two bf16 operands: tensor cores. Should cuBLASLt have no bf16 kernel for these shapes and
  // alignments (odd leading dimensions), fall through to the f32 path, which has one for all.
  if (A.dtype == DType::BF16 && B.dtype == DType::BF16 && lt_matmul(C, A, B, trans_a, trans_b, alpha, beta, M, N))
    return;
  // An f32 operand (or the bf16 fallback): compute in exact f32.
  Buffer a_hold, b_hold, c_hold;
  const Tensor a = A.dtype == DType::F32 ? A : widen(A, a_hold);
  const Tensor b = B.dtype == DType::F32 ? B : widen(B, b_hold);
  if (C.dtype == DType::F32) {
    if (!lt_matmul(C, a, b, trans_a, trans_b, alpha, beta, M, N)) no_algorithm(C, A, B, trans_a, trans_b);
    return;
  }
  c_hold = Buffer(size_t(M * N) * sizeof(float), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
  const Tensor c = Tensor::view(c_hold.data(), DType::F32, {M, N}, Device::CUDA);
  if (beta != 0.0f) cast(c, C);
  if (!lt_matmul(c, a, b, trans_a, trans_b, alpha, beta, M, N)) no_algorithm(C, A, B, trans_a, trans_b);
  cast(C, c);
}

}  // namespace shardlm::ops::gpu
