// Test support: numeric comparison, finite-difference gradient checks, and access to the
// PyTorch reference cases written by tests/torch_ref/gen_refs.py.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "comm/communicator.h"
#include "data/dataset.h"
#include "shard/engine.h"
#include "shard/load.h"
#include <map>

namespace shardlm::testing {

// n samples of N(0, std), deterministic in (seed, name).
std::vector<float> randn(int64_t n, uint64_t seed, const std::string& name, float std = 1.0f);

// A fresh directory per test (under gtest's TempDir, named by suite, test and pid), removed afterwards.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const;
  const std::filesystem::path& path() const { return path_; }
  std::vector<std::string> list() const;  // file names in the directory, sorted

 private:
  std::filesystem::path path_;
};

// Training in one process: the engine on a local communicator, as `shardlm train` runs at world
// size 1.
struct LocalEngine {
  std::unique_ptr<comm::Communicator> local;
  shard::Mesh mesh;
  shard::ShardedModel engine;
  explicit LocalEngine(const ModelConfig& cfg, const shard::ShardingConfig& sc = {},
                       const model::FinetuneSpec& finetune = {});
  shard::StepStats step(model::StagedModel& m, const std::vector<data::BatchBuffers>& micro,
                        const ops::AdamWConfig& opt, int64_t step, double max_grad_norm = 1.0);
  std::vector<float> weight(const std::string& name);  // f32 master values
  std::vector<float> grad(const std::string& name);    // the last step's gradient (CPU, one process)
};

// Every tensor's f32 master values, gathered from the engine's shards one unit at a time
// (collective: every rank calls it).
std::map<std::string, std::vector<float>> gather_weights(shard::ShardedModel& engine);

// Sets the f32 master values of the named tensors: every rank passes the whole map and writes the
// part of each tensor it owns (CPU-resident master weights), then the engine refreshes its
// parameters (master_weights_changed; collective). Tensors not in the map keep their values.
// Throws an Error naming a tensor the engine does not have or whose size differs.
void set_weights(shard::ShardedModel& engine, const std::map<std::string, std::vector<float>>& values);

// Passes when |got - want| <= atol + rtol * |want| for every element and nothing is NaN/Inf
// where `want` is finite. The failure message names `label`, the worst element and its values.
::testing::AssertionResult all_close(const float* got, const float* want, int64_t n, double atol, double rtol,
                                     const std::string& label = "");
inline ::testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<float>& want,
                                            double atol, double rtol, const std::string& label = "") {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << label << ": size " << got.size() << " != " << want.size();
  return all_close(got.data(), want.data(), int64_t(got.size()), atol, rtol, label);
}

double dot(const float* a, const float* b, int64_t n);  // in double

// A Tensor view of a vector (which must outlive the view): f32 or i32 by element type.
Tensor view(std::vector<float>& v, std::initializer_list<int64_t> shape);
Tensor view(std::vector<int32_t>& v, std::initializer_list<int64_t> shape);

// Runs fn, which must throw shardlm::Error, and returns its message ("" plus a test failure when
// nothing is thrown).
std::string error_of(const std::function<void()>& fn);
// Expects fn to throw an Error whose message contains `needle`.
void expect_error(const std::function<void()>& fn, const std::string& needle);

// Host storage for f32 or bf16 values (bf16: rounded to nearest even) with a Tensor view.
struct HostArray {
  DType dtype = DType::F32;
  std::vector<float> f;
  std::vector<bf16_t> h;
  HostArray(DType dt, const std::vector<float>& values);
  Tensor view(std::initializer_list<int64_t> shape);
  std::vector<float> values() const;  // as f32
};

// Central finite differences: for each checked index i, perturbs x[i] by +-eps, calls loss(),
// restores x[i], and compares (L+ - L-) / (2 eps) with analytic[i] within atol + rtol * |fd|.
// At most max_checks indices are checked, spread evenly over [0, n).
struct GradCheckOptions {
  double eps = 1e-2;
  double atol = 2e-3;
  double rtol = 2e-2;
  int64_t max_checks = 200;
};
::testing::AssertionResult check_gradient(const std::function<double()>& loss, float* x, int64_t n,
                                          const float* analytic, const GradCheckOptions& opt = {},
                                          const std::string& label = "");

// ---- .npy files and reference cases ----------------------------------------------------------
struct NpyArray {
  std::string descr;  // numpy dtype string: "<f4", "<i4", "<u2" (bf16 bit patterns), "<f8", "<i8"
  std::vector<int64_t> shape;
  std::vector<char> bytes;
  int64_t numel() const;
  std::vector<float> f32() const;       // converts <f4, <f8 and <u2 (read as bf16)
  std::vector<int32_t> i32() const;     // converts <i4, <i8
  std::vector<uint16_t> u16() const;
};
NpyArray load_npy(const std::string& path);
// Batch s of a golden reference directory (llama_golden.py, lora_golden.py): batch<s>_ids.npy,
// _targets.npy and, for packed batches, _positions.npy and _segments.npy.
data::BatchBuffers load_reference_batch(const std::string& ref_dir, int s);
// Writes a little-endian f32 .npy file (C order).
void save_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);

struct RefCase {
  std::string op, name, dir;
  nlohmann::json params;  // scalars the reference used (shapes, eps, flags)
  bool has(const std::string& array) const;
  NpyArray array(const std::string& array) const;
  std::vector<float> f32(const std::string& array) const { return this->array(array).f32(); }
  std::vector<int32_t> i32(const std::string& array) const { return this->array(array).i32(); }
};
// All cases of one op, from $SHARDLM_TORCH_REFS/<op>/. Throws if there are none, so a missing
// reference fails the test instead of passing it vacuously.
std::vector<RefCase> load_ref_cases(const std::string& op);

}  // namespace shardlm::testing
