// gpu_train: training with `device: cuda` against the same run on the CPU.
//
// A tiny Llama (2 layers, f32) is written to disk, then trained for a few steps by run_training
// three times on the same data: device cpu (the reference), device cuda, and device cuda with
// offload_params, all FULL_SHARD on one process. Every step's loss on the GPU must be within 1e-4
// (relative) of the CPU's: the CUDA kernels compute the same f32 function with other summation
// orders, so the losses agree to about 1e-6 and drift a little as the weights separate.
//
// Without a GPU (or without CUDA in the build) it prints why it did not run and exits with
// kSkipped (77), which ctest reports as skipped (SKIP_RETURN_CODE), never as passed: the CPU-side
// checks of `device: cuda` are in test_training.cpp.
//
// Exit status: 0 when everything passed, 1 when something failed, 77 when it could not run here.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/device.h"
#include "io/yaml_config.h"
#include "model/config.h"
#include "model/hf_dir.h"
#include "train/param_store.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 8;
constexpr double kRelTol = 1e-4;
constexpr int kSkipped = 77;  // ctest's SKIP_RETURN_CODE

// The run's losses for one device / offload setting.
std::vector<double> train_losses(const fs::path& dir, const std::string& name, const std::string& extra) {
  ConfigTree t = ConfigTree::parse("model: " + (dir / "init").string() + "\noutput_dir: " + (dir / name).string() +
                                       "\ndata: {train: " + (dir / "corpus.txt").string() +
                                       ", eval_fraction: 0.1}\nseq_len: 32\nmicro_batch_size: 4\nmax_steps: " +
                                       std::to_string(kSteps) +
                                       "\nsharding_strategy: FULL_SHARD\noptimizer: {lr: 3e-3, weight_decay: 0.1}\n"
                                       "eval_every: 0\neval_batches: 1\nprogress: none\n" + extra,
                                   name + ".yaml");
  const train::TrainResult r = train::run_training(train::read_train_config(t));
  return r.losses;
}

int run_all() {
  std::string why;
  if (!device::cuda_available(&why)) {
    fmt::print("gpu_train: SKIPPED: no GPU to run on: {}; nothing was compared (the CPU-side checks of device: cuda "
               "are in shardlm_tests)\n", why);
    return kSkipped;
  }
  const fs::path dir = fs::temp_directory_path() / "shardlm_gpu_train_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  ModelConfig cfg = preset("tiny");
  cfg.num_hidden_layers = 2;
  train::ParamStore p(cfg, DType::F32);
  p.init_random(0);
  p.save((dir / "init").string(), DType::F32, ~uint64_t(0), "");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  std::ofstream(dir / "corpus.txt") << text;

  const std::vector<double> cpu = train_losses(dir, "cpu", "device: cpu\n");
  int failures = 0;
  for (const auto& [name, extra] : {std::pair<std::string, std::string>{"cuda", "device: cuda\n"},
                                    {"cuda_offload", "device: cuda\noffload_params: true\n"}}) {
    const std::vector<double> gpu = train_losses(dir, name, extra);
    if (gpu.size() != cpu.size()) {
      fmt::print("FAIL {}: {} steps, the CPU run had {}\n", name, gpu.size(), cpu.size());
      ++failures;
      continue;
    }
    for (size_t s = 0; s < cpu.size(); ++s) {
      const double rel = std::fabs(gpu[s] - cpu[s]) / std::max(std::fabs(cpu[s]), 1e-30);
      const bool ok = std::isfinite(gpu[s]) && rel <= kRelTol;
      fmt::print("{} {:<13} step {}: loss cpu {:.8f} gpu {:.8f} (relative difference {:.2e})\n", ok ? "ok  " : "FAIL",
                 name, s + 1, cpu[s], gpu[s], rel);
      failures += !ok;
    }
  }
  fmt::print("gpu_train: {} steps x 2 GPU runs against the CPU, {} failures\n", kSteps, failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace shardlm

int main() {
  try {
    return shardlm::run_all();
  } catch (const std::exception& e) {
    fmt::print("gpu_train: error: {}\n", e.what());
    return 1;
  }
}
