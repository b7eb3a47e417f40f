// Parity of ops::dropout with PyTorch (tests/torch_ref/ref_dropout.py): the mask is recomputed
// there by an independent Philox4x32-10 (numpy), and torch applies it with its own dropout
// arithmetic (noise = keep.div_(1 - p), x * noise). Everything is compared bit for bit: the mask,
// f32 outputs (f32 or bf16 x), and bf16 outputs (the f32 result rounded once).
#include <gtest/gtest.h>

#include <cstring>

#include "core/rng.h"
#include "ops/ops.h"
#include "testing.h"

using namespace shardlm;
using namespace shardlm::testing;

TEST(Parity, Dropout) {
  for (const RefCase& c : load_ref_cases("dropout")) {
    const int64_t n = c.params["n"], d = c.params["d"];
    const float p = float(c.params["p"].get<double>());
    const uint64_t key = c.params["key"].get<uint64_t>(), stream = c.params["stream"].get<uint64_t>();
    const bool bf16 = c.params["dtype"] == "bf16";
    const NpyArray xa = c.array("x");
    std::vector<float> xf;
    std::vector<uint16_t> xh;
    Tensor x;
    if (bf16) {
      xh = xa.u16();
      x = Tensor::view(xh.data(), DType::BF16, {n, d});
    } else {
      xf = xa.f32();
      x = view(xf, {n, d});
    }

    // The mask: shardlm's Philox draws against the independent implementation.
    const std::vector<int32_t> keep = c.i32("keep");
    int64_t bad_mask = 0;
    for (int64_t i = 0; i < n * d; ++i) bad_mask += (rng_uniform(key, stream, uint64_t(i)) >= p) != (keep[size_t(i)] != 0);
    EXPECT_EQ(bad_mask, 0) << c.name << ": mask elements differing from the reference's Philox";

    const std::vector<float> want = c.f32("out");
    const std::vector<uint16_t> want_bf16 = c.array("out_bf16").u16();
    std::vector<float> out(size_t(n * d), NAN);
    ops::dropout(view(out, {n, d}), x, p, key, stream);
    EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * 4), 0) << c.name << ": f32 out";
    EXPECT_TRUE(all_close(out, want, 0, 0, c.name + " f32 out"));  // names the first difference

    std::vector<bf16_t> outh(size_t(n * d));
    ops::dropout(Tensor::view(outh.data(), DType::BF16, {n, d}), x, p, key, stream);
    int64_t bad_bf16 = 0;
    for (size_t i = 0; i < outh.size(); ++i) bad_bf16 += outh[i].bits != want_bf16[i];
    EXPECT_EQ(bad_bf16, 0) << c.name << ": bf16 out elements differing from torch";

    // In place on x's own dtype: the same bits as out of place.
    if (bf16) {
      std::vector<uint16_t> y = xh;
      ops::dropout(Tensor::view(y.data(), DType::BF16, {n, d}), Tensor::view(y.data(), DType::BF16, {n, d}), p, key,
                   stream);
      EXPECT_EQ(std::memcmp(y.data(), want_bf16.data(), y.size() * 2), 0) << c.name << ": bf16 in place";
    } else {
      std::vector<float> y = xf;
      ops::dropout(view(y, {n, d}), view(y, {n, d}), p, key, stream);
      EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * 4), 0) << c.name << ": f32 in place";
    }
  }
}
