// The meta device (core/alloc.h): buffers with sizes and no memory, seen in order by a
// MetaObserver; ops that check their arguments and skip the math, but make the scratch their CPU
// kernel makes. The memory estimator runs the engine and the model on it, so what it counts must
// be what the CPU allocates (the estimator against measured runs: test_memory.cpp and
// tests/mpi/memory_test.cpp).
#include <gtest/gtest.h>

#include <vector>

#include "core/alloc.h"
#include "core/device.h"
#include "cpu_paths.h"
#include "ops/cpu_bf16.h"
#include "ops/ops.h"

using namespace shardlm;

namespace {

// Live and peak bytes of what it observed, by category, and each event's tag.
struct Recorder final : MetaObserver {
  int64_t live = 0, peak = 0;
  std::vector<MemTag> tags;
  int frees = 0;
  void on_alloc(const Buffer& b) override {
    live += int64_t(b.bytes());
    peak = std::max(peak, live);
    tags.push_back(b.tag());
  }
  void on_free(const Buffer& b) override {
    live -= int64_t(b.bytes());
    ++frees;
  }
};

// The Workspace bytes the CPU tracker's peak rose by while `f` ran.
template <class F>
int64_t cpu_workspace_peak(F f) {
  MemoryTracker& t = MemoryTracker::for_device(Device::CPU);
  const int64_t before = t.stats().live[int(MemCategory::Workspace)];
  t.reset_peaks();
  f();
  return t.stats().peak[int(MemCategory::Workspace)] - before;
}

OwnedTensor make(DType dtype, std::initializer_list<int64_t> shape, Device device) {
  return OwnedTensor(dtype, shape, MemCategory::Other, /*zero=*/true, device);
}

}  // namespace

TEST(MetaDevice, BuffersHaveSizesNotMemoryAndAreObservedInOrder) {
  Recorder rec;
  const int64_t tracked = MemoryTracker::for_device(Device::Meta).stats().live[int(MemCategory::Gradients)];
  {
    const ObserveMeta observe(rec);
    Buffer a(1 << 30, MemCategory::Gradients, /*zero=*/true, Device::Meta, /*tag=*/7);  // 1 GiB, nothing touched
    EXPECT_NE(a.data(), nullptr);
    EXPECT_FALSE(a.empty());
    EXPECT_EQ(a.device(), Device::Meta);
    EXPECT_EQ(MemoryTracker::for_device(Device::Meta).stats().live[int(MemCategory::Gradients)], tracked + (1 << 30));
    Buffer moved = std::move(a);  // a move is not an allocation
    Buffer none(0, MemCategory::Gradients, true, Device::Meta);  // nothing, as on the CPU
    EXPECT_EQ(rec.tags, std::vector<MemTag>{7});
    EXPECT_EQ(rec.live, int64_t(1) << 30);
  }
  EXPECT_EQ(rec.live, 0);
  EXPECT_EQ(rec.frees, 1);
  EXPECT_EQ(MemoryTracker::for_device(Device::Meta).stats().live[int(MemCategory::Gradients)], tracked);
  // Without an observer, meta buffers are only tracked.
  Buffer b(64, MemCategory::Other, true, Device::Meta);
  EXPECT_EQ(rec.tags.size(), 1u);
  // Each buffer has an address range of its own: ops refuse overlapping arguments.
  Buffer next(16, MemCategory::Other, true, Device::Meta);
  EXPECT_GE(static_cast<char*>(next.data()), static_cast<char*>(b.data()) + b.bytes());
}

TEST(MetaDevice, CopiesToAndFromItMoveNothing) {
  std::vector<float> host{1, 2, 3};
  const OwnedTensor m = make(DType::F32, {3}, Device::Meta);
  const Tensor h = Tensor::view(host.data(), DType::F32, {3});
  device::copy(m.t, h);
  device::copy(h, m.t);
  EXPECT_EQ(host, (std::vector<float>{1, 2, 3}));
}

TEST(MetaDevice, OpsCheckTheirArgumentsAndReturnEmptyResults) {
  const OwnedTensor a = make(DType::F32, {4, 8}, Device::Meta), b = make(DType::F32, {8, 5}, Device::Meta);
  const OwnedTensor c = make(DType::F32, {4, 5}, Device::Meta), wrong = make(DType::F32, {4, 6}, Device::Meta);
  ops::matmul(c, a, b);
  EXPECT_THROW(
      {
        try {
          ops::matmul(wrong, a, b);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("matmul: C: expected shape [4, 5]"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  EXPECT_EQ(ops::sum_squares(a), 0.0);
  // Mixing devices is refused as between the CPU and a GPU.
  const OwnedTensor cpu = make(DType::F32, {8, 5}, Device::CPU);
  EXPECT_THROW(ops::matmul(c, a, cpu), Error);
  const OwnedTensor x = make(DType::F32, {6, 8}, Device::Meta), w = make(DType::F32, {10, 8}, Device::Meta);
  const OwnedTensor targets = make(DType::I32, {6}, Device::Meta), dx = make(DType::F32, {6, 8}, Device::Meta);
  const ops::CrossEntropyResult r = ops::linear_cross_entropy(x, w, targets, dx, Tensor{}, 1.0f, 4);
  EXPECT_EQ(r.loss_sum, 0.0);
  EXPECT_EQ(r.count, 0);
}

// What a meta op counts is what its CPU kernel allocates: the bf16 widening of matmul, the logits
// chunk and widened copies of the fused cross-entropy; on the CPU's bf16 path (ops/cpu_bf16.h),
// where this CPU has one, the bf16 copies of f32 operands and of the dlogits instead.
TEST(MetaDevice, ScratchIsTheCpuKernelsScratch) {
  for (const bool bf16_path : shardlm::testing::cpu_paths()) {
    const shardlm::testing::CpuPath on_path(bf16_path);
    SCOPED_TRACE(bf16_path ? "bf16 path" : "f32 path");
    struct Case {
      DType a, b, c;
      bool ta, tb;
    };
    for (const Case k : {Case{DType::BF16, DType::BF16, DType::BF16, false, true}, Case{DType::F32, DType::BF16, DType::F32, true, false},
                         Case{DType::BF16, DType::F32, DType::BF16, false, false}, Case{DType::F32, DType::F32, DType::F32, false, true}}) {
      const int64_t M = 33, K = 17, N = 9;
      auto shape_a = [&](Device d) { return k.ta ? make(k.a, {K, M}, d) : make(k.a, {M, K}, d); };
      auto shape_b = [&](Device d) { return k.tb ? make(k.b, {N, K}, d) : make(k.b, {K, N}, d); };
      const OwnedTensor A = shape_a(Device::CPU), B = shape_b(Device::CPU), C = make(k.c, {M, N}, Device::CPU);
      const int64_t cpu = cpu_workspace_peak([&] { ops::matmul(C, A, B, k.ta, k.tb); });
      const OwnedTensor mA = shape_a(Device::Meta), mB = shape_b(Device::Meta), mC = make(k.c, {M, N}, Device::Meta);
      Recorder rec;
      {
        const ObserveMeta observe(rec);
        ops::matmul(mC, mA, mB, k.ta, k.tb);
      }
      EXPECT_EQ(rec.peak, cpu) << dtype_name(k.a) << " " << dtype_name(k.b) << " " << dtype_name(k.c);
      EXPECT_EQ(rec.live, 0);
    }
    for (const DType dt : {DType::F32, DType::BF16}) {
      for (const bool backward : {true, false}) {
        SCOPED_TRACE(backward ? "with backward" : "loss only");
        const int64_t N = 70, D = 16, V = 300, chunk = 32;
        std::vector<int32_t> ids(size_t(N), 3);
        const Tensor targets = Tensor::view(ids.data(), DType::I32, {N});
        const OwnedTensor x = make(dt, {N, D}, Device::CPU), w = make(dt, {V, D}, Device::CPU);
        const OwnedTensor dx = make(DType::F32, {N, D}, Device::CPU), dw = make(DType::F32, {V, D}, Device::CPU);
        const int64_t cpu = cpu_workspace_peak([&] {
          ops::linear_cross_entropy(x, w, targets, backward ? Tensor(dx) : Tensor{}, backward ? Tensor(dw) : Tensor{},
                                    1.0f, chunk);
        });
        const OwnedTensor mx = make(dt, {N, D}, Device::Meta), mw = make(dt, {V, D}, Device::Meta);
        const OwnedTensor mdx = make(DType::F32, {N, D}, Device::Meta), mdw = make(DType::F32, {V, D}, Device::Meta);
        Tensor mt = targets;
        mt.device = Device::Meta;
        Recorder rec;
        {
          const ObserveMeta observe(rec);
          ops::linear_cross_entropy(mx, mw, mt, backward ? Tensor(mdx) : Tensor{}, backward ? Tensor(mdw) : Tensor{},
                                    1.0f, chunk);
        }
        EXPECT_EQ(rec.peak, cpu) << dtype_name(dt);
        EXPECT_GE(rec.peak, chunk * V * 4);  // at least the logits chunk
        for (MemTag t : rec.tags) EXPECT_EQ(t, mem_tag::kLossScratch);
      }
    }
  }
}

// The step-time model charges the memory-bound ops by the bytes they move (memory/step_time.h):
// each tensor they read and each they write, one updated in place twice. Matmuls report FLOPs and
// no bytes; ops on the CPU report nothing.
TEST(MetaDevice, MemoryBoundOpsReportTheBytesTheyMove) {
  struct Traffic final : MetaObserver {
    double bytes = 0, flops = 0;
    void on_alloc(const Buffer&) override {}
    void on_free(const Buffer&) override {}
    void on_traffic(double b) override { bytes += b; }
    void on_flops(double f) override { flops += f; }
  };
  const int64_t n = 1000;
  auto meta = [&](DType dt) { return make(dt, {n}, Device::Meta); };
  auto moved = [](auto op) {
    Traffic t;
    {
      const ObserveMeta observe(t);
      op();
    }
    EXPECT_EQ(t.flops, 0.0);
    return t.bytes;
  };
  const OwnedTensor p = meta(DType::F32), g = meta(DType::F32), m = meta(DType::F32), v = meta(DType::F32);
  const OwnedTensor b = meta(DType::BF16), mb = meta(DType::BF16), vb = meta(DType::BF16);
  EXPECT_EQ(moved([&] { ops::cast(b, p); }), double(n * (2 + 4)));
  EXPECT_EQ(moved([&] { ops::add_inplace(p, b); }), double(n * (4 + 4 + 2)));
  EXPECT_EQ(moved([&] { ops::zero(g); }), double(n * 4));
  EXPECT_EQ(moved([&] { ops::scale_inplace(b, 0.5f); }), double(n * (2 + 2)));
  EXPECT_EQ(moved([&] { ops::sum_squares(b); }), double(n * 2));
  // AdamW reads the gradient and updates the parameter and both moments in place.
  EXPECT_EQ(moved([&] { ops::adamw_step(p, g, m, v, {}, 1, 1.0f); }), double(n * 4 * 7));
  EXPECT_EQ(moved([&] { ops::adamw_step(p, g, mb, vb, {}, 1, 1.0f); }), double(n * (4 * 3 + 2 * 4)));
  const OwnedTensor x = make(DType::F32, {10, 100}, Device::Meta), y = make(DType::F32, {10, 100}, Device::Meta);
  const OwnedTensor w = make(DType::F32, {100}, Device::Meta), rstd = make(DType::F32, {10}, Device::Meta);
  EXPECT_EQ(moved([&] { ops::rmsnorm_forward(y, rstd, x, w, 1e-5f); }), double(2 * 10 * 100 * 4));
  // A matmul's work is FLOPs, not bytes.
  Traffic mm;
  {
    const ObserveMeta observe(mm);
    const OwnedTensor A = make(DType::F32, {4, 8}, Device::Meta), B = make(DType::F32, {8, 5}, Device::Meta);
    const OwnedTensor C = make(DType::F32, {4, 5}, Device::Meta);
    ops::matmul(C, A, B);
  }
  EXPECT_EQ(mm.bytes, 0.0);
  EXPECT_EQ(mm.flops, 2.0 * 4 * 5 * 8);
  // On the CPU the same op is computed, not counted.
  const OwnedTensor cp = make(DType::F32, {n}, Device::CPU), cb = make(DType::BF16, {n}, Device::CPU);
  EXPECT_EQ(moved([&] { ops::cast(cb.t, cp.t); }), 0.0);
}

