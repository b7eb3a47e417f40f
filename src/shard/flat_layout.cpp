#include "shard/flat_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "io/model_files.h"
#include "ops/ops.h"

namespace shardlm::shard {

FlatLayout make_flat_layout(const std::string& name, const std::vector<model::ParamInfo>& params, int64_t divisor,
                            int64_t align) {
  SHARDLM_CHECK(divisor >= 1 && align >= 1, "flat layout divisor and alignment must be >= 1, got {} and {}", divisor,
                align);
  FlatLayout f;
  f.unit_name = name;
  int64_t end = 0;
  for (const model::ParamInfo& p : params) {
    const int64_t at = (end + align - 1) / align * align;
    f.entries.push_back({p, at});
    f.numel += p.numel();
    end = at + p.numel();
  }
  f.padded_numel = (end + divisor - 1) / divisor * divisor;
  return f;
}

void init_flat_range(const FlatLayout& layout, int64_t begin, int64_t end, uint64_t seed, float std, float* out) {
  for_each_overlap(layout, begin, end, [&](const FlatEntry& e, int64_t lo, int64_t hi) {
    float* p = out + (lo - begin);
    const int64_t n = hi - lo;
    switch (e.info.init) {
      case model::Init::Normal:
        fill_normal(p, n, seed, e.info.name, uint64_t(lo - e.offset), 0.0f, std);
        break;
      case model::Init::Ones:
        std::fill(p, p + n, 1.0f);
        break;
      case model::Init::Zeros:
        std::fill(p, p + n, 0.0f);
        break;
      case model::Init::LoraKaiming: {  // A [r, in]: kaiming_uniform_(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in))
        const float bound = 1.0f / std::sqrt(float(e.info.shape.at(1)));
        fill_uniform(p, n, seed, e.info.name, uint64_t(lo - e.offset), -bound, bound);
        break;
      }
      case model::Init::DoraMagnitude:  // the row norms of its base weight: load.cpp fills it (fill_dora_magnitudes)
        std::fill(p, p + n, 0.0f);
        break;
      case model::Init::LoraGaussian:  // A [r, in]: normal_(std = 1 / r)
        fill_normal(p, n, seed, e.info.name, uint64_t(lo - e.offset), 0.0f, 1.0f / float(e.info.shape.at(0)));
        break;
    }
  });
}

void load_flat_range(const FlatLayout& layout, int64_t begin, int64_t end, const io::ModelWeights& weights,
                     const std::string& source, float* out) {
  for (const FlatEntry& e : layout.entries) {
    if (!weights.has(e.info.name)) throw Error("missing from the model weights", {.file = source, .tensor = e.info.name});
    weights.float_info(e.info.name, e.info.shape);
  }
  // Read in bounded pieces through one tracked staging buffer: a shard of a large embedding in the
  // file's dtype would otherwise be an untracked copy of hundreds of MiB.
  constexpr int64_t kPiece = int64_t(1) << 20;  // elements
  Buffer tmp;
  for_each_overlap(layout, begin, end, [&](const FlatEntry& e, int64_t lo, int64_t hi) {
    const DType file_dtype = *weights.info(e.info.name).dtype;
    const size_t need = size_t(std::min(kPiece, hi - lo)) * dtype_size(file_dtype);
    if (tmp.bytes() < need) tmp = Buffer(need, MemCategory::Workspace, false);
    for (int64_t a = lo; a < hi; a += kPiece) {
      const int64_t n = std::min(kPiece, hi - a);
      weights.read_range(e.info.name, uint64_t(a - e.offset), uint64_t(n), tmp.data());
      float* got = out + (a - begin);
      ops::cast(Tensor::view(got, DType::F32, {n}), Tensor::view(tmp.data(), file_dtype, {n}));
      // A NaN or Inf in the weights would only show as a non-finite loss steps later.
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(got[i]))
          throw Error(fmt::format("element {} is {}: the weights hold a non-finite value", a - e.offset + i, got[i]),
                      {.file = source, .tensor = e.info.name});
    }
  });
}

void check_no_extra_tensors(const std::vector<const FlatLayout*>& layouts, const io::ModelWeights& weights,
                            const std::string& source) {
  std::set<std::string> known;
  for (const FlatLayout* l : layouts)
    for (const FlatEntry& e : l->entries) known.insert(e.info.name);
  for (const std::string& name : weights.names()) {
    if (known.count(name) || name.find("rotary_emb.inv_freq") != std::string::npos) continue;
    throw Error("in the weights but not in the model described by config.json", {.file = source, .tensor = name});
  }
}

}  // namespace shardlm::shard
