// The shardlm side of the PEFT adapter tests (tests/scripts/peft_cli.sh):
//
//   peft_tool make-adapter BASE OUT --rank R --alpha A --targets q_proj,v_proj [--rslora] [--dora]
//                          [--dtype f32|bf16] [--seed S] [--std X]
//       writes a PEFT LoRA adapter for the model in BASE with write_peft_adapter: every A and B
//       drawn from normal(0, X) (default 0.1; non-zero B, unlike a fresh LoRA, so the adapter
//       changes the model), element i of tensor `name` from the counter-based RNG at (S, name, i).
//       With --dora (use_dora: true) each magnitude vector is its base weight's row norms times
//       1 + normal(0, X) (near PEFT's start, ||W||, but not equal to it, so it matters).
//   peft_tool logits MODEL IDS.npy OUT.npy
//       shardlm's f32 logits [B, T, V] of the model in MODEL on the int32 ids [B, T].
//   peft_tool bnb-dir DENSE OUT
//       the model in DENSE in bitsandbytes' 4-bit layout (tests/bnb_dir.h: bf16, double-quantized
//       NF4 decoder Linear weights), with DENSE's tokenizer files.
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "io/model_files.h"
#include "model/llama.h"
#include "model/peft_adapter.h"
#include "testing.h"
#include "bnb_dir.h"
#include "model/hf_dir.h"
#include "infer/param_store.h"
#include "ops/ops.h"

using namespace shardlm;

namespace {

int make_adapter(int argc, char** argv) {
  if (argc < 4) throw Error("usage: peft_tool make-adapter BASE OUT --rank R --alpha A --targets LIST ...");
  const std::string base = argv[2], out = argv[3];
  model::LoraSpec spec;
  spec.base_model_name_or_path = base;
  uint64_t seed = 1;
  float std_dev = 0.1f;
  DType dtype = DType::F32;
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    if (a == "--rank") spec.rank = std::stoll(next());
    else if (a == "--alpha") spec.alpha = std::stod(next());
    else if (a == "--rslora") spec.use_rslora = true;
    else if (a == "--dora") spec.use_dora = true;
    else if (a == "--seed") seed = std::stoull(next());
    else if (a == "--std") std_dev = std::stof(next());
    else if (a == "--dtype") dtype = parse_dtype(next());
    else if (a == "--targets") {
      std::stringstream ss(next());
      std::string t;
      while (std::getline(ss, t, ',')) spec.target_modules.push_back(t);
    } else {
      throw Error(fmt::format("unknown option {}", a));
    }
  }
  const ModelConfig cfg = load_hf_config(base);
  std::vector<std::vector<float>> data;
  std::map<std::string, Tensor> tensors;
  std::unique_ptr<infer::ParamStore> params;  // the base, for DoRA's magnitudes
  if (spec.use_dora) {
    params = std::make_unique<infer::ParamStore>(cfg, DType::F32);
    params->load(io::ModelWeights(base), base);
  }
  for (const model::LoraTensorInfo& t : model::lora_adapter_tensors(cfg, spec)) {
    const int64_t n = t.shape.size() == 2 ? t.shape[0] * t.shape[1] : t.shape[0];
    std::vector<float>& v = data.emplace_back(shardlm::testing::randn(n, seed, t.name, std_dev));
    if (t.shape.size() == 1) {  // a DoRA magnitude: ||W_j|| (1 + noise)
      const Tensor w = params->master(model::dora_base_weight_name(t.name));
      std::vector<float> norms(static_cast<size_t>(n));
      ops::row_norms(Tensor::view(norms.data(), DType::F32, {n}), w);
      for (int64_t j = 0; j < n; ++j) v[size_t(j)] = norms[size_t(j)] * (1.0f + v[size_t(j)]);
    }
    tensors[t.name] = Tensor::view(v.data(), DType::F32, t.shape.data(), int(t.shape.size()));
  }
  write_peft_adapter(out, spec, cfg, tensors, dtype);
  std::printf("wrote %s: %zu tensors, rank %lld, scale %g\n", out.c_str(), tensors.size(), (long long)spec.rank,
              spec.scale());
  return 0;
}

int logits(int argc, char** argv) {
  if (argc != 5) throw Error("usage: peft_tool logits MODEL IDS.npy OUT.npy");
  const std::string dir = argv[2];
  const ModelConfig cfg = load_hf_config(dir);
  infer::ParamStore params(cfg, DType::F32);
  params.load(io::ModelWeights(dir), dir);
  const shardlm::testing::NpyArray a = shardlm::testing::load_npy(argv[3]);
  if (a.shape.size() != 2) throw Error("ids must be [B, T]", {.file = argv[3]});
  std::vector<int32_t> ids = a.i32();
  model::Batch b;
  b.B = a.shape[0];
  b.T = a.shape[1];
  b.ids = ids.data();
  model::LlamaCompute compute(cfg, DType::F32);
  compute.set_weights(params.compute_weights());
  std::vector<float> out(size_t(b.B * b.T * cfg.vocab_size));
  compute.logits(b, Tensor::view(out.data(), DType::F32, {b.B * b.T, cfg.vocab_size}));
  shardlm::testing::save_npy(argv[4], out.data(), {b.B, b.T, cfg.vocab_size});
  return 0;
}

int bnb_dir(int argc, char** argv) {
  if (argc != 4) throw Error("usage: peft_tool bnb-dir DENSE OUT");
  const std::string dense = argv[2], out = argv[3];
  const ModelConfig cfg = load_hf_config(dense);
  infer::ParamStore params(cfg, DType::F32);
  params.load(io::ModelWeights(dense), dense);
  shardlm::testing::write_bnb_dir(out, cfg, params);
  copy_tokenizer_files(dense, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc >= 2 && std::strcmp(argv[1], "make-adapter") == 0) return make_adapter(argc, argv);
    if (argc >= 2 && std::strcmp(argv[1], "logits") == 0) return logits(argc, argv);
    if (argc >= 2 && std::strcmp(argv[1], "bnb-dir") == 0) return bnb_dir(argc, argv);
    std::fprintf(stderr, "usage: peft_tool make-adapter ... | logits ... | bnb-dir ...\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peft_tool: error: %s\n", e.what());
    return 1;
  }
}
