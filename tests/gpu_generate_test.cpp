// gpu_generate: generation with the model on the GPU (`generate --device cuda`) against the same
// generation on the CPU.
//
// A tiny random Llama (2 layers, GQA) is held twice, on the CPU and moved to the GPU
// (ParamStore::move_to), in f32 and in bf16 (weights and KV cache), and both Generators run the
// same forwards: a step that prefills two prompts of different lengths (one with the logits of
// every position) and then decode steps of both sequences together, through a paged KV cache of
// 4-position blocks, so that paged attention reads keys across blocks. Every logit of the GPU is
// compared with the CPU's:
//  - f32: within 1e-4 of the largest |logit| (the CUDA kernels compute the same f32 function in
//    another summation order);
//  - bf16: within 3e-2 of it (the GPU's matmuls round the f32 activations to bf16 for its tensor
//    cores; the CPU's f32 path widens the bf16 weights instead; docs/ops.md, "the bf16 policy").
// Then greedy generation of three prompts by Generator::run, at most 2 at a time, with a KV cache
// too small for both (preemption and recompute on the GPU): in f32 the tokens must be the CPU's.
//
// Without a GPU (or without CUDA in the build) it prints why it did not run and exits with
// kSkipped (77), which ctest reports as skipped (SKIP_RETURN_CODE), never as passed. The CPU-side
// checks of --device (the flag's errors) are in bad_inputs.
//
// Exit status: 0 when everything passed, 1 when something failed, 77 when it could not run here.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_program.h"
#include "infer/generator.h"
#include "infer/param_store.h"
#include "model/config.h"

namespace shardlm {
namespace {

// |got - want| at most tol x max |want|, over every logit; prints the step's figures.
int compare(const std::string& what, const std::vector<float>& want, const std::vector<float>& got, double tol) {
  if (got.size() != want.size()) {
    fmt::print("FAIL {}: {} logits, the CPU gave {}\n", what, got.size(), want.size());
    return 1;
  }
  double scale = 0.0, worst = 0.0;
  bool finite = true;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, double(std::fabs(want[i])));
    worst = std::max(worst, double(std::fabs(got[i] - want[i])));
    finite = finite && std::isfinite(got[i]);
  }
  const bool ok = finite && worst <= tol * scale;
  fmt::print("{} {}: {} logits, max |diff| {:.3e} of max |logit| {:.3e} (allowed {:.1e} of it)\n",
             ok ? "ok  " : "FAIL", what, want.size(), worst, scale, tol);
  return ok ? 0 : 1;
}

ModelConfig tiny_config() {
  ModelConfig cfg = preset("tiny");
  cfg.num_hidden_layers = 2;
  return cfg;
}

// The model's weights in `dtype` on `device` (random, the same values for every call).
infer::ParamStore store(const ModelConfig& cfg, DType dtype, Device device) {
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(7);
  if (dtype == DType::BF16) p.keep_only_bf16();
  p.move_to(device);
  return p;
}

int forwards(const ModelConfig& cfg, DType dtype, double tol) {
  infer::ParamStore on_cpu = store(cfg, dtype, Device::CPU), on_gpu = store(cfg, dtype, Device::CUDA);
  const infer::KvCacheOptions kv{.dtype = dtype, .block_size = 4};
  infer::Generator cpu(cfg, on_cpu.compute_weights(), 48, 2, {}, {}, kv);
  infer::Generator gpu(cfg, on_gpu.compute_weights(), 48, 2, {}, {}, kv);
  const std::string name = dtype_name(dtype);
  std::vector<infer::Generator::Rows> step = {
      {0, {1, 17, 93, 4, 250, 7, 7, 301, 12, 5, 66}, true},  // 11 positions, every one's logits
      {1, {1, 400, 2, 9, 31}, false}};
  int failures = 0;
  for (int s = 0; s < 8; ++s) {
    const std::vector<float> want = cpu.forward_parts(step), got = gpu.forward_parts(step);
    failures += compare(fmt::format("{} step {} ({})", name, s, s == 0 ? "prefill" : "decode"), want, got, tol);
    // The next tokens: each sequence's greedy one from the CPU's last logits, fed to both.
    const int64_t V = cfg.vocab_size;
    std::vector<int32_t> next;
    for (int64_t r : {int64_t(want.size()) / V - 2, int64_t(want.size()) / V - 1})
      next.push_back(int32_t(std::max_element(want.begin() + r * V, want.begin() + (r + 1) * V) - (want.begin() + r * V)));
    step = {{0, {next[0]}, false}, {1, {next[1]}, false}};
  }
  return failures;
}

int greedy_runs(const ModelConfig& cfg) {
  infer::ParamStore on_cpu = store(cfg, DType::F32, Device::CPU), on_gpu = store(cfg, DType::F32, Device::CUDA);
  // Blocks for one sequence of 40 positions and a few more: the second member is preempted.
  const int64_t block_bytes = 2 * cfg.num_hidden_layers * 4 * cfg.kv_dim() * 4;
  const infer::KvCacheOptions kv{.dtype = DType::F32, .block_size = 4, .max_bytes = 13 * block_bytes};
  infer::Generator cpu(cfg, on_cpu.compute_weights(), 40, 2, {}, {}, kv);
  infer::Generator gpu(cfg, on_gpu.compute_weights(), 40, 2, {}, {}, kv);
  std::vector<infer::Request> requests;
  for (const std::vector<int32_t>& prompt :
       {std::vector<int32_t>{1, 5, 6, 7}, std::vector<int32_t>{1, 300, 301}, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}})
    requests.push_back({prompt, {.max_new_tokens = 24, .temperature = 0.0f}});
  const std::vector<infer::Completion> want = cpu.run(requests, {}, {}, 4), got = gpu.run(requests, {}, {}, 4);
  int failures = 0, preempted = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const bool ok = got[i].tokens == want[i].tokens;
    preempted += got[i].preemptions;
    fmt::print("{} f32 greedy request {}: {} tokens{}\n", ok ? "ok  " : "FAIL", i, got[i].tokens.size(),
               ok ? ", the CPU's" : ", not the CPU's");
    failures += !ok;
  }
  fmt::print("     preemptions on the GPU: {}\n", preempted);
  return failures;
}

int run_all() {
  const ModelConfig cfg = tiny_config();
  int failures = forwards(cfg, DType::F32, 1e-4);
  failures += forwards(cfg, DType::BF16, 3e-2);
  failures += greedy_runs(cfg);
  fmt::print("gpu_generate: {}\n", failures == 0 ? "all passed" : fmt::format("{} failed", failures));
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace shardlm

int main() {
  return shardlm::testing::run_gpu_program("gpu_generate", "the CPU-side checks of --device are in bad_inputs",
                                           shardlm::run_all);
}
