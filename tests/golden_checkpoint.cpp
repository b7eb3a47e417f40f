// A checkpoint converted by `shardlm convert` reloads in the independent PyTorch Llama with the
// logits shardlm computes from the engine's own weights.
//
// The golden GQA/Llama-3-RoPE model is trained 3 steps by the sharding engine, checkpointed and
// converted; shardlm's logits on batch 0 (from the engine's gathered master weights, not from the
// converted files) are written beside the converted model, and ctest's golden_convert_reload runs
// llama_golden.py check-logits on that directory.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "io/model_files.h"
#include "shard/engine.h"
#include "shard/load.h"
#include "testing.h"
#include "model/hf_dir.h"
#include "infer/param_store.h"

using namespace shardlm;
using namespace shardlm::testing;
namespace fs = std::filesystem;

TEST(GoldenCheckpoint, ConvertedModelIsWrittenWithTheEngineLogits) {
  const char* root = std::getenv("SHARDLM_GOLDEN_DIR");
  ASSERT_TRUE(root && *root) << "SHARDLM_GOLDEN_DIR is not set (run through ctest)";
  const fs::path c = fs::path(root) / "gqa_llama3_rope";
  const std::string model_dir = (c / "model").string(), ref = (c / "ref").string();
  const ModelConfig cfg = load_hf_config(model_dir);

  const std::unique_ptr<comm::Communicator> world = comm::make_local_communicator();
  shard::ShardingConfig sc;
  shard::Mesh mesh = shard::make_mesh(*world, sc, 1);
  shard::ShardedModel engine(cfg, {}, sc, mesh);
  shard::load_weights(engine, io::ModelWeights(model_dir), model_dir);
  model::LlamaCompute compute(cfg, DType::F32);
  // Batch s of the golden reference (ids and targets are kept in the caller's vectors).
  auto batch = [&](int s, std::vector<int32_t>& ids, std::vector<int32_t>& targets) {
    const NpyArray a = load_npy(ref + "/batch" + std::to_string(s) + "_ids.npy");
    ids = a.i32();
    targets = load_npy(ref + "/batch" + std::to_string(s) + "_targets.npy").i32();
    model::Batch b;
    b.B = a.shape[0];
    b.T = a.shape[1];
    b.ids = ids.data();
    b.targets = targets.data();
    return b;
  };
  for (int s = 0; s < 3; ++s) {
    std::vector<int32_t> ids, targets;
    engine.train_step(compute, {batch(s, ids, targets)}, ops::AdamWConfig{.lr = 1e-2, .weight_decay = 0.1}, s + 1, 1.0);
  }

  const std::string ckpt_dir = (c / "checkpoint").string(), out = (c / "converted").string();
  ckpt::SaveOptions save;
  save.dir = ckpt_dir;
  save.step = 3;
  ckpt::save_checkpoint(save, engine, cfg, *world);
  ckpt::CheckpointReader reader(ckpt_dir);
  ckpt::convert_checkpoint(reader, {.out = out, .dtype = DType::F32, .publish = io::Publish::ReplaceAnything});

  // shardlm's logits from the engine's weights.
  infer::ParamStore full(cfg, DType::F32);
  const auto weights = shardlm::testing::gather_weights(engine);
  for (const std::string& name : engine.names()) {
    const std::vector<float>& v = weights.at(name);
    std::copy(v.begin(), v.end(), full.master(name).f32());
  }
  model::LlamaCompute eval(cfg, DType::F32);
  eval.set_weights(full.compute_weights());
  std::vector<int32_t> ids, targets;
  const model::Batch b = batch(0, ids, targets);
  std::vector<float> logits(static_cast<size_t>(b.B * b.T * cfg.vocab_size));
  eval.logits(b, Tensor::view(logits.data(), DType::F32, {b.B * b.T, cfg.vocab_size}));
  save_npy(out + "/logits.npy", logits.data(), {b.B, b.T, cfg.vocab_size});
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
}
