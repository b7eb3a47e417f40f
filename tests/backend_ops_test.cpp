// backend_ops: every op of ops/ops.h, forward and backward, run on the CPU reference and on every
// other backend this build and machine have (today: CUDA), on the same inputs, compared with a
// per-op tolerance (the table below). In the spirit of llama.cpp's test-backend-ops.
//
// For each case and each backend the harness
//   - puts every tensor in its own buffer on the backend's device, surrounded by 256 guard bytes
//     on each side, and checks the guards after the op (an out-of-bounds write shows up there);
//   - fills "written" outputs with NaN bytes first, so an element the op forgot to write fails
//     the NaN/Inf check; outputs must be finite (casts of special values excepted);
//   - checks that inputs are unchanged, bit for bit;
//   - compares outputs and returned host scalars with the CPU reference.
//
// `backend_ops_test cpu` (ctest: backend_ops) runs the CPU backend through the same harness
// against itself (guards, NaN and input checks, exact agreement) and checks that the harness
// detects a perturbed output, a NaN and a guard overwrite: a real test on every machine.
// The CPU's bf16 path (ops/cpu_bf16.h: bf16 matmuls through oneDNN, the CUDA matmul's policy) is
// tested as a backend of its own, "cpu-bf16", by `backend_ops_test cpu` on a CPU with bf16
// hardware: its matmul and linear_cross_entropy cases, and its attention cases with bf16 inputs
// (bf16 block products, the probabilities rounded to bf16), against the reference, which (with the
// emulations) always runs on the exact f32 path.
// `backend_ops_test cuda` (ctest: backend_ops_cuda) compares the CUDA backend with the CPU
// reference; without a GPU (or without CUDA in the build) it prints why and exits with kSkipped
// (77), which ctest reports as skipped (SKIP_RETURN_CODE), never as passed. With no argument it
// runs cpu and, where available, cuda.
//
// Exit status: 0 when everything that ran passed, 1 otherwise, 77 when cuda was asked for and
// cannot run here.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/cpu_bf16.h"
#include "ops/nf4.h"
#include "ops/ops.h"

namespace shardlm {
namespace {

// ---- deterministic inputs ---------------------------------------------------------------------
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  float normal() {
    const double u1 = uniform() + 1e-300, u2 = uniform();
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  int32_t below(int32_t n) { return int32_t(next() % uint64_t(n)); }
};

std::vector<float> randn(Rng& r, int64_t n, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = r.normal() * scale;
  return v;
}

// Uniform with unit variance (times scale): cheap, for the production-sized cases' tensors of
// tens of millions of elements.
std::vector<float> randu(Rng& r, int64_t n, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  const double k = 2.0 * 1.7320508075688772 * scale;
  for (float& x : v) x = float((r.uniform() - 0.5) * k);
  return v;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// Element i of raw bytes of dtype t, as double.
double element(const std::vector<uint8_t>& bytes, DType t, int64_t i) {
  switch (t) {
    case DType::F32: {
      float f;
      std::memcpy(&f, bytes.data() + i * 4, 4);
      return f;
    }
    case DType::BF16: {
      bf16_t h;
      std::memcpy(&h, bytes.data() + i * 2, 2);
      return bf16_to_f32(h);
    }
    case DType::F16: {
      f16_t h;
      std::memcpy(&h, bytes.data() + i * 2, 2);
      return f16_to_f32(h);
    }
    case DType::I32: {
      int32_t v;
      std::memcpy(&v, bytes.data() + i * 4, 4);
      return v;
    }
    case DType::U8: return bytes[size_t(i)];
  }
  return 0.0;
}

std::vector<uint8_t> encode(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> out(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::F32) {
      std::memcpy(out.data() + i * 4, &v[i], 4);
    } else if (t == DType::BF16) {
      const bf16_t h = f32_to_bf16(v[i]);
      std::memcpy(out.data() + i * 2, &h, 2);
    } else if (t == DType::F16) {
      const f16_t h = f32_to_f16(v[i]);
      std::memcpy(out.data() + i * 2, &h, 2);
    } else {
      const int32_t x = int32_t(v[i]);
      std::memcpy(out.data() + i * 4, &x, 4);
    }
  }
  return out;
}

std::vector<uint8_t> encode_i32(const std::vector<int32_t>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// ---- cases ------------------------------------------------------------------------------------
enum class Role {
  In,     // read only: must be unchanged
  Out,    // written: filled with NaN bytes before the op, must be fully written
  InOut,  // updated in place (accumulated outputs, in-place ops): initial values given
};

struct Arg {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  Role role;
  std::vector<uint8_t> init;  // initial bytes (empty for Out)
};

struct Tolerance {
  double atol = 0.0, rtol = 0.0;
};

struct Case {
  std::string op, label;
  std::vector<Arg> args;
  // Runs the op on tensors in the order of args; returns the op's host results (if any).
  std::function<std::vector<double>(const std::vector<Tensor>&)> run;
  Tolerance tol;
  double scalar_rtol = 1e-6;  // for returned host values
  bool bitwise = false;       // outputs must match bit for bit (casts)
  bool nonfinite_ok = false;  // outputs may hold NaN/Inf (casts of special values)
  // The bf16 policy of the CUDA matmul: an f32 operand beside a bf16 one, and the f32 dlogits of
  // a bf16 head, are rounded to bf16 (the CPU keeps them in f32). For such cases every output
  // element may also differ by narrowed_rtol x the largest |value the op wrote| in that output
  // (|reference - initial| for accumulated outputs).
  double narrowed_rtol = 0.0;
  // For those cases: the CUDA policy emulated on the CPU (the same roundings, exact f32 GEMMs).
  // Its result must pass against the reference too: evidence, without a GPU, that the stated
  // tolerance covers the policy's error.
  std::function<std::vector<double>(const std::vector<Tensor>&)> emulate;
  // Production-sized: built lazily (args empty until build runs, freed after), and run only
  // when a GPU is present or SHARDLM_BACKEND_OPS_LARGE=1 (the CPU reference takes seconds).
  bool large = false;
  std::function<void(Case&)> build;
};

Arg in(std::string name, DType t, std::vector<int64_t> shape, const std::vector<float>& v) {
  return {std::move(name), t, std::move(shape), Role::In, encode(v, t)};
}
Arg in_i32(std::string name, std::vector<int64_t> shape, const std::vector<int32_t>& v) {
  return {std::move(name), DType::I32, std::move(shape), Role::In, encode_i32(v)};
}
Arg out(std::string name, DType t, std::vector<int64_t> shape) {
  return {std::move(name), t, std::move(shape), Role::Out, {}};
}
Arg inout(std::string name, DType t, std::vector<int64_t> shape, const std::vector<float>& v) {
  return {std::move(name), t, std::move(shape), Role::InOut, encode(v, t)};
}

// ---- running a case on a device ---------------------------------------------------------------
constexpr size_t kGuard = 256;  // bytes on each side; keeps the tensor 256-byte aligned

uint8_t guard_byte(size_t i) { return uint8_t(0xA5 ^ (i * 37)); }

struct RunResult {
  std::vector<std::vector<uint8_t>> bytes;  // final contents of every arg
  std::vector<double> scalars;
  std::vector<std::string> errors;          // guard violations, exceptions
};

RunResult run_case(const Case& c, Device dev) {
  RunResult res;
  std::vector<Buffer> bufs;
  std::vector<Tensor> ts;
  for (const Arg& a : c.args) {
    const size_t nbytes = size_t(numel_of(a.shape)) * dtype_size(a.dtype);
    std::vector<uint8_t> host(nbytes + 2 * kGuard);
    for (size_t i = 0; i < kGuard; ++i) host[i] = host[kGuard + nbytes + i] = guard_byte(i);
    if (a.role == Role::Out)
      std::memset(host.data() + kGuard, 0xFF, nbytes);  // NaN in f32, bf16 and f16
    else
      std::memcpy(host.data() + kGuard, a.init.data(), nbytes);
    bufs.emplace_back(host.size(), MemCategory::Other, /*zero=*/false, dev);
    device::copy_bytes(bufs.back().data(), dev, host.data(), Device::CPU, host.size());
    ts.push_back(Tensor::view(static_cast<uint8_t*>(bufs.back().data()) + kGuard, a.dtype, a.shape.data(),
                              int(a.shape.size()), dev));
  }
  try {
    res.scalars = c.run(ts);
    if (dev == Device::CUDA) device::synchronize();  // asynchronous faults surface here, named by the case
  } catch (const std::exception& e) {
    res.errors.push_back(fmt::format("threw: {}", e.what()));
    return res;
  }
  for (size_t k = 0; k < c.args.size(); ++k) {
    const Arg& a = c.args[k];
    const size_t nbytes = size_t(numel_of(a.shape)) * dtype_size(a.dtype);
    std::vector<uint8_t> host(nbytes + 2 * kGuard);
    device::copy_bytes(host.data(), Device::CPU, bufs[k].data(), dev, host.size());
    for (size_t i = 0; i < kGuard; ++i) {
      if (host[i] != guard_byte(i)) {
        res.errors.push_back(fmt::format("{}: guard byte {} before the tensor was overwritten", a.name, kGuard - i));
        break;
      }
      if (host[kGuard + nbytes + i] != guard_byte(i)) {
        res.errors.push_back(fmt::format("{}: guard byte {} after the tensor was overwritten", a.name, i));
        break;
      }
    }
    res.bytes.emplace_back(host.begin() + kGuard, host.begin() + kGuard + nbytes);
  }
  return res;
}

// Checks `got` (from any backend) against `want` (the CPU reference). Returns "" when it passes,
// else one line naming the first problem.
std::string compare(const Case& c, const RunResult& got, const RunResult& want) {
  if (!got.errors.empty()) return got.errors.front();
  if (!want.errors.empty()) return "reference: " + want.errors.front();
  for (size_t k = 0; k < c.args.size(); ++k) {
    const Arg& a = c.args[k];
    const std::vector<uint8_t>& g = got.bytes[k];
    const std::vector<uint8_t>& w = want.bytes[k];
    if (a.role == Role::In) {
      if (g != a.init) return fmt::format("{}: input was modified", a.name);
      continue;
    }
    const int64_t n = numel_of(a.shape);
    if (c.bitwise) {
      if (g != w) {
        for (int64_t i = 0; i < n; ++i) {
          const size_t sz = dtype_size(a.dtype);
          if (std::memcmp(g.data() + i * int64_t(sz), w.data() + i * int64_t(sz), sz) != 0)
            return fmt::format("{}[{}]: got {}, want {} (bitwise)", a.name, i, element(g, a.dtype, i),
                               element(w, a.dtype, i));
        }
      }
      continue;
    }
    // A bf16/f16 output may differ by one rounding step when the f32 values straddle a rounding
    // boundary: allow at least one unit in the last place of the stored type.
    Tolerance tol = c.tol;
    if (a.dtype == DType::BF16) tol.rtol = std::max(tol.rtol, 1.0 / 128);
    if (a.dtype == DType::F16) tol.rtol = std::max(tol.rtol, 1.0 / 1024);
    if (c.narrowed_rtol > 0.0) {
      double written = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const double before = a.role == Role::InOut ? element(a.init, a.dtype, i) : 0.0;
        written = std::max(written, std::fabs(element(w, a.dtype, i) - before));
      }
      tol.atol += c.narrowed_rtol * written;
    }
    double worst = -1.0;
    int64_t worst_i = -1;
    for (int64_t i = 0; i < n; ++i) {
      const double gv = element(g, a.dtype, i), wv = element(w, a.dtype, i);
      if (!c.nonfinite_ok && !std::isfinite(gv)) return fmt::format("{}[{}] is {} (not finite)", a.name, i, gv);
      if (!c.nonfinite_ok && !std::isfinite(wv)) return fmt::format("reference {}[{}] is {}", a.name, i, wv);
      const double err = std::fabs(gv - wv), bound = tol.atol + tol.rtol * std::fabs(wv);
      if (!(err <= bound) && !(std::isnan(gv) && std::isnan(wv)) && !(gv == wv)) {
        if (err - bound > worst) {
          worst = err - bound;
          worst_i = i;
        }
      }
    }
    if (worst_i >= 0)
      return fmt::format("{}[{}]: got {:.9g}, want {:.9g} (atol {:g}, rtol {:g})", a.name, worst_i,
                         element(g, a.dtype, worst_i), element(w, a.dtype, worst_i), tol.atol, tol.rtol);
  }
  if (got.scalars.size() != want.scalars.size()) return "different number of returned values";
  for (size_t i = 0; i < got.scalars.size(); ++i) {
    const double gv = got.scalars[i], wv = want.scalars[i];
    if (!std::isfinite(gv)) return fmt::format("returned value {} is {}", i, gv);
    if (!(std::fabs(gv - wv) <= c.scalar_rtol * std::fabs(wv) + 1e-12))
      return fmt::format("returned value {}: got {:.17g}, want {:.17g} (rtol {:g})", i, gv, wv, c.scalar_rtol);
  }
  return "";
}

// ---- the CUDA bf16 policy, emulated on the CPU ---------------------------------------------------
// A bf16 copy of a CPU tensor (the tensor itself when it is bf16), kept alive by `holder`.
Tensor as_bf16(const Tensor& t, Buffer& holder) {
  if (t.dtype == DType::BF16) return t;
  holder = Buffer(size_t(t.numel()) * 2, MemCategory::Other, /*zero=*/false);
  const Tensor h = Tensor::view(holder.data(), DType::BF16, t.shape.data(), t.ndim);
  ops::cast(h, t);
  return h;
}

// ops/cuda/matmul.cu with a mixed pair: the f32 operand rounded to bf16, then an f32-accumulated
// product (on the CPU: exact f32 of the same bf16 values).
std::vector<double> emulate_matmul(const std::vector<Tensor>& t, bool ta, bool tb, float alpha, float beta) {
  Buffer ha, hb;
  ops::matmul(t[0], as_bf16(t[1], ha), as_bf16(t[2], hb), ta, tb, alpha, beta);
  return {};
}

// ops/cuda/cross_entropy.cu with a bf16 head: logits from bf16 x and w in f32, dlogits rounded
// to bf16, dx = dlogits w and dw += dlogits^T x from those bf16 values.
std::vector<double> emulate_bf16_cross_entropy(const std::vector<Tensor>& t, float grad_scale, int64_t chunk) {
  const Tensor &x = t[0], &w = t[1], &targets = t[2];
  const bool backward = t.size() > 3, with_dw = t.size() > 4;  // dx, and dw unless the head is frozen
  const int64_t N = x.shape[0], V = w.shape[0];
  Buffer hx;
  const Tensor x16 = as_bf16(x, hx);
  double loss_sum = 0.0;
  int64_t count = 0;
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t r1 = std::min(N, r0 + chunk), rows = r1 - r0;
    Buffer lb(size_t(rows * V) * 4, MemCategory::Other, false), gb(size_t(rows * V) * 2, MemCategory::Other, false);
    const Tensor logits = Tensor::of(lb, DType::F32, {rows, V}), dl = Tensor::of(gb, DType::BF16, {rows, V});
    const Tensor xc = x16.slice(r0, r1);
    ops::matmul(logits, xc, w, false, true);
    for (int64_t i = 0; i < rows; ++i) {
      const float* z = logits.f32() + i * V;
      bf16_t* g = static_cast<bf16_t*>(dl.data) + i * V;
      const int32_t tg = targets.i32()[r0 + i];
      if (tg == ops::kIgnoreIndex) {
        for (int64_t j = 0; j < V; ++j) g[j] = f32_to_bf16(0.0f);
        continue;
      }
      float m = z[0];
      for (int64_t j = 1; j < V; ++j) m = std::max(m, z[j]);
      double sum = 0.0;
      for (int64_t j = 0; j < V; ++j) sum += std::exp(z[j] - m);
      loss_sum += double(m) + std::log(sum) - double(z[tg]);
      ++count;
      const float k = float(double(grad_scale) / sum);
      for (int64_t j = 0; j < V; ++j) {
        float v = std::exp(z[j] - m) * k;
        if (j == tg) v -= grad_scale;
        g[j] = f32_to_bf16(v);
      }
    }
    if (!backward) continue;
    ops::matmul(t[3].slice(r0, r1), dl, w);
    if (with_dw) ops::matmul(t[4], dl, xc, true, false, 1.0f, 1.0f);
  }
  return {loss_sum, double(count)};
}

// ---- the cases, with the tolerance table ------------------------------------------------------
// Tolerances (atol + rtol * |reference|, per element; bf16 outputs at least rtol 2^-7, f16 2^-10):
//   cast, zero, embedding_forward, dropout   bitwise / exact: data movement, one rounding, or (dropout)
//                                            the same Philox draws and one f32 product
//   add_inplace, scale_inplace, add_bias,
//   bias_backward, embedding_backward        1e-7 + 1e-6: the same f32 operations in the same order
//   adamw_step                               1e-7 + 1e-6: the same ops, no fused multiply-add
//   swiglu                                   1e-6 + 1e-5: expf differs from libm by a few ulp
//   rope                                     1e-5 + 1e-5: cosf/sinf differ from libm by a few ulp
//   rmsnorm forward / backward               1e-5 + 1e-5 / 1e-5 + 1e-4: double sums, other order
//   matmul                                   2e-4 + 1e-4: f32 sums of up to 130 terms, other order
//   linear_cross_entropy dx, dw              1e-6 + 1e-4 (grad_scale ~ 1/32); loss rtol 1e-5
//   attention forward (out, lse)             1e-5 + 1e-4: online softmax with other tiling
//   attention backward (dq, dk, dv)          1e-4 + 1e-3: recomputed P, sums in other order
//   sum_squares                              rtol 1e-12 on the returned double
// Cases under the CUDA bf16 policy (a matmul with one f32 and one bf16 operand: the f32 one is
// rounded to bf16; linear_cross_entropy with a bf16 head: dlogits rounded to bf16) add
// 2^-7 x max|written value| of the output to atol: one bf16 rounding (relative 2^-8) of an
// operand, with room for the sums of those roundings, which are random-signed.
// Production-sized cases (Llama 3.2 1B / 3 8B shapes, element counts past 2^24) scale their
// inputs so outputs are O(1) and keep the tolerances above; they are `large` (see Case).
constexpr double kNarrowedRtol = 1.0 / 128;

void add_large_cases(std::vector<Case>& cases);

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  Rng rng(20240607);
  const DType F = DType::F32, H = DType::BF16;
  auto dn = [](DType t) { return std::string(dtype_name(t)); };

  // matmul
  struct MM {
    int64_t M, N, K;
    bool ta, tb;
    DType a, b, c;
    float alpha, beta;
  };
  std::vector<MM> mms;
  for (int t = 0; t < 4; ++t) mms.push_back({17, 33, 29, bool(t & 1), bool(t & 2), F, F, F, 1.0f, 0.0f});
  mms.push_back({64, 48, 130, false, true, H, H, F, 1.0f, 0.0f});
  mms.push_back({64, 48, 130, true, false, H, H, H, 1.0f, 0.0f});
  mms.push_back({31, 5, 70, false, true, F, H, F, 1.0f, 0.0f});
  mms.push_back({31, 5, 70, true, true, H, F, H, 0.5f, 1.5f});
  mms.push_back({1, 7, 5, false, false, F, F, F, 0.5f, 1.5f});
  mms.push_back({40, 1, 3, true, false, H, H, F, 2.0f, 1.0f});
  // A decode step with bf16 weights (the CPU's skinny kernel: f32 x, bf16 W widened in registers).
  mms.push_back({1, 300, 2048, false, true, F, H, F, 1.0f, 0.0f});
  mms.push_back({8, 65, 1031, false, true, F, H, F, 0.5f, 1.5f});
  for (const MM& m : mms) {
    Case c;
    c.op = "matmul";
    c.label = fmt::format("C {}[{}x{}] = {}A {} {}B {} K={} a={} b={}", dn(m.c), m.M, m.N, m.ta ? "T " : "", dn(m.a),
                          m.tb ? "T " : "", dn(m.b), m.K, m.alpha, m.beta);
    const std::vector<int64_t> ashape = m.ta ? std::vector<int64_t>{m.K, m.M} : std::vector<int64_t>{m.M, m.K};
    const std::vector<int64_t> bshape = m.tb ? std::vector<int64_t>{m.N, m.K} : std::vector<int64_t>{m.K, m.N};
    c.args.push_back(m.beta != 0.0f ? inout("C", m.c, {m.M, m.N}, randn(rng, m.M * m.N)) : out("C", m.c, {m.M, m.N}));
    c.args.push_back(in("A", m.a, ashape, randn(rng, m.M * m.K)));
    c.args.push_back(in("B", m.b, bshape, randn(rng, m.K * m.N)));
    c.run = [m](const std::vector<Tensor>& t) {
      ops::matmul(t[0], t[1], t[2], m.ta, m.tb, m.alpha, m.beta);
      return std::vector<double>{};
    };
    c.tol = {2e-4, 1e-4};
    if (m.a != m.b) {
      c.narrowed_rtol = kNarrowedRtol;
      c.emulate = [m](const std::vector<Tensor>& t) { return emulate_matmul(t, m.ta, m.tb, m.alpha, m.beta); };
    }
    cases.push_back(std::move(c));
  }

  // embedding
  for (auto [wt, ot] : {std::pair{F, F}, std::pair{H, F}, std::pair{F, H}}) {
    const int64_t V = 50, D = 37, N = 23;
    std::vector<int32_t> ids(N);
    for (auto& id : ids) id = rng.below(int32_t(V));
    Case c;
    c.op = "embedding_forward";
    c.label = fmt::format("weight {}[{}x{}] -> out {} N={}", dn(wt), V, D, dn(ot), N);
    c.args = {out("out", ot, {N, D}), in("weight", wt, {V, D}, randn(rng, V * D)), in_i32("ids", {N}, ids)};
    c.run = [](const std::vector<Tensor>& t) {
      ops::embedding_forward(t[0], t[1], t[2]);
      return std::vector<double>{};
    };
    cases.push_back(std::move(c));
  }
  for (DType dt : {F, H}) {
    const int64_t V = 11, D = 70, N = 40;
    std::vector<int32_t> ids(N);
    for (auto& id : ids) id = rng.below(5);  // many repeats
    Case c;
    c.op = "embedding_backward";
    c.label = fmt::format("dout {}[{}x{}] into dweight f32[{}x{}], repeated ids", dn(dt), N, D, V, D);
    c.args = {inout("dweight", F, {V, D}, randn(rng, V * D)), in("dout", dt, {N, D}, randn(rng, N * D)),
              in_i32("ids", {N}, ids)};
    c.run = [](const std::vector<Tensor>& t) {
      ops::embedding_backward(t[0], t[1], t[2]);
      return std::vector<double>{};
    };
    c.tol = {1e-7, 1e-6};
    cases.push_back(std::move(c));
  }

  // RMSNorm
  struct RN {
    int64_t N, D;
    DType x, w, y;
  };
  for (const RN& r : {RN{7, 129, F, F, F}, RN{5, 2050, H, H, H}, RN{3, 64, H, F, F}, RN{1, 1, F, F, F}}) {
    Case f;
    f.op = "rmsnorm_forward";
    const std::string label = fmt::format("x {}[{}x{}] w {} y {}", dn(r.x), r.N, r.D, dn(r.w), dn(r.y));
    f.label = label;
    f.args = {out("y", r.y, {r.N, r.D}), out("rstd", F, {r.N}), in("x", r.x, {r.N, r.D}, randn(rng, r.N * r.D)),
              in("w", r.w, {r.D}, randn(rng, r.D))};
    f.run = [](const std::vector<Tensor>& t) {
      ops::rmsnorm_forward(t[0], t[1], t[2], t[3], 1e-5f);
      return std::vector<double>{};
    };
    f.tol = {1e-5, 1e-5};
    cases.push_back(std::move(f));

    std::vector<float> rstd(static_cast<size_t>(r.N));
    for (float& v : rstd) v = float(0.5 + 1.5 * rng.uniform());
    Case b;
    b.op = "rmsnorm_backward";
    b.label = label;  // (f has been moved into cases)
    b.args = {out("dx", r.y, {r.N, r.D}), inout("dw", F, {r.D}, randn(rng, r.D)),
              in("dy", r.y, {r.N, r.D}, randn(rng, r.N * r.D)), in("x", r.x, {r.N, r.D}, randn(rng, r.N * r.D)),
              in("w", r.w, {r.D}, randn(rng, r.D)), in("rstd", F, {r.N}, rstd)};
    b.run = [](const std::vector<Tensor>& t) {
      ops::rmsnorm_backward(t[0], t[1], t[2], t[3], t[4], t[5]);
      return std::vector<double>{};
    };
    b.tol = {1e-5, 1e-4};
    // A frozen weight (LoRA): dw undefined, dx alone (the CUDA dw kernels must not run).
    Case fz;
    fz.op = "rmsnorm_backward";
    fz.label = label + ", frozen w (no dw)";
    fz.args = {out("dx", r.y, {r.N, r.D}), b.args[2], b.args[3], b.args[4], b.args[5]};
    fz.run = [](const std::vector<Tensor>& t) {
      ops::rmsnorm_backward(t[0], Tensor{}, t[1], t[2], t[3], t[4]);
      return std::vector<double>{};
    };
    fz.tol = b.tol;
    cases.push_back(std::move(b));
    cases.push_back(std::move(fz));
  }

  // RoPE (forward and backward; in place when `alias`)
  struct RP {
    int64_t B, T, Hh, Dh;
    DType x, o;
    bool alias;
  };
  for (const RP& r : {RP{2, 5, 3, 64, F, F, false}, RP{1, 7, 2, 128, H, H, false}, RP{2, 3, 4, 32, F, F, true},
                      RP{1, 4, 1, 6, F, H, false}}) {
    const int64_t n = r.B * r.T * r.Hh * r.Dh;
    std::vector<int32_t> pos(static_cast<size_t>(r.B * r.T));
    for (auto& p : pos) p = rng.below(3000);
    const std::vector<float> inv = ops::rope_inv_freq(r.Dh, 500000.0f, {});
    for (int dir = 0; dir < 2; ++dir) {
      Case c;
      c.op = dir == 0 ? "rope_forward" : "rope_backward";
      c.label = fmt::format("{} [{}x{}x{}x{}] -> {}{}", dn(r.x), r.B, r.T, r.Hh, r.Dh, dn(r.o), r.alias ? " in place" : "");
      const std::vector<int64_t> shape{r.B, r.T, r.Hh, r.Dh};
      if (r.alias)
        c.args = {inout("x", r.x, shape, randn(rng, n))};
      else
        c.args = {out("out", r.o, shape), in("x", r.x, shape, randn(rng, n))};
      c.args.push_back(in_i32("positions", {r.B, r.T}, pos));
      c.args.push_back(in("inv_freq", F, {r.Dh / 2}, inv));
      const bool alias = r.alias;
      c.run = [alias, dir](const std::vector<Tensor>& t) {
        const Tensor& o = t[0];
        const Tensor& x = alias ? t[0] : t[1];
        const size_t p = alias ? 1 : 2;
        if (dir == 0)
          ops::rope_forward(o, x, t[p], t[p + 1]);
        else
          ops::rope_backward(o, x, t[p], t[p + 1]);
        return std::vector<double>{};
      };
      c.tol = {1e-5, 1e-5};
      cases.push_back(std::move(c));
    }
  }

  // attention: forward, and backward from the CPU forward's out and lse
  struct AT {
    int64_t B, Tq, Tk, Hq, Hkv, Dh;
    DType t;
    int seg_len;  // 0: no segment_ids
  };
  for (const AT& a : {AT{1, 17, 17, 2, 2, 16, F, 0}, AT{2, 33, 33, 4, 2, 64, H, 0}, AT{1, 9, 40, 4, 1, 32, F, 0},
                      AT{2, 50, 50, 2, 1, 64, F, 13}, AT{1, 70, 70, 2, 2, 128, H, 9}, AT{1, 20, 45, 6, 2, 80, F, 7},
                      AT{1, 5, 5, 1, 1, 200, F, 0}, AT{1, 1, 3, 2, 1, 8, H, 0},
                      AT{1, 19, 23, 3, 1, 13, H, 0},  // odd head size and key count: bf16 pairs padded
                      // production head sizes at T = 256 (T = 2048: add_large_cases)
                      AT{1, 256, 256, 4, 2, 64, H, 0}, AT{1, 256, 256, 4, 2, 128, H, 100}}) {
    const std::vector<int64_t> qs{a.B, a.Tq, a.Hq, a.Dh}, ks{a.B, a.Tk, a.Hkv, a.Dh}, ls{a.B, a.Hq, a.Tq};
    const std::vector<float> q = randn(rng, numel_of(qs)), k = randn(rng, numel_of(ks)), v = randn(rng, numel_of(ks));
    std::vector<int32_t> seg(static_cast<size_t>(a.B * a.Tk));
    for (int64_t i = 0; i < a.B * a.Tk; ++i) seg[size_t(i)] = a.seg_len ? int32_t((i % a.Tk) / a.seg_len) : 0;
    const float scale = 1.0f / std::sqrt(float(a.Dh));
    const std::string label =
        fmt::format("{} B={} Tq={} Tk={} H={} Hkv={} Dh={}{}", dn(a.t), a.B, a.Tq, a.Tk, a.Hq, a.Hkv, a.Dh,
                    a.seg_len ? fmt::format(" segments of {}", a.seg_len) : "");
    const bool with_seg = a.seg_len > 0;

    Case f;
    f.op = "attention_forward";
    f.label = label;
    f.args = {out("out", a.t, qs), out("lse", F, ls), in("q", a.t, qs, q), in("k", a.t, ks, k), in("v", a.t, ks, v),
              in_i32("segment_ids", {a.B, a.Tk}, seg)};
    f.run = [with_seg, scale](const std::vector<Tensor>& t) {
      ops::attention_forward(t[0], t[1], t[2], t[3], t[4], with_seg ? t[5] : Tensor{}, scale);
      return std::vector<double>{};
    };
    f.tol = {1e-5, 1e-4};

    // The backward needs a consistent out and lse: take them from the CPU forward.
    RunResult fwd = run_case(f, Device::CPU);
    if (!fwd.errors.empty()) throw Error("attention forward for the backward case failed: " + fwd.errors.front());
    Case b;
    b.op = "attention_backward";
    b.label = label;
    b.args = {out("dq", F, qs),
              out("dk", F, ks),
              out("dv", F, ks),
              in("dout", a.t, qs, randn(rng, numel_of(qs))),
              in("q", a.t, qs, q),
              in("k", a.t, ks, k),
              in("v", a.t, ks, v),
              {"out", a.t, qs, Role::In, fwd.bytes[0]},
              {"lse", F, ls, Role::In, fwd.bytes[1]},
              in_i32("segment_ids", {a.B, a.Tk}, seg)};
    b.run = [with_seg, scale](const std::vector<Tensor>& t) {
      ops::attention_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], with_seg ? t[9] : Tensor{}, scale);
      return std::vector<double>{};
    };
    b.tol = {1e-4, 1e-3};
    cases.push_back(std::move(f));
    cases.push_back(std::move(b));
  }

  // paged attention (one sequence's keys and values in blocks of a KV cache): f32 or bf16 blocks
  // beside f32 queries (generation's activations), more blocks than the keys need (a sequence's
  // reserved ones), a block of one position and one block for all.
  struct PT {
    int64_t Tq, Tk, Hq, Hkv, Dh;
    DType qt, kvt;
    int64_t block, spare;  // positions per block; blocks past those the Tk keys fill
  };
  for (const PT& a : {PT{1, 37, 4, 2, 16, F, F, 16, 0}, PT{6, 37, 4, 1, 64, H, H, 5, 0}, PT{1, 64, 2, 2, 128, H, H, 64, 0},
                      PT{3, 40, 4, 2, 64, F, H, 16, 1}, PT{1, 9, 2, 1, 32, F, F, 1, 2}}) {
    const int64_t nb = (a.Tk + a.block - 1) / a.block + a.spare;
    const std::vector<int64_t> qs{1, a.Tq, a.Hq, a.Dh}, bs{a.block, a.Hkv, a.Dh}, ls{1, a.Hq, a.Tq};
    Case f;
    f.op = "attention_forward_paged";
    // Labelled by q's dtype first, as the other attention cases (a bf16 one runs on the CPU's bf16 path too).
    f.label = fmt::format("{}{} Tq={} Tk={} H={} Hkv={} Dh={} {} blocks of {}", dn(a.qt),
                          a.kvt == a.qt ? "" : fmt::format(" kv {}", dn(a.kvt)), a.Tq, a.Tk, a.Hq, a.Hkv, a.Dh, nb,
                          a.block);
    f.args = {out("out", a.qt, qs), out("lse", F, ls), in("q", a.qt, qs, randn(rng, numel_of(qs)))};
    for (int64_t i = 0; i < 2 * nb; ++i)  // k blocks, then v blocks
      f.args.push_back(in(fmt::format("{}{}", i < nb ? "k" : "v", i % nb), a.kvt, bs, randn(rng, numel_of(bs))));
    const int64_t Tk = a.Tk;
    f.run = [nb, Tk, scale = 1.0f / std::sqrt(float(a.Dh))](const std::vector<Tensor>& t) {
      const std::vector<Tensor> k(t.begin() + 3, t.begin() + 3 + nb), v(t.begin() + 3 + nb, t.begin() + 3 + 2 * nb);
      ops::attention_forward_paged(t[0], t[1], t[2], k, v, Tk, scale);
      return std::vector<double>{};
    };
    f.tol = {1e-5, 1e-4};
    cases.push_back(std::move(f));
  }

  // SwiGLU
  for (auto [gt, ut, ot] : {std::tuple{F, F, F}, std::tuple{H, H, H}, std::tuple{H, F, F}}) {
    const int64_t N = 5, Fd = 333;
    Case f;
    f.op = "swiglu_forward";
    f.label = fmt::format("gate {} up {} out {} [{}x{}]", dn(gt), dn(ut), dn(ot), N, Fd);
    f.args = {out("out", ot, {N, Fd}), in("gate", gt, {N, Fd}, randn(rng, N * Fd, 3.0f)),
              in("up", ut, {N, Fd}, randn(rng, N * Fd))};
    f.run = [](const std::vector<Tensor>& t) {
      ops::swiglu_forward(t[0], t[1], t[2]);
      return std::vector<double>{};
    };
    f.tol = {1e-6, 1e-5};
    cases.push_back(std::move(f));
    Case b;
    b.op = "swiglu_backward";
    b.label = fmt::format("gate {} up {} grads {} [{}x{}]", dn(gt), dn(ut), dn(ot), N, Fd);
    b.args = {out("dgate", ot, {N, Fd}), out("dup", ot, {N, Fd}), in("dout", ot, {N, Fd}, randn(rng, N * Fd)),
              in("gate", gt, {N, Fd}, randn(rng, N * Fd, 3.0f)), in("up", ut, {N, Fd}, randn(rng, N * Fd))};
    b.run = [](const std::vector<Tensor>& t) {
      ops::swiglu_backward(t[0], t[1], t[2], t[3], t[4]);
      return std::vector<double>{};
    };
    b.tol = {1e-6, 1e-5};
    cases.push_back(std::move(b));
  }

  // linear + cross-entropy
  struct CE {
    int64_t N, D, V, chunk;
    DType t;
    bool backward;
    bool ignore_chunk;  // rows [chunk, 2 chunk) all ignored
    bool frozen = false;  // backward with dx only (dw undefined: a frozen head)
  };
  // (bf16 cases: V = 304 keeps the rows of bf16 dlogits 16-byte aligned for cuBLASLt's bf16
  // kernels, as the real vocabularies do; chunk 4 with 37 rows makes several dw groups.)
  for (const CE& e : {CE{37, 48, 301, 16, F, true, false}, CE{37, 48, 301, 16, H, true, false},
                      CE{37, 48, 304, 4, H, true, false}, CE{29, 20, 1000, 64, F, false, false},
                      CE{29, 64, 1000, 64, H, false, false}, CE{20, 16, 77, 8, F, true, true},
                      CE{24, 32, 96, 4, H, true, true}, CE{37, 48, 301, 16, F, true, false, true},
                      CE{37, 48, 304, 4, H, true, false, true}, CE{24, 32, 96, 4, H, true, true, true}}) {
    std::vector<int32_t> tg(static_cast<size_t>(e.N));
    for (int64_t i = 0; i < e.N; ++i) {
      tg[size_t(i)] = rng.below(int32_t(e.V));
      if (i % 7 == 3) tg[size_t(i)] = ops::kIgnoreIndex;
      if (e.ignore_chunk && i >= e.chunk && i < 2 * e.chunk) tg[size_t(i)] = ops::kIgnoreIndex;
    }
    const float grad_scale = 1.0f / 32.0f;
    Case c;
    c.op = "linear_cross_entropy";
    c.label = fmt::format("{} N={} D={} V={} chunk={}{}{}", dn(e.t), e.N, e.D, e.V, e.chunk,
                          !e.backward ? " loss only" : e.frozen ? " with dx, frozen head (no dw)" : " with dx, dw",
                          e.ignore_chunk ? ", an all-ignored chunk" : "");
    c.args = {in("x", e.t, {e.N, e.D}, randn(rng, e.N * e.D)), in("w", e.t, {e.V, e.D}, randn(rng, e.V * e.D, 0.3f)),
              in_i32("targets", {e.N}, tg)};
    if (e.backward) {
      c.args.push_back(out("dx", F, {e.N, e.D}));
      if (!e.frozen) c.args.push_back(inout("dw", F, {e.V, e.D}, randn(rng, e.V * e.D, 0.01f)));
    }
    const bool bw = e.backward, with_dw = e.backward && !e.frozen;
    const int64_t chunk = e.chunk;
    c.run = [bw, with_dw, chunk, grad_scale](const std::vector<Tensor>& t) {
      const ops::CrossEntropyResult r = ops::linear_cross_entropy(t[0], t[1], t[2], bw ? t[3] : Tensor{},
                                                                  with_dw ? t[4] : Tensor{}, grad_scale, chunk);
      return std::vector<double>{r.loss_sum, double(r.count)};
    };
    c.tol = {1e-6, 1e-4};
    c.scalar_rtol = 1e-5;
    if (e.t == H) {
      if (e.backward) c.narrowed_rtol = kNarrowedRtol;
      c.emulate = [bw, chunk, grad_scale](const std::vector<Tensor>& t) {
        return emulate_bf16_cross_entropy(bw ? t : std::vector<Tensor>(t.begin(), t.begin() + 3), grad_scale, chunk);
      };
    }
    cases.push_back(std::move(c));
  }

  // dropout: the CPU and CUDA masks are the same Philox draws and the kept values the same f32
  // product, so bitwise. Keys and streams with high bits set; in place; every dtype pair; p = 0.
  struct DO {
    int64_t N, D;
    DType x, o;
    float p;
    uint64_t key, stream;
    bool alias;
  };
  for (const DO& d : {DO{37, 1001, F, F, 0.1f, 7, 3, false}, DO{64, 515, H, H, 0.5f, 0xfedcba9876543210ull, 1ull << 40, false},
                      DO{9, 77, F, H, 0.9f, 1, 0xffffffffffffffffull, false}, DO{9, 77, H, F, 0.25f, 2, 5, false},
                      DO{33, 129, F, F, 0.3f, 11, 12, true}, DO{33, 129, H, H, 0.05f, 13, 14, true},
                      DO{5, 40, F, F, 0.0f, 1, 1, false}, DO{1, 1, F, F, 0.5f, 3, 3, false}}) {
    Case c;
    c.op = "dropout";
    c.label = fmt::format("{}[{}x{}] -> {} p={} key={:#x} stream={:#x}{}", dn(d.x), d.N, d.D, dn(d.o), d.p, d.key,
                          d.stream, d.alias ? " in place" : "");
    if (d.alias)
      c.args = {inout("x", d.x, {d.N, d.D}, randn(rng, d.N * d.D))};
    else
      c.args = {out("out", d.o, {d.N, d.D}), in("x", d.x, {d.N, d.D}, randn(rng, d.N * d.D))};
    c.run = [d](const std::vector<Tensor>& t) {
      ops::dropout(t[0], d.alias ? t[0] : t[1], d.p, d.key, d.stream);
      return std::vector<double>{};
    };
    c.bitwise = true;
    cases.push_back(std::move(c));
  }

  // AdamW
  for (int64_t step : {1, 10}) {
    const int64_t n = 1003;
    std::vector<float> v = randn(rng, n, 0.01f);
    for (float& x : v) x = std::fabs(x);
    ops::AdamWConfig cfg;
    cfg.lr = 3e-3;
    cfg.weight_decay = step == 1 ? 0.0 : 0.1;
    Case c;
    c.op = "adamw_step";
    c.label = fmt::format("n={} step={} wd={}", n, step, cfg.weight_decay);
    c.args = {inout("param", F, {n}, randn(rng, n)), in("grad", F, {n}, randn(rng, n)),
              inout("m", F, {n}, randn(rng, n, 0.1f)), inout("v", F, {n}, v)};
    c.run = [cfg, step](const std::vector<Tensor>& t) {
      ops::adamw_step(t[0], t[1], t[2], t[3], cfg, step, 0.5f);
      return std::vector<double>{};
    };
    c.tol = {1e-7, 1e-6};
    cases.push_back(std::move(c));
  }

  // bias
  for (auto [yt, bt] : {std::pair{F, F}, std::pair{H, F}, std::pair{F, H}}) {
    Case c;
    c.op = "add_bias";
    c.label = fmt::format("y {}[7x33] b {}", dn(yt), dn(bt));
    c.args = {inout("y", yt, {7, 33}, randn(rng, 7 * 33)), in("b", bt, {33}, randn(rng, 33))};
    c.run = [](const std::vector<Tensor>& t) {
      ops::add_bias(t[0], t[1]);
      return std::vector<double>{};
    };
    c.tol = {1e-7, 1e-6};
    cases.push_back(std::move(c));
  }
  for (DType dt : {F, H}) {
    Case c;
    c.op = "bias_backward";
    c.label = fmt::format("dy {}[9x33]", dn(dt));
    c.args = {inout("db", F, {33}, randn(rng, 33)), in("dy", dt, {9, 33}, randn(rng, 9 * 33))};
    c.run = [](const std::vector<Tensor>& t) {
      ops::bias_backward(t[0], t[1]);
      return std::vector<double>{};
    };
    c.tol = {1e-7, 1e-6};
    cases.push_back(std::move(c));
  }

  // DoRA: row norms (double sums, another order), and the elementwise pieces (the same f32
  // operations; dm's column sums in the same order). m > 0 and norm > 0 as in a model.
  for (DType xt : {F, H}) {
    Case c;
    c.op = "row_norms";
    c.label = fmt::format("x {}[37x300]", dn(xt));
    c.args = {out("norms", F, {37}), in("x", xt, {37, 300}, randn(rng, 37 * 300))};
    c.run = [](const std::vector<Tensor>& t) {
      ops::row_norms(t[0], t[1]);
      return std::vector<double>{};
    };
    c.tol = {1e-6, 1e-6};
    cases.push_back(std::move(c));
  }
  auto positive = [&](int64_t n) {
    std::vector<float> v = randn(rng, n);
    for (float& x : v) x = 0.5f + std::fabs(x);
    return v;
  };
  for (auto [yt, mt] : {std::pair{F, F}, std::pair{H, H}}) {
    Case c;
    c.op = "dora_forward";
    c.label = fmt::format("y {}[9x33] m {}", dn(yt), dn(mt));
    c.args = {inout("y", yt, {9, 33}, randn(rng, 9 * 33)), in("z", F, {9, 33}, randn(rng, 9 * 33)),
              in("l", F, {9, 33}, randn(rng, 9 * 33)), in("m", mt, {33}, positive(33)), in("norm", F, {33}, positive(33))};
    c.run = [](const std::vector<Tensor>& t) {
      ops::dora_forward(t[0], t[1], t[2], t[3], t[4]);
      return std::vector<double>{};
    };
    c.tol = {1e-7, 1e-6};
    cases.push_back(std::move(c));
  }
  {
    Case c;
    c.op = "dora_backward";
    c.label = "dy f32[9x33]";
    c.args = {out("dz", F, {9, 33}), out("dl", F, {9, 33}), inout("dm", F, {33}, randn(rng, 33)),
              in("dy", F, {9, 33}, randn(rng, 9 * 33)), in("z", F, {9, 33}, randn(rng, 9 * 33)),
              in("l", F, {9, 33}, randn(rng, 9 * 33)), in("m", F, {33}, positive(33)), in("norm", F, {33}, positive(33))};
    c.run = [](const std::vector<Tensor>& t) {
      ops::dora_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
      return std::vector<double>{};
    };
    c.tol = {1e-7, 1e-6};
    cases.push_back(std::move(c));
  }

  // casts, bitwise, including NaN, infinities, subnormals and rounding ties (random bit patterns)
  for (DType st : {F, H, DType::F16}) {
    for (DType dt : {F, H, DType::F16}) {
      const int64_t n = 4099;
      std::vector<uint8_t> src(static_cast<size_t>(n) * dtype_size(st));
      for (size_t i = 0; i < src.size(); i += 2) {
        const uint64_t r = rng.next();
        std::memcpy(src.data() + i, &r, 2);
      }
      Case c;
      c.op = "cast";
      c.label = fmt::format("{} -> {} (random bit patterns)", dn(st), dn(dt));
      c.args = {out("dst", dt, {n}), {"src", st, {n}, Role::In, src}};
      c.run = [](const std::vector<Tensor>& t) {
        ops::cast(t[0], t[1]);
        return std::vector<double>{};
      };
      c.bitwise = true;
      c.nonfinite_ok = true;
      cases.push_back(std::move(c));
    }
  }

  // add_inplace, scale_inplace, zero
  for (auto [dt, st] : {std::pair{F, F}, std::pair{F, H}, std::pair{H, F}}) {
    Case c;
    c.op = "add_inplace";
    c.label = fmt::format("dst {} += src {} [1001]", dn(dt), dn(st));
    c.args = {inout("dst", dt, {1001}, randn(rng, 1001)), in("src", st, {1001}, randn(rng, 1001))};
    c.run = [](const std::vector<Tensor>& t) {
      ops::add_inplace(t[0], t[1]);
      return std::vector<double>{};
    };
    c.tol = {1e-7, 1e-6};
    cases.push_back(std::move(c));
  }
  for (DType dt : {F, H}) {
    Case s;
    s.op = "scale_inplace";
    s.label = fmt::format("{}[1001] *= -0.37", dn(dt));
    s.args = {inout("x", dt, {1001}, randn(rng, 1001))};
    s.run = [](const std::vector<Tensor>& t) {
      ops::scale_inplace(t[0], -0.37f);
      return std::vector<double>{};
    };
    s.tol = {1e-7, 1e-6};
    cases.push_back(std::move(s));
    Case z;
    z.op = "zero";
    z.label = fmt::format("{}[3x5]", dn(dt));
    z.args = {inout("x", dt, {3, 5}, randn(rng, 15))};
    z.run = [](const std::vector<Tensor>& t) {
      ops::zero(t[0]);
      return std::vector<double>{};
    };
    z.bitwise = true;
    cases.push_back(std::move(z));
  }

  // NF4 (ops/nf4.h): quantize, double-quantize, dequantize; bitwise (the CUDA kernels spell out the
  // CPU's f32 operations). Odd sizes, partial blocks and nested groups, an all-zero block, and
  // block scales over decades so the nested codes spread.
  for (auto [xt, n] : {std::pair{F, int64_t(64 * 700 + 33)}, std::pair{H, int64_t(4097)}, std::pair{DType::F16, int64_t(129)},
                       std::pair{F, int64_t(1)}}) {
    const int64_t blocks = (n + 63) / 64, groups = (blocks + 255) / 256, bytes = (n + 1) / 2;
    std::vector<float> x = randn(rng, n);
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] *= std::exp(float((i / 64) % 11) - 6.0f);
    if (n > 256) std::fill(x.begin() + 128, x.begin() + 192, 0.0f);  // block 2 all zero
    // The CPU's own quantization is the input of the dequantize cases (so both sides read the same
    // bytes whichever backend runs).
    std::vector<uint8_t> packed(static_cast<size_t>(bytes)), q(static_cast<size_t>(blocks));
    std::vector<float> absmax(static_cast<size_t>(blocks)), nested(static_cast<size_t>(groups)), off(1);
    {
      std::vector<uint8_t> xb = encode(x, xt);
      const Tensor xv = Tensor::view(xb.data(), xt, {n});
      ops::nf4_quantize(Tensor::view(packed.data(), DType::U8, {bytes}), Tensor::view(absmax.data(), F, {blocks}), xv);
      off[0] = ops::nf4_offset_from_sum(ops::nf4_absmax_sum(Tensor::view(absmax.data(), F, {blocks})), blocks);
      ops::nf4_quantize_absmax(Tensor::view(q.data(), DType::U8, {blocks}), Tensor::view(nested.data(), F, {groups}),
                               Tensor::view(absmax.data(), F, {blocks}), Tensor::view(off.data(), F, {1}));
    }
    {
      Case c;
      c.op = "nf4_quantize";
      c.label = fmt::format("{}[{}]", dn(xt), n);
      c.args = {out("packed", DType::U8, {bytes}), out("absmax", F, {blocks}), in("x", xt, {n}, x)};
      c.run = [](const std::vector<Tensor>& t) {
        ops::nf4_quantize(t[0], t[1], t[2]);
        return std::vector<double>{};
      };
      c.bitwise = true;
      cases.push_back(std::move(c));
    }
    {
      Case c;
      c.op = "nf4_quantize_absmax";
      c.label = fmt::format("absmax[{}]", blocks);
      c.args = {out("qabsmax", DType::U8, {blocks}), out("nested_absmax", F, {groups}), in("absmax", F, {blocks}, absmax),
                in("offset", F, {1}, off)};
      c.run = [](const std::vector<Tensor>& t) {
        ops::nf4_quantize_absmax(t[0], t[1], t[2], t[3]);
        return std::vector<double>{};
      };
      c.bitwise = true;
      cases.push_back(std::move(c));
    }
    {
      Case c;
      c.op = "nf4_dequantize_absmax";
      c.label = fmt::format("absmax[{}]", blocks);
      c.args = {out("absmax", F, {blocks}), {"qabsmax", DType::U8, {blocks}, Role::In, q}, in("nested_absmax", F, {groups}, nested),
                in("offset", F, {1}, off)};
      c.run = [](const std::vector<Tensor>& t) {
        ops::nf4_dequantize_absmax(t[0], t[1], t[2], t[3]);
        return std::vector<double>{};
      };
      c.bitwise = true;
      cases.push_back(std::move(c));
    }
    for (DType ot : {F, H, DType::F16}) {
      Case c;
      c.op = "nf4_dequantize";
      c.label = fmt::format("-> {}[{}]", dn(ot), n);
      c.args = {out("out", ot, {n}), {"packed", DType::U8, {bytes}, Role::In, packed}, in("absmax", F, {blocks}, absmax)};
      c.run = [](const std::vector<Tensor>& t) {
        ops::nf4_dequantize(t[0], t[1], t[2]);
        return std::vector<double>{};
      };
      c.bitwise = true;
      cases.push_back(std::move(c));
      Case d;
      d.op = "nf4_dequantize_nested";
      d.label = fmt::format("-> {}[{}]", dn(ot), n);
      d.args = {out("out", ot, {n}), {"packed", DType::U8, {bytes}, Role::In, packed},
                {"qabsmax", DType::U8, {blocks}, Role::In, q}, in("nested_absmax", F, {groups}, nested),
                in("offset", F, {1}, off)};
      d.run = [](const std::vector<Tensor>& t) {
        ops::nf4_dequantize_nested(t[0], t[1], t[2], t[3], t[4]);
        return std::vector<double>{};
      };
      d.bitwise = true;
      cases.push_back(std::move(d));
    }
    {
      Case c;
      c.op = "nf4_absmax_sum";
      c.label = fmt::format("absmax[{}]", blocks);
      c.args = {in("absmax", F, {blocks}, absmax)};
      c.run = [](const std::vector<Tensor>& t) { return std::vector<double>{ops::nf4_absmax_sum(t[0])}; };
      c.scalar_rtol = 0.0;
      cases.push_back(std::move(c));
    }
  }

  // sum of squares (a host double)
  for (auto [dt, n] : {std::pair{F, int64_t(300007)}, std::pair{H, int64_t(777)}}) {
    Case c;
    c.op = "sum_squares";
    c.label = fmt::format("{}[{}]", dn(dt), n);
    c.args = {in("x", dt, {n}, randn(rng, n))};
    c.run = [](const std::vector<Tensor>& t) { return std::vector<double>{ops::sum_squares(t[0])}; };
    c.scalar_rtol = 1e-12;
    cases.push_back(std::move(c));
  }
  add_large_cases(cases);
  return cases;
}

// ---- production-sized cases (built lazily; see Case::large) -----------------------------------
Case lazy(std::string op, std::string label, uint64_t seed, std::function<void(Case&, Rng&)> build) {
  Case c;
  c.op = std::move(op);
  c.label = std::move(label);
  c.large = true;
  c.build = [seed, build = std::move(build)](Case& self) {
    Rng rng(seed);
    build(self, rng);
  };
  return c;
}

std::vector<double> none() { return {}; }

void add_large_cases(std::vector<Case>& cases) {
  const DType F = DType::F32, H = DType::BF16;
  auto dn = [](DType t) { return std::string(dtype_name(t)); };
  uint64_t seed = 777;
  constexpr int64_t kPast24 = (int64_t(1) << 24) + 7;  // element counts past 2^24 (f32 counts stop being exact)

  // matmul at Llama 3.2 1B shapes (hidden 2048, MLP 8192, kv 512; 2048 tokens), 16-byte aligned
  // rows: bf16 tensor cores, beta = 1 into bf16 (residual adds) and into f32 (gradient
  // accumulators, with the f32 gradient operand rounded to bf16 on the GPU).
  struct MM {
    int64_t M, N, K;
    bool ta, tb;
    DType a, b, c;
    float beta;
  };
  for (const MM& m : {MM{2048, 512, 8192, false, true, H, H, H, 1.0f}, MM{2048, 8192, 512, false, true, H, H, H, 1.0f},
                      MM{512, 2048, 8192, true, false, F, H, F, 1.0f}, MM{2048, 512, 8192, false, false, F, H, F, 0.0f}}) {
    const std::string label = fmt::format("C {}[{}x{}] = {}A {} {}B {} K={} b={} (production)", dn(m.c), m.M, m.N,
                                          m.ta ? "T " : "", dn(m.a), m.tb ? "T " : "", dn(m.b), m.K, m.beta);
    Case c = lazy("matmul", label, ++seed, [m](Case& c, Rng& rng) {
      const float s = float(std::pow(double(m.K), -0.25));  // op(A) op(B) ~ N(0, 1)
      const std::vector<int64_t> ashape = m.ta ? std::vector<int64_t>{m.K, m.M} : std::vector<int64_t>{m.M, m.K};
      const std::vector<int64_t> bshape = m.tb ? std::vector<int64_t>{m.N, m.K} : std::vector<int64_t>{m.K, m.N};
      c.args.push_back(m.beta != 0.0f ? inout("C", m.c, {m.M, m.N}, randu(rng, m.M * m.N)) : out("C", m.c, {m.M, m.N}));
      c.args.push_back(in("A", m.a, ashape, randu(rng, m.M * m.K, s)));
      c.args.push_back(in("B", m.b, bshape, randu(rng, m.K * m.N, s)));
      c.run = [m](const std::vector<Tensor>& t) {
        ops::matmul(t[0], t[1], t[2], m.ta, m.tb, 1.0f, m.beta);
        return none();
      };
    });
    c.tol = {2e-4, 1e-4};
    if (m.a != m.b) {
      c.narrowed_rtol = kNarrowedRtol;
      c.emulate = [m](const std::vector<Tensor>& t) { return emulate_matmul(t, m.ta, m.tb, 1.0f, m.beta); };
    }
    cases.push_back(std::move(c));
  }

  // attention at T = 2048, head_dim 64 and 128 (GQA 4:2), bf16; backward from the CPU forward.
  for (const auto& shape : {std::pair<int64_t, int>{64, 0}, std::pair<int64_t, int>{128, 700}}) {
    // Named variables, not a structured binding: the lambdas below capture them (clang < 16).
    const int64_t Dh = shape.first;
    const int seg_len = shape.second;
    const int64_t B = 1, T = 2048, Hq = 4, Hkv = 2;
    const std::string label = fmt::format("bf16 B={} T={} H={} Hkv={} Dh={}{} (production)", B, T, Hq, Hkv, Dh,
                                          seg_len ? fmt::format(" segments of {}", seg_len) : "");
    const float scale = 1.0f / std::sqrt(float(Dh));
    const uint64_t s0 = ++seed;
    auto inputs = [=](Case& c, Rng& rng) {  // the same q, k, v, segments for forward and backward
      const std::vector<int64_t> qs{B, T, Hq, Dh}, ks{B, T, Hkv, Dh};
      std::vector<int32_t> seg(static_cast<size_t>(B * T));
      for (int64_t i = 0; i < B * T; ++i) seg[size_t(i)] = seg_len ? int32_t((i % T) / seg_len) : 0;
      c.args.push_back(in("q", H, qs, randu(rng, numel_of(qs))));
      c.args.push_back(in("k", H, ks, randu(rng, numel_of(ks))));
      c.args.push_back(in("v", H, ks, randu(rng, numel_of(ks))));
      c.args.push_back(in_i32("segment_ids", {B, T}, seg));
    };
    auto forward = [=](Case& c, Rng& rng) {
      c.args = {out("out", H, {B, T, Hq, Dh}), out("lse", F, {B, Hq, T})};
      inputs(c, rng);
      c.run = [seg_len, scale](const std::vector<Tensor>& t) {
        ops::attention_forward(t[0], t[1], t[2], t[3], t[4], seg_len ? t[5] : Tensor{}, scale);
        return none();
      };
    };
    Case f = lazy("attention_forward", label, s0, forward);
    f.tol = {1e-5, 1e-4};
    Case b = lazy("attention_backward", label, s0, [=](Case& c, Rng& rng) {
      Case fc;
      forward(fc, rng);
      const RunResult fwd = run_case(fc, Device::CPU);
      if (!fwd.errors.empty()) throw Error("attention forward for the backward case failed: " + fwd.errors.front());
      const std::vector<int64_t> qs{B, T, Hq, Dh}, ks{B, T, Hkv, Dh};
      c.args = {out("dq", F, qs), out("dk", F, ks), out("dv", F, ks), in("dout", H, qs, randu(rng, numel_of(qs)))};
      for (size_t i = 2; i < 6; ++i) c.args.push_back(fc.args[i]);  // q, k, v, segment_ids
      c.args.push_back({"out", H, qs, Role::In, fwd.bytes[0]});
      c.args.push_back({"lse", F, {B, Hq, T}, Role::In, fwd.bytes[1]});
      c.run = [seg_len, scale](const std::vector<Tensor>& t) {
        ops::attention_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[8], t[9], seg_len ? t[7] : Tensor{},
                                scale);
        return none();
      };
    });
    b.tol = {1e-4, 1e-3};
    cases.push_back(std::move(f));
    cases.push_back(std::move(b));
  }

  // linear + cross-entropy at Llama 3's vocabulary (V = 128256; w has 32.8M elements).
  struct CE {
    int64_t N, D;
    DType t;
    bool backward;
  };
  for (const CE& e : {CE{300, 256, H, true}, CE{64, 128, F, false}}) {
    const int64_t V = 128256, chunk = 256;
    const std::string label = fmt::format("{} N={} D={} V={} chunk={}{} (production)", dn(e.t), e.N, e.D, V, chunk,
                                          e.backward ? " with dx, dw" : " loss only");
    Case c = lazy("linear_cross_entropy", label, ++seed, [e, V, chunk](Case& c, Rng& rng) {
      std::vector<int32_t> tg(static_cast<size_t>(e.N));
      for (int64_t i = 0; i < e.N; ++i) tg[size_t(i)] = i % 5 == 2 ? ops::kIgnoreIndex : rng.below(int32_t(V));
      c.args = {in("x", e.t, {e.N, e.D}, randu(rng, e.N * e.D)),
                in("w", e.t, {V, e.D}, randu(rng, V * e.D, float(3.0 / std::sqrt(double(e.D))))),
                in_i32("targets", {e.N}, tg)};
      if (e.backward) {
        c.args.push_back(out("dx", F, {e.N, e.D}));
        c.args.push_back(inout("dw", F, {V, e.D}, randu(rng, V * e.D, 1e-3f)));
      }
      const float grad_scale = 1.0f / float(e.N);
      c.run = [bw = e.backward, chunk, grad_scale](const std::vector<Tensor>& t) {
        const ops::CrossEntropyResult r =
            ops::linear_cross_entropy(t[0], t[1], t[2], bw ? t[3] : Tensor{}, bw ? t[4] : Tensor{}, grad_scale, chunk);
        return std::vector<double>{r.loss_sum, double(r.count)};
      };
    });
    c.tol = {1e-6, 1e-4};
    c.scalar_rtol = 1e-5;
    if (e.t == H && e.backward) {
      c.narrowed_rtol = kNarrowedRtol;
      c.emulate = [chunk, N = e.N](const std::vector<Tensor>& t) {
        return emulate_bf16_cross_entropy(t, 1.0f / float(N), chunk);
      };
    }
    cases.push_back(std::move(c));
  }

  // element counts past 2^24
  const int64_t n = kPast24;
  {
    Case c = lazy("cast", fmt::format("f32 -> bf16 [{}] (past 2^24)", n), ++seed, [n](Case& c, Rng& rng) {
      c.args = {out("dst", DType::BF16, {n}), in("src", DType::F32, {n}, randu(rng, n))};
      c.run = [](const std::vector<Tensor>& t) {
        ops::cast(t[0], t[1]);
        return none();
      };
    });
    c.bitwise = true;
    cases.push_back(std::move(c));
  }
  {
    Case c = lazy("add_inplace", fmt::format("dst f32 += src bf16 [{}] (past 2^24)", n), ++seed, [n](Case& c, Rng& rng) {
      c.args = {inout("dst", DType::F32, {n}, randu(rng, n)), in("src", DType::BF16, {n}, randu(rng, n))};
      c.run = [](const std::vector<Tensor>& t) {
        ops::add_inplace(t[0], t[1]);
        return none();
      };
    });
    c.tol = {1e-7, 1e-6};
    cases.push_back(std::move(c));
  }
  {
    Case c = lazy("scale_inplace", fmt::format("bf16[{}] *= -0.37 (past 2^24)", n), ++seed, [n](Case& c, Rng& rng) {
      c.args = {inout("x", DType::BF16, {n}, randu(rng, n))};
      c.run = [](const std::vector<Tensor>& t) {
        ops::scale_inplace(t[0], -0.37f);
        return none();
      };
    });
    c.tol = {1e-7, 1e-6};
    cases.push_back(std::move(c));
  }
  {
    Case c = lazy("sum_squares", fmt::format("f32[{}] (past 2^24)", n), ++seed, [n](Case& c, Rng& rng) {
      c.args = {in("x", DType::F32, {n}, randu(rng, n))};
      c.run = [](const std::vector<Tensor>& t) { return std::vector<double>{ops::sum_squares(t[0])}; };
    });
    c.scalar_rtol = 1e-12;
    cases.push_back(std::move(c));
  }
  {
    Case c = lazy("adamw_step", fmt::format("n={} step=10 wd=0.1 (past 2^24)", n), ++seed, [n](Case& c, Rng& rng) {
      std::vector<float> v = randu(rng, n, 0.01f);
      for (float& x : v) x = std::fabs(x);
      c.args = {inout("param", DType::F32, {n}, randu(rng, n)), in("grad", DType::F32, {n}, randu(rng, n)),
                inout("m", DType::F32, {n}, randu(rng, n, 0.1f)), inout("v", DType::F32, {n}, v)};
      c.run = [](const std::vector<Tensor>& t) {
        ops::AdamWConfig cfg;
        cfg.lr = 3e-3;
        cfg.weight_decay = 0.1;
        ops::adamw_step(t[0], t[1], t[2], t[3], cfg, 10, 0.5f);
        return none();
      };
    });
    c.tol = {1e-7, 1e-6};
    cases.push_back(std::move(c));
  }
  const int64_t rows = 8193, D = 2048;  // [8193, 2048]: 16.78M elements
  {
    Case f = lazy("swiglu_forward", fmt::format("bf16 [{}x{}] (past 2^24)", rows, D), ++seed, [=](Case& c, Rng& rng) {
      c.args = {out("out", H, {rows, D}), in("gate", H, {rows, D}, randu(rng, rows * D, 3.0f)),
                in("up", H, {rows, D}, randu(rng, rows * D))};
      c.run = [](const std::vector<Tensor>& t) {
        ops::swiglu_forward(t[0], t[1], t[2]);
        return none();
      };
    });
    f.tol = {1e-6, 1e-5};
    cases.push_back(std::move(f));
    Case b = lazy("swiglu_backward", fmt::format("bf16 in, f32 grads [{}x{}] (past 2^24)", rows, D), ++seed,
                  [=](Case& c, Rng& rng) {
                    c.args = {out("dgate", F, {rows, D}), out("dup", F, {rows, D}),
                              in("dout", F, {rows, D}, randu(rng, rows * D)),
                              in("gate", H, {rows, D}, randu(rng, rows * D, 3.0f)),
                              in("up", H, {rows, D}, randu(rng, rows * D))};
                    c.run = [](const std::vector<Tensor>& t) {
                      ops::swiglu_backward(t[0], t[1], t[2], t[3], t[4]);
                      return none();
                    };
                  });
    b.tol = {1e-6, 1e-5};
    cases.push_back(std::move(b));
  }
  {
    Case f = lazy("rmsnorm_forward", fmt::format("bf16 [{}x{}] (past 2^24)", rows, D), ++seed, [=](Case& c, Rng& rng) {
      c.args = {out("y", H, {rows, D}), out("rstd", F, {rows}), in("x", H, {rows, D}, randu(rng, rows * D)),
                in("w", H, {D}, randu(rng, D))};
      c.run = [](const std::vector<Tensor>& t) {
        ops::rmsnorm_forward(t[0], t[1], t[2], t[3], 1e-5f);
        return none();
      };
    });
    f.tol = {1e-5, 1e-5};
    cases.push_back(std::move(f));
    Case b = lazy("rmsnorm_backward", fmt::format("bf16 x, f32 dy/dx [{}x{}] (past 2^24)", rows, D), ++seed,
                  [=](Case& c, Rng& rng) {
                    std::vector<float> rstd(static_cast<size_t>(rows));
                    for (float& v : rstd) v = float(0.5 + 1.5 * rng.uniform());
                    c.args = {out("dx", F, {rows, D}), inout("dw", F, {D}, randu(rng, D)),
                              in("dy", F, {rows, D}, randu(rng, rows * D)), in("x", H, {rows, D}, randu(rng, rows * D)),
                              in("w", H, {D}, randu(rng, D)), in("rstd", F, {rows}, rstd)};
                    c.run = [](const std::vector<Tensor>& t) {
                      ops::rmsnorm_backward(t[0], t[1], t[2], t[3], t[4], t[5]);
                      return none();
                    };
                  });
    b.tol = {1e-5, 1e-4};
    cases.push_back(std::move(b));
  }
  {
    const int64_t T = 2049, Hh = 64, Dh = 128;  // [1, 2049, 64, 128]: 16.79M elements
    Case c = lazy("rope_forward", fmt::format("bf16 [1x{}x{}x{}] (past 2^24)", T, Hh, Dh), ++seed,
                  [=](Case& c, Rng& rng) {
                    std::vector<int32_t> pos(static_cast<size_t>(T));
                    for (int64_t i = 0; i < T; ++i) pos[size_t(i)] = int32_t(i);
                    const std::vector<int64_t> shape{1, T, Hh, Dh};
                    c.args = {out("out", H, shape), in("x", H, shape, randu(rng, numel_of(shape))),
                              in_i32("positions", {1, T}, pos), in("inv_freq", F, {Dh / 2}, ops::rope_inv_freq(Dh, 500000.0f, {}))};
                    c.run = [](const std::vector<Tensor>& t) {
                      ops::rope_forward(t[0], t[1], t[2], t[3]);
                      return none();
                    };
                  });
    c.tol = {1e-5, 1e-5};
    cases.push_back(std::move(c));
  }
  {
    const int64_t V = 16384;  // weight [16384, 2048]: 33.5M elements
    Case f = lazy("embedding_forward", fmt::format("weight bf16[{}x{}] -> out bf16 N={} (past 2^24)", V, D, rows), ++seed,
                  [=](Case& c, Rng& rng) {
                    std::vector<int32_t> ids(static_cast<size_t>(rows));
                    for (auto& id : ids) id = rng.below(int32_t(V));
                    c.args = {out("out", H, {rows, D}), in("weight", H, {V, D}, randu(rng, V * D)), in_i32("ids", {rows}, ids)};
                    c.run = [](const std::vector<Tensor>& t) {
                      ops::embedding_forward(t[0], t[1], t[2]);
                      return none();
                    };
                  });
    cases.push_back(std::move(f));
    Case b = lazy("embedding_backward", fmt::format("dout f32[{}x{}] into dweight f32[{}x{}] (past 2^24)", rows, D, V, D),
                  ++seed, [=](Case& c, Rng& rng) {
                    std::vector<int32_t> ids(static_cast<size_t>(rows));
                    for (auto& id : ids) id = rng.below(1000);  // repeats
                    c.args = {inout("dweight", F, {V, D}, randu(rng, V * D)), in("dout", F, {rows, D}, randu(rng, rows * D)),
                              in_i32("ids", {rows}, ids)};
                    c.run = [](const std::vector<Tensor>& t) {
                      ops::embedding_backward(t[0], t[1], t[2]);
                      return none();
                    };
                  });
    b.tol = {1e-7, 1e-6};
    cases.push_back(std::move(b));
  }
  {
    Case c = lazy("dropout", fmt::format("bf16 [{}x{}] p=0.1 in place (past 2^24)", rows, D), ++seed,
                  [=](Case& c, Rng& rng) {
                    c.args = {inout("x", H, {rows, D}, randu(rng, rows * D))};
                    c.run = [](const std::vector<Tensor>& t) {
                      ops::dropout(t[0], t[0], 0.1f, 0x5eedull << 32 | 7, ~0ull - 1);
                      return none();
                    };
                  });
    c.bitwise = true;
    cases.push_back(std::move(c));
  }
  {
    Case c = lazy("bias_backward", fmt::format("dy bf16[{}x{}] (past 2^24)", rows, D), ++seed, [=](Case& c, Rng& rng) {
      c.args = {inout("db", F, {D}, randu(rng, D)), in("dy", H, {rows, D}, randu(rng, rows * D))};
      c.run = [](const std::vector<Tensor>& t) {
        ops::bias_backward(t[0], t[1]);
        return none();
      };
    });
    c.tol = {1e-7, 1e-6};
    cases.push_back(std::move(c));
  }
}

// ---- the harness checks itself ----------------------------------------------------------------
// The comparison must fail on a perturbed output and on a NaN, and the guards must catch a write
// one element past the end. Returns the failures (empty when the harness works).
std::vector<std::string> self_check(const Case& c, const RunResult& ref) {
  std::vector<std::string> bad;
  size_t k = 0;
  while (k < c.args.size() && c.args[k].role == Role::In) ++k;
  const Arg& a = c.args.at(k);
  if (a.dtype != DType::F32) throw Error("self_check: the first output must be f32");
  if (!compare(c, ref, ref).empty()) bad.push_back("the reference does not match itself");
  RunResult perturbed = ref;
  float v;
  std::memcpy(&v, perturbed.bytes[k].data() + 4 * 3, 4);
  double written = 0.0;  // the bf16 policy's allowance (compare()), when the case has one
  for (int64_t i = 0; c.narrowed_rtol > 0.0 && i < numel_of(a.shape); ++i) {
    const double before = a.role == Role::InOut ? element(a.init, a.dtype, i) : 0.0;
    written = std::max(written, std::fabs(element(ref.bytes[k], a.dtype, i) - before));
  }
  v += float(10 * (c.tol.atol + c.tol.rtol * std::fabs(v) + c.narrowed_rtol * written)) + 1e-3f;
  std::memcpy(perturbed.bytes[k].data() + 4 * 3, &v, 4);
  if (compare(c, perturbed, ref).empty()) bad.push_back("a perturbed output was not detected");
  RunResult nan = ref;
  const float qnan = std::nanf("");
  std::memcpy(nan.bytes[k].data(), &qnan, 4);
  if (compare(c, nan, ref).empty()) bad.push_back("a NaN output was not detected");

  // An op that writes one element past the end of its output: zero() on a view one element longer.
  Case rogue;
  rogue.op = "rogue";
  rogue.args = {out("x", DType::F32, {16})};
  rogue.run = [](const std::vector<Tensor>& t) {
    ops::zero(Tensor::view(t[0].data, DType::F32, {17}, t[0].device));
    return std::vector<double>{};
  };
  const RunResult r = run_case(rogue, Device::CPU);
  if (r.errors.empty() || r.errors.front().find("guard byte 0 after") == std::string::npos)
    bad.push_back("an out-of-bounds write was not caught by the guard bytes");
  return bad;
}

constexpr int kSkipped = 77;  // ctest's SKIP_RETURN_CODE

// which: "cpu", "cuda" or "" (every backend available here).
int run_all(const std::string& which) {
  std::string why;
  const bool have_cuda = device::cuda_available(&why);
  if (which == "cuda" && !have_cuda) {
    fmt::print("backend_ops: SKIPPED: the CUDA backend cannot be tested here: {}\n", why);
    return kSkipped;
  }
  std::vector<Device> backends;  // CPU against itself: the harness's own checks
  if (which != "cuda") backends.push_back(Device::CPU);
  if (which != "cpu" && have_cuda) backends.push_back(Device::CUDA);

  // The reference is the exact f32 path; the bf16 path is switched on only for its own runs.
  const ops::CpuBf16Status bf16 = ops::cpu_bf16_status();
  const bool test_bf16 = which != "cuda" && bf16.hardware;
  ops::set_cpu_bf16_enabled(false);
  // Attention takes the bf16 path only with bf16 inputs (its block products, ops/cpu/attention.cpp).
  auto attention_on_bf16 = [](const Case& c) {
    return c.op.rfind("attention_", 0) == 0 && c.label.rfind("bf16 ", 0) == 0;
  };
  auto uses_bf16_path = [&](const Case& c) {
    return c.op == "matmul" || c.op == "linear_cross_entropy" || attention_on_bf16(c);
  };

  const char* large_env = std::getenv("SHARDLM_BACKEND_OPS_LARGE");
  const bool run_large = have_cuda || (large_env && std::string(large_env) == "1");

  std::vector<Case> cases = make_cases();
  int failures = 0, checks = 0, skipped = 0;
  bool self_checked = false, narrowed_checked = false;
  for (Case& c : cases) {
    if (c.large && !run_large) {
      ++skipped;
      continue;
    }
    if (c.build) {
      try {
        c.build(c);
      } catch (const std::exception& e) {
        fmt::print("FAIL building {} {}: {}\n", c.op, c.label, e.what());
        ++failures;
        continue;
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    const RunResult ref = run_case(c, Device::CPU);
    const double ref_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!self_checked && c.op == "matmul") {
      for (const std::string& e : self_check(c, ref)) {
        fmt::print("FAIL harness self-check: {}\n", e);
        ++failures;
      }
      self_checked = true;
    }
    if (c.emulate) {  // the stated tolerance must cover the CUDA policy's roundings
      Case e = c;
      e.run = c.emulate;
      const std::string err = compare(c, run_case(e, Device::CPU), ref);
      ++checks;
      fmt::print("{} {:<5} {:<21} {}: the CUDA bf16 policy emulated on the CPU{}\n", err.empty() ? "ok  " : "FAIL",
                 "cpu", c.op, c.label, err.empty() ? "" : ": " + err);
      if (!err.empty()) ++failures;
      if (!narrowed_checked && c.op == "matmul") {  // and it still catches a real error
        for (const std::string& x : self_check(c, ref)) {
          fmt::print("FAIL harness self-check (bf16 policy tolerance): {}\n", x);
          ++failures;
        }
        narrowed_checked = true;
      }
    }
    for (Device dev : backends) {
      // A large case's CPU-against-itself run only repeats seconds of CPU work when a GPU is there.
      if (c.large && dev == Device::CPU && have_cuda) continue;
      const RunResult got = run_case(c, dev);
      const std::string err = compare(c, got, ref);
      ++checks;
      const std::string timing = c.large ? fmt::format(" [cpu reference {:.1f} s]", ref_s) : "";
      if (err.empty()) {
        fmt::print("ok   {:<5} {:<21} {}{}\n", device_name(dev), c.op, c.label, timing);
      } else {
        fmt::print("FAIL {:<5} {:<21} {}: {}{}\n", device_name(dev), c.op, c.label, err, timing);
        ++failures;
      }
    }
    if (test_bf16 && uses_bf16_path(c)) {
      ops::set_cpu_bf16_enabled(true);
      const RunResult got = run_case(c, Device::CPU);
      ops::set_cpu_bf16_enabled(false);
      // Attention's probabilities are rounded to bf16 before their products there: one operand's
      // bf16 rounding, the tolerance of the CUDA bf16 policy.
      const double stated = c.narrowed_rtol;
      if (attention_on_bf16(c)) c.narrowed_rtol = std::max(c.narrowed_rtol, kNarrowedRtol);
      const std::string err = compare(c, got, ref);
      c.narrowed_rtol = stated;
      ++checks;
      fmt::print("{} {:<8} {:<21} {}{}\n", err.empty() ? "ok  " : "FAIL", "cpu-bf16", c.op, c.label,
                 err.empty() ? "" : ": " + err);
      if (!err.empty()) ++failures;
    }
    if (c.build) c.args = {};  // a large case's tensors are freed before the next one is built
  }
  if (!self_checked) {
    fmt::print("FAIL harness self-check did not run\n");
    ++failures;
  }
  if (which.empty() && !have_cuda)
    fmt::print("backend_ops: CUDA backend not tested: {}; only the CPU backend ran through the harness\n", why);
  if (skipped > 0)
    fmt::print("backend_ops: {} production-sized cases not run (they run when a GPU is present, or with "
               "SHARDLM_BACKEND_OPS_LARGE=1)\n", skipped);
  if (which != "cuda" && !test_bf16) fmt::print("backend_ops: cpu-bf16 not tested: {}\n", bf16.line);
  std::string names;
  for (Device dev : backends) names += std::string(names.empty() ? "" : ", ") + device_name(dev);
  if (test_bf16) names += ", cpu-bf16";
  fmt::print("backend_ops: {} cases, {} backend runs, {} failures (backends: {})\n", cases.size(), checks, failures,
             names);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "";
  if (argc > 2 || (which != "" && which != "cpu" && which != "cuda")) {
    fmt::print("usage: backend_ops_test [cpu|cuda]\n");
    return 2;
  }
  try {
    return shardlm::run_all(which);
  } catch (const std::exception& e) {
    fmt::print("backend_ops: error: {}\n", e.what());
    return 1;
  }
}
