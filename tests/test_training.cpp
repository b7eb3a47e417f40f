// Unit and end-to-end tests of the single-process training layer: data, schedules, the parameter
// store, generation with a KV cache, the training loop, and the errors users see.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <set>

#include "core/device.h"
#include "data/dataset.h"
#include "infer/generator.h"
#include "io/model_files.h"
#include "io/yaml_config.h"
#include "model/llama.h"
#include "testing.h"
#include "model/hf_dir.h"
#include "infer/param_store.h"
#include "train/resume.h"
#include "train/schedule.h"
#include "train/sharding_config.h"
#include "train/train_config.h"
#include "train/trainer.h"

using namespace shardlm;
using namespace shardlm::testing;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  // Per process: checkouts beside this one may run the same tests at the same time.
  const fs::path d = fs::path(::testing::TempDir()) / ("shardlm_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

ModelConfig small_config() {
  ModelConfig c = preset("tiny");
  c.num_hidden_layers = 2;
  c.initializer_range = 0.2;  // large enough that attention is far from uniform
  return c;
}


}  // namespace

TEST(Schedule, MatchesHuggingFaceDefinitions) {
  train::LrSchedule s;
  s.lr = 1.0;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.kind = train::LrSchedule::Kind::Cosine;
  EXPECT_DOUBLE_EQ(s.at(1), 0.0);  // HF evaluates at completed steps: 0 / 10
  EXPECT_DOUBLE_EQ(s.at(6), 0.5);
  EXPECT_DOUBLE_EQ(s.at(11), 1.0);
  EXPECT_NEAR(s.at(61), 0.5, 1e-12);  // half-way through the decay
  EXPECT_NEAR(s.at(111), 0.0, 1e-12);
  s.kind = train::LrSchedule::Kind::Linear;
  EXPECT_NEAR(s.at(61), 0.5, 1e-12);
  s.min_lr_ratio = 0.1;
  EXPECT_NEAR(s.at(111), 0.1, 1e-12);
  s.kind = train::LrSchedule::Kind::Constant;
  EXPECT_DOUBLE_EQ(s.at(100), 1.0);
  EXPECT_THROW(train::parse_schedule_kind("exponential"), Error);
}

// MFU's numerator for Llama 2 7B at 4096 tokens, from the architecture's published numbers: the
// projections 32 x (4 x 4096^2 + 3 x 4096 x 11008) plus the head 32000 x 4096 = 6.608e9 matmul
// weights, 6 FLOPs each, and 12 x 32 x 4096 x 4096 for attention; LoRA r=8 on q and v: 4 per
// frozen weight and 6 per adapter parameter (32 layers x 2 modules x 8 x (4096 + 4096)).
TEST(Flops, TrainingFlopsPerTokenFollowsPalmsAccounting) {
  ModelConfig c = preset("llama2-7b");
  const double matmul = 32.0 * (4 * 4096.0 * 4096 + 3 * 4096.0 * 11008) + 32000.0 * 4096;
  const double attention = 12.0 * 32 * 4096 * 4096;
  model::FinetuneSpec ft;
  EXPECT_NEAR(training_flops_per_token(c, ft, 4096), 6 * matmul + attention, 1e3);
  EXPECT_NEAR(training_flops_per_token(c, ft, 4096) / 1e9, 46.09, 0.01);
  model::LoraSpec lora;
  lora.rank = 8;
  lora.target_modules = {"q_proj", "v_proj"};
  ft.lora = lora;
  EXPECT_NEAR(training_flops_per_token(c, ft, 4096), 4 * matmul + 6 * (32.0 * 2 * 8 * (4096 + 4096)) + attention, 1e3);
}

TEST(Data, TokenStreamWindowsAndBatches) {
  std::vector<int32_t> tokens(23);
  for (int i = 0; i < 23; ++i) tokens[size_t(i)] = i;
  data::TokenStreamDataset ds(tokens, 5);
  ASSERT_EQ(ds.size(), 4);  // (23 - 1) / 5 windows of 5 + 1 tokens
  const data::Example e = ds.get(2);
  EXPECT_EQ(e.ids, (std::vector<int32_t>{10, 11, 12, 13, 14}));
  EXPECT_EQ(e.targets, (std::vector<int32_t>{11, 12, 13, 14, 15}));
  const data::BatchBuffers b = data::make_batch({ds.get(0), {{7, 8}, {8, ops::kIgnoreIndex}}}, 5, 0);
  EXPECT_EQ(b.B, 2);
  EXPECT_EQ(b.count_targets(), 5 + 1);  // padding never counts
  EXPECT_EQ(b.ids[7], 0);
  EXPECT_EQ(b.targets[7], ops::kIgnoreIndex);
}

TEST(Data, AdditionTaskHeldOutIsDisjointAndMasksThePrompt) {
  data::ByteTokenizer tok;
  data::AdditionTask train(tok, 2, false, 3000, 1), held(tok, 2, true, 300, 1);
  std::set<std::string> seen;
  for (int64_t i = 0; i < train.size(); ++i) seen.insert(train.prompt(i));
  for (int64_t i = 0; i < held.size(); ++i) EXPECT_EQ(seen.count(held.prompt(i)), 0u) << held.prompt(i);
  const data::Example e = train.get(0);
  const std::string prompt = train.prompt(0), answer = train.answer(0);
  // The loss covers exactly the answer and EOS.
  int64_t counted = 0;
  for (int32_t t : e.targets) counted += t != ops::kIgnoreIndex;
  EXPECT_EQ(counted, int64_t(answer.size()) + 1);
  EXPECT_EQ(e.targets.back(), tok.eos_id());
  EXPECT_EQ(std::stoi(answer), std::stoi(prompt.substr(0, prompt.find('+'))) + std::stoi(prompt.substr(prompt.find('+') + 1)));
}

TEST(Data, TokenFileErrorsNameFileAndOffset) {
  const fs::path d = fresh_dir("tokens");
  const std::string path = (d / "t.bin").string();
  std::ofstream(path, std::ios::binary).write("\x05\x00\x09\x01\x07", 5);
  EXPECT_NE(error_of([&] { data::read_token_file(path, 2, 512); }).find("not a multiple of 2 bytes"), std::string::npos);
  std::ofstream(path, std::ios::binary).write("\x05\x00\x09\x01", 4);
  const std::string msg = error_of([&] { data::read_token_file(path, 2, 260); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("token 265 at index 1 (byte offset 2)"), std::string::npos) << msg;
  EXPECT_EQ(data::read_token_file(path, 2, 1000), (std::vector<int32_t>{5, 265}));
}

TEST(Data, TokenFilesAreCheckedAgainstTheModelsVocabulary) {
  // Issue 18.1: a model directory with vocab_size 32000 and no tokenizer files (so the byte-level
  // fallback tokenizer, 259 ids, is loaded) trains on a uint16 token file of ids up to 31999: the
  // ids are checked against the model's vocab_size, not against the fallback tokenizer's.
  const fs::path d = fresh_dir("tokens_vocab");
  ModelConfig cfg = preset("tiny");
  cfg.vocab_size = 32000;
  cfg.num_hidden_layers = 1;
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(0);
  p.save((d / "init").string(), DType::F32, ~uint64_t(0), "");
  ASSERT_FALSE(fs::exists(d / "init" / "tokenizer.model"));
  std::vector<uint16_t> ids(600);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = uint16_t(i == 0 ? 27670 : (i * 7919) % 32000);
  auto write = [&](const std::string& name) {
    std::ofstream(d / name, std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), std::streamsize(2 * ids.size()));
    return (d / name).string();
  };
  const std::string good = write("rand.tokens");
  const std::string head = "model: " + (d / "init").string() + "\noutput_dir: " + (d / "out").string() +
                           "\nseq_len: 16\nmicro_batch_size: 2\nmax_steps: 1\neval_every: 0\nprogress: none\n";
  ConfigTree t = ConfigTree::parse(head + "data: {train: " + good + ", token_bytes: 2, eval_fraction: 0.1}\n");
  train::TrainResult r;
  try {
    r = train::run_training(train::read_train_config(t));
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  EXPECT_EQ(r.steps, 1);
  // An id the model has no embedding for is still refused, naming the model's vocabulary size.
  ids[5] = 32000;
  const std::string bad = write("bad.tokens");
  ConfigTree u = ConfigTree::parse(head + "data: {train: " + bad + ", token_bytes: 2, eval_fraction: 0.1}\n");
  const std::string msg = error_of([&] { train::run_training(train::read_train_config(u)); });
  EXPECT_NE(msg.find("token 32000 at index 5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("outside the vocabulary of 32000"), std::string::npos) << msg;
}

TEST(ParamStore, InitIsDeterministicAndLoadNamesTheBadTensor) {
  const fs::path d = fresh_dir("paramstore");
  ModelConfig cfg = small_config();
  infer::ParamStore a(cfg, DType::F32), b(cfg, DType::F32);
  a.init_random(5);
  b.init_random(5);
  for (const std::string& n : a.names())
    ASSERT_EQ(std::memcmp(a.master(n).data, b.master(n).data, a.master(n).nbytes()), 0) << n;
  EXPECT_FLOAT_EQ(a.master("model.norm.weight").f32()[3], 1.0f);
  a.save((d / "m").string(), DType::BF16, ~uint64_t(0), "");
  // Reloaded from bf16: equal to the bf16 rounding of the original.
  infer::ParamStore c(cfg, DType::F32);
  c.load(io::ModelWeights((d / "m").string()), (d / "m").string());
  const float orig = a.master("model.layers.1.mlp.up_proj.weight").f32()[17];
  EXPECT_EQ(c.master("model.layers.1.mlp.up_proj.weight").f32()[17], bf16_to_f32(f32_to_bf16(orig)));
  // A config that disagrees with the weights names the tensor and both shapes.
  ModelConfig wider = cfg;
  wider.intermediate_size += 8;
  infer::ParamStore w(wider, DType::F32);
  const std::string msg = error_of([&] { w.load(io::ModelWeights((d / "m").string()), "m"); });
  EXPECT_NE(msg.find("tensor 'model.layers.0.mlp.gate_proj.weight': shape [172, 64] in the file"), std::string::npos)
      << msg;
  ModelConfig tied = cfg;
  tied.tie_word_embeddings = true;
  infer::ParamStore t(tied, DType::F32);
  EXPECT_NE(error_of([&] { t.load(io::ModelWeights((d / "m").string()), "m"); }).find("lm_head.weight"),
            std::string::npos);
}

TEST(Generator, KvCacheDecodingEqualsTheFullForward) {
  ModelConfig cfg = small_config();
  cfg.qkv_bias = true;  // exercise biases too
  cfg.architecture = Architecture::Qwen2;
  cfg.model_type = "qwen2";
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(11);
  const std::vector<int32_t> tokens = {1, 40, 77, 300, 12, 5, 91, 250, 3};
  const int64_t T = int64_t(tokens.size()), V = cfg.vocab_size;
  // Reference: training's forward over the whole sequence.
  model::LlamaCompute m(cfg, DType::F32);
  m.set_weights(p.compute_weights());
  std::vector<float> full(static_cast<size_t>(T * V));
  model::Batch b;
  b.B = 1;
  b.T = T;
  b.ids = tokens.data();
  m.logits(b, Tensor::view(full.data(), DType::F32, {T, V}));
  infer::Generator gen(cfg, p.compute_weights(), 32);
  EXPECT_TRUE(all_close(gen.forward_all(tokens), full, 1e-5, 1e-4, "forward_all"));
  // Prefill 4 tokens, then decode one at a time: each step's logits equal the full forward's row.
  gen.reset();
  std::vector<float> last = gen.forward({tokens.begin(), tokens.begin() + 4});
  EXPECT_TRUE(all_close(last.data(), full.data() + 3 * V, V, 1e-5, 1e-4, "prefill"));
  for (int64_t t = 4; t < T; ++t) {
    last = gen.forward({tokens[size_t(t)]});
    EXPECT_TRUE(all_close(last.data(), full.data() + t * V, V, 1e-5, 1e-4, "decode step " + std::to_string(t)));
  }
}

TEST(Generator, SamplingRespectsGreedyTopKAndSeed) {
  std::vector<float> logits = {0.1f, 3.0f, 2.9f, -1.0f};
  infer::SamplingOptions o;
  o.temperature = 0.0f;
  EXPECT_EQ(infer::sample_token(logits, o, 0), 1);
  o.temperature = 1.0f;
  o.top_k = 2;
  for (uint64_t s = 0; s < 200; ++s) {
    const int32_t t = infer::sample_token(logits, o, s);
    EXPECT_TRUE(t == 1 || t == 2) << t;
  }
  o.top_k = 0;
  o.seed = 9;
  EXPECT_EQ(infer::sample_token(logits, o, 5), infer::sample_token(logits, o, 5));
}

TEST(TrainConfig, ErrorsNameFileLineAndKey) {
  const fs::path d = fresh_dir("cfg");
  const std::string path = (d / "run.yaml").string();
  std::ofstream(path) << "model: m\noutput_dir: o\ndata:\n  train: x.txt\nmicro_batch_size: eight\n";
  ConfigTree t = ConfigTree::load(path);
  std::string msg = error_of([&] { train::read_train_config(t); });
  EXPECT_NE(msg.find(path + ":5: key 'micro_batch_size'"), std::string::npos) << msg;
  std::ofstream(path) << "model: m\noutput_dir: o\ndata:\n  train: x.txt\ngradient_accumulation_step: 2\n";
  ConfigTree u = ConfigTree::load(path);
  msg = error_of([&] { train::read_train_config(u); });
  EXPECT_NE(msg.find("did you mean 'gradient_accumulation_steps'"), std::string::npos) << msg;
  std::ofstream(path) << "model: m\noutput_dir: o\ndata:\n  train: x.txt\nlr_scheduler:\n  type: exponential\n";
  ConfigTree v = ConfigTree::load(path);
  msg = error_of([&] { train::read_train_config(v); });
  EXPECT_NE(msg.find(":6: key 'lr_scheduler.type'"), std::string::npos) << msg;
}

TEST(TrainConfig, DeviceCudaIsRefusedBeforeAnyWorkWithoutAGpu) {
  const fs::path d = fresh_dir("cfg_device");
  const std::string path = (d / "train.yaml").string();
  std::ofstream(path) << "model: m\noutput_dir: o\ndevice: cuda\ndata:\n  train: x.txt\n";
  ConfigTree t = ConfigTree::load(path);
  std::string why;
  if (device::cuda_available(&why)) {
    // A GPU machine: the key is accepted (the GPU runs themselves are in gpu_train_test.cpp).
    EXPECT_EQ(train::read_train_config(t).device, Device::CUDA);
  } else {
    const std::string msg = error_of([&] { train::read_train_config(t); });
    EXPECT_NE(msg.find(path + ":3: key 'device': cuda asked for, but "), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    std::printf("device: cuda refused here, as it should be without a GPU: %s\n", msg.c_str());
  }
  std::ofstream(path) << "model: m\noutput_dir: o\ndevice: tpu\ndata:\n  train: x.txt\n";
  ConfigTree u = ConfigTree::load(path);
  const std::string msg = error_of([&] { train::read_train_config(u); });
  EXPECT_NE(msg.find(":3: key 'device': expected cpu or cuda, got 'tpu'"), std::string::npos) << msg;
}

TEST(TrainConfig, OffloadNeedsCudaAndAShardedStrategy) {
  // Without device: cuda (the default cpu), under both spellings.
  for (const std::string key : {"offload_params: true\n", "fsdp_config:\n  fsdp_offload_params: true\n"}) {
    ConfigTree t = ConfigTree::parse("model: m\noutput_dir: o\ndata:\n  train: x.txt\n" + key, "off.yaml");
    const std::string msg = error_of([&] { train::read_train_config(t); });
    EXPECT_NE(msg.find("off.yaml:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("offload_params': CPU offload needs device: cuda"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // With a CUDA device (the sharding reader is told so directly: no GPU is needed for this part).
  ConfigTree a = ConfigTree::parse("fsdp_config:\n  fsdp_offload_params: true\n  fsdp_sharding_strategy: FULL_SHARD\n");
  EXPECT_TRUE(train::read_sharding_config(a, Device::CUDA).offload_params);
  ConfigTree b = ConfigTree::parse("offload_params: true\nsharding_strategy: NO_SHARD\n", "ddp.yaml");
  const std::string msg = error_of([&] { train::read_sharding_config(b, Device::CUDA); });
  EXPECT_NE(msg.find("ddp.yaml:1: key 'offload_params': CPU offload needs a strategy that shards gradients"),
            std::string::npos)
      << msg;
  ConfigTree c = ConfigTree::parse("offload_params: false\n");
  EXPECT_FALSE(train::read_sharding_config(c).offload_params);
}

TEST(Training, GradientAccumulationEqualsOneBigBatch) {
  // Two micro-batches of 2 rows give the same step as one batch of 4 rows: the loss is
  // normalized over all non-ignored tokens of the global batch, not per micro-batch.
  ModelConfig cfg = small_config();
  auto run = [&](bool split) {
    LocalEngine p(cfg);
    shard::init_random(p.engine, 3);
    model::LlamaCompute m(cfg, DType::F32);
    std::vector<data::Example> rows;
    for (int r = 0; r < 4; ++r) {
      data::Example e;
      for (int t = 0; t < 8; ++t) {
        e.ids.push_back((r * 37 + t * 11) % 300 + 3);
        e.targets.push_back(t < 2 + r ? ops::kIgnoreIndex : (r * 13 + t * 7) % 300 + 3);  // unequal counts
      }
      rows.push_back(e);
    }
    std::vector<data::BatchBuffers> micro;
    if (split) {
      micro.push_back(data::make_batch({rows[0], rows[1]}, 8, 0));
      micro.push_back(data::make_batch({rows[2], rows[3]}, 8, 0));
    } else {
      micro.push_back(data::make_batch(rows, 8, 0));
    }
    ops::AdamWConfig opt;
    opt.lr = 1e-2;
    const shard::StepStats r = p.step(m, micro, opt, 1);
    return std::make_pair(r, p.weight("model.layers.1.self_attn.o_proj.weight"));
  };
  const auto [one, w1] = run(false);
  const auto [two, w2] = run(true);
  EXPECT_EQ(one.tokens, two.tokens);
  EXPECT_NEAR(one.loss, two.loss, 1e-6);
  EXPECT_NEAR(one.grad_norm, two.grad_norm, 1e-5 * one.grad_norm);
  EXPECT_TRUE(all_close(w2, w1, 1e-6, 1e-5, "weights after one step"));
}

TEST(Training, TinyModelLearnsTextAndTheSavedModelGenerates) {
  // End to end: init -> train on text -> held-out loss far below its start -> reload -> generate.
  const fs::path d = fresh_dir("train");
  ModelConfig cfg = preset("tiny");
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(0);
  p.save((d / "init").string(), DType::F32, ~uint64_t(0), "");
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  std::ofstream(d / "corpus.txt") << text;
  ConfigTree t = ConfigTree::parse(
      "model: " + (d / "init").string() + "\noutput_dir: " + (d / "out").string() +
      "\ndata: {train: " + (d / "corpus.txt").string() +
      ", eval_fraction: 0.1}\nseq_len: 32\nmicro_batch_size: 8\nmax_steps: 60\n"
      "optimizer: {lr: 3e-3}\nlr_scheduler: {warmup_steps: 5}\neval_every: 0\nprogress: none\n");
  const train::TrainResult r = train::run_training(train::read_train_config(t));
  EXPECT_LT(r.eval_loss, 0.25 * r.initial_eval_loss) << "held-out loss " << r.initial_eval_loss << " -> " << r.eval_loss;
  EXPECT_TRUE(fs::exists(d / "out" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(d / "out" / "metrics.jsonl"));
  const ModelConfig back = load_hf_config((d / "out").string());
  infer::ParamStore q(back, DType::F32);
  q.load(io::ModelWeights((d / "out").string()), "out");
  data::ByteTokenizer tok;
  infer::Generator gen(back, q.compute_weights(), 64);
  infer::SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 12;
  const std::string out = tok.decode(gen.generate(tok.encode_with("the quick brown ", true, false), greedy, {2}));
  EXPECT_EQ(out.substr(0, 3), "fox") << "generated '" << out << "'";
}

TEST(Training, Bf16ComputeTracksF32) {
  // The same step with bf16 weights and activations (f32 master weights, gradients and AdamW)
  // agrees with f32 compute to bf16 precision: bf16 keeps 8 bits of mantissa (~0.4% per rounding),
  // so losses within 1% and gradients within a few percent of their scale.
  ModelConfig cfg = small_config();
  std::vector<data::Example> rows;
  for (int r = 0; r < 4; ++r) {
    data::Example e;
    for (int t = 0; t < 16; ++t) {
      e.ids.push_back((r * 31 + t * 17) % 400 + 3);
      e.targets.push_back((r * 7 + t * 13) % 400 + 3);
    }
    rows.push_back(e);
  }
  const data::BatchBuffers batch = data::make_batch(rows, 16, 0);
  auto run = [&](DType dtype) {
    shard::ShardingConfig sc;
    sc.param_dtype = dtype;
    LocalEngine p(cfg, sc);
    shard::init_random(p.engine, 21);
    model::LlamaCompute m(cfg, dtype);
    ops::AdamWConfig opt;
    opt.lr = 1e-3;
    std::vector<double> losses;
    std::vector<float> grad;
    for (int s = 1; s <= 2; ++s) {
      losses.push_back(p.step(m, {batch}, opt, s).loss);
      if (s == 1) grad = p.grad("model.layers.0.mlp.down_proj.weight");
    }
    return std::make_pair(losses, grad);
  };
  const auto [l32, g32] = run(DType::F32);
  const auto [l16, g16] = run(DType::BF16);
  double scale = 0;
  for (float g : g32) scale = std::max(scale, double(std::fabs(g)));
  for (size_t s = 0; s < l32.size(); ++s) EXPECT_NEAR(l16[s], l32[s], 0.01 * l32[s]) << "step " << s + 1;
  EXPECT_TRUE(all_close(g16, g32, 0.05 * scale, 0.05, "bf16 vs f32 gradient of layer 0 down_proj"));
}

TEST(Training, ActivationCheckpointingGivesTheSameGradientsWithLessMemory) {
  // Checkpointed layers keep only their input and recompute the rest in the backward: the same
  // kernels on the same inputs, so the loss and every gradient are bit-for-bit those of the plain
  // run, while the activation arena shrinks by the recomputed buffers.
  ModelConfig cfg = small_config();
  cfg.num_hidden_layers = 4;
  std::vector<data::Example> rows;
  for (int r = 0; r < 2; ++r) {
    data::Example e;
    for (int t = 0; t < 24; ++t) {
      e.ids.push_back((r * 29 + t * 11) % 400 + 3);
      e.targets.push_back(t % 5 == 0 ? ops::kIgnoreIndex : (r * 5 + t * 19) % 400 + 3);
    }
    rows.push_back(e);
  }
  const data::BatchBuffers batch = data::make_batch(rows, 24, 0);
  auto run = [&](int every, int64_t* arena_bytes) {
    LocalEngine p(cfg);
    shard::init_random(p.engine, 8);
    model::LlamaCompute m(cfg, DType::F32);
    m.set_checkpointing(every);
    const int64_t before = MemoryTracker::for_device(Device::CPU).stats().live[int(MemCategory::Activations)];
    m.reserve(batch.B, batch.T);
    *arena_bytes = MemoryTracker::for_device(Device::CPU).stats().live[int(MemCategory::Activations)] - before;
    const double loss = p.step(m, {batch}, ops::AdamWConfig{}, 1).loss;
    std::vector<std::vector<float>> grads;
    for (const std::string& n : p.engine.names()) grads.push_back(p.grad(n));
    return std::make_pair(loss, grads);
  };
  int64_t plain_bytes = 0, all_bytes = 0, half_bytes = 0;
  const auto plain = run(0, &plain_bytes);
  const auto all = run(1, &all_bytes);
  const auto half = run(2, &half_bytes);
  EXPECT_EQ(all.first, plain.first);
  EXPECT_EQ(half.first, plain.first);
  EXPECT_TRUE(all.second == plain.second) << "gradients differ with every layer checkpointed";
  EXPECT_TRUE(half.second == plain.second) << "gradients differ with every second layer checkpointed";
  // Per layer the plain arena holds 14 buffers; a checkpointed layer holds 1, plus one shared set.
  EXPECT_LT(all_bytes, plain_bytes / 2) << all_bytes << " vs " << plain_bytes;
  EXPECT_LT(all_bytes, half_bytes);
  EXPECT_LT(half_bytes, plain_bytes);
}

TEST(Training, ActivationOffloadGivesTheSameLossesAndGradients) {
  // offload_activations: each checkpointed layer's input goes to host memory after its forward and
  // comes back before its backward (the next one down prefetched), through two device slots the
  // inputs take turns in. The bits are the checkpointed run's: losses and every gradient over two
  // steps of two micro-batches, with every layer, every 2nd and every 3rd checkpointed (five
  // layers: the slots' turns, a last layer offloaded or not). The arena holds two inputs on the
  // device instead of one per checkpointed layer, and those inputs are charged to
  // OffloadedActivations, byte for byte.
  ModelConfig cfg = small_config();
  cfg.num_hidden_layers = 5;
  std::vector<data::BatchBuffers> batches;
  for (int b = 0; b < 2; ++b) {
    std::vector<data::Example> rows;
    for (int r = 0; r < 2; ++r) {
      data::Example e;
      for (int t = 0; t < 24; ++t) {
        e.ids.push_back((b * 7 + r * 29 + t * 11) % 400 + 3);
        e.targets.push_back(t % 5 == 0 ? ops::kIgnoreIndex : (b * 3 + r * 5 + t * 19) % 400 + 3);
      }
      rows.push_back(e);
    }
    batches.push_back(data::make_batch(rows, 24, 0));
  }
  struct Run {
    std::vector<double> losses;
    std::vector<std::vector<float>> grads;  // after each step, every tensor
    int64_t activations = 0, offloaded = 0;  // arena bytes by category
  };
  auto run = [&](int every, bool offload) {
    LocalEngine p(cfg);
    shard::init_random(p.engine, 8);
    model::LlamaCompute m(cfg, DType::F32);
    m.set_checkpointing(every, offload);
    MemoryTracker& tr = MemoryTracker::for_device(Device::CPU);
    const MemStats before = tr.stats();
    m.reserve(batches[0].B, batches[0].T);
    Run out;
    out.activations = tr.stats().live[int(MemCategory::Activations)] - before.live[int(MemCategory::Activations)];
    out.offloaded =
        tr.stats().live[int(MemCategory::OffloadedActivations)] - before.live[int(MemCategory::OffloadedActivations)];
    for (int s = 1; s <= 2; ++s) {
      out.losses.push_back(p.step(m, {batches[0], batches[1]}, ops::AdamWConfig{.lr = 1e-2}, s).loss);
      for (const std::string& n : p.engine.names()) out.grads.push_back(p.grad(n));
    }
    return out;
  };
  const int64_t input_bytes = batches[0].B * batches[0].T * cfg.hidden_size * 4;  // one layer's f32 input
  for (int every : {1, 2, 3}) {
    SCOPED_TRACE(every);
    const Run kept = run(every, false), offloaded = run(every, true);
    EXPECT_EQ(offloaded.losses, kept.losses);
    EXPECT_TRUE(offloaded.grads == kept.grads) << "gradients differ with the checkpointed inputs offloaded";
    const int64_t checkpointed = (cfg.num_hidden_layers + every - 1) / every;
    EXPECT_EQ(kept.offloaded, 0);
    EXPECT_EQ(offloaded.offloaded, checkpointed * input_bytes);
    EXPECT_EQ(offloaded.activations, kept.activations - checkpointed * input_bytes + 2 * input_bytes);
  }
  model::LlamaCompute m(cfg, DType::F32);
  EXPECT_THROW(m.set_checkpointing(0, true), Error);  // nothing checkpointed: nothing to offload
}

TEST(Training, ANonFiniteStepTakesNoOptimizerStepAndNamesTheTensor) {
  // A NaN in one weight makes the loss and every gradient downstream of it non-finite: the engine
  // reports the step as non-finite, names the first tensor (in unit order) whose gradient is, and
  // leaves weights and AdamW moments as they were.
  const ModelConfig cfg = small_config();
  LocalEngine p(cfg);
  shard::init_random(p.engine, 4);
  model::LlamaCompute m(cfg, DType::F32);
  std::vector<data::Example> rows(2);
  for (int r = 0; r < 2; ++r)
    for (int t = 0; t < 8; ++t) {
      rows[size_t(r)].ids.push_back((r * 17 + t * 5) % 300 + 3);
      rows[size_t(r)].targets.push_back((r * 3 + t * 11) % 300 + 3);
    }
  const data::BatchBuffers batch = data::make_batch(rows, 8, 0);
  ASSERT_TRUE(p.step(m, {batch}, ops::AdamWConfig{.lr = 1e-2}, 1).finite);
  // Poison one element of layer 1's attention output projection.
  for (int k = 0; k < p.engine.num_units(); ++k)
    for (const shard::FlatEntry& e : p.engine.layout(k).entries)
      if (e.info.name == "model.layers.1.self_attn.o_proj.weight") p.engine.owned_state(k).master.f32()[e.offset + 3] = NAN;
  p.engine.master_weights_changed();
  std::vector<std::vector<float>> before;
  for (int k = 0; k < p.engine.num_units(); ++k) {
    const auto s = p.engine.owned_state(k);
    for (const Tensor& t : {s.master, s.exp_avg, s.exp_avg_sq}) before.emplace_back(t.f32(), t.f32() + t.numel());
  }
  const shard::StepStats st = p.step(m, {batch}, ops::AdamWConfig{.lr = 1e-2}, 2);
  EXPECT_FALSE(st.finite);
  EXPECT_FALSE(std::isfinite(st.loss));
  // The embedding's gradient (unit 0) flows back through the poisoned layer: the first one named.
  EXPECT_EQ(st.nonfinite, "model.embed_tokens.weight (unit model.embed_tokens)");
  size_t i = 0;
  for (int k = 0; k < p.engine.num_units(); ++k) {
    const auto s = p.engine.owned_state(k);
    for (const Tensor& t : {s.master, s.exp_avg, s.exp_avg_sq}) {
      const std::vector<float> now(t.f32(), t.f32() + t.numel());
      ASSERT_EQ(now.size(), before[i].size());
      for (size_t j = 0; j < now.size(); ++j)
        ASSERT_TRUE(now[j] == before[i][j] || (std::isnan(now[j]) && std::isnan(before[i][j]))) << "unit " << k;
      ++i;
    }
  }
}

TEST(Training, OnNonfiniteStopsOrSkipsAndLoadRefusesNonFiniteWeights) {
  const fs::path d = fresh_dir("nonfinite");
  const ModelConfig cfg = preset("tiny");
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(0);
  p.save((d / "init").string(), DType::F32, ~uint64_t(0), "");
  std::string text;
  for (int i = 0; i < 100; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  std::ofstream(d / "corpus.txt") << text;
  // An absurd learning rate sends the weights to ~1e30 after one step: the next loss overflows.
  const std::string base = "model: " + (d / "init").string() + "\noutput_dir: " + (d / "out").string() +
                           "\ndata: {train: " + (d / "corpus.txt").string() +
                           "}\nseq_len: 32\nmicro_batch_size: 4\nmax_steps: 6\noptimizer: {lr: 1e30}\n"
                           "max_grad_norm: 0\neval_every: 0\nprogress: none\n";
  ConfigTree stop_cfg = ConfigTree::parse(base, "run.yaml");
  const std::string stop = error_of([&] { train::run_training(train::read_train_config(stop_cfg)); });
  EXPECT_NE(stop.find("run.yaml: key 'on_nonfinite': step 2: the loss is"), std::string::npos) << stop;
  EXPECT_NE(stop.find("the first non-finite gradient is"), std::string::npos) << stop;
  ConfigTree skip_cfg = ConfigTree::parse(base + "on_nonfinite: skip\nmax_skipped_steps: 2\n", "run.yaml");
  const std::string skip = error_of([&] { train::run_training(train::read_train_config(skip_cfg)); });
  EXPECT_NE(skip.find("run.yaml: key 'max_skipped_steps': step 4: the loss is"), std::string::npos) << skip;
  EXPECT_NE(skip.find("3 non-finite steps in a row"), std::string::npos) << skip;

  // NaN in the weights is refused at load, naming the tensor.
  p.master("model.layers.0.mlp.up_proj.weight").f32()[7] = NAN;
  p.save((d / "nan").string(), DType::F32, ~uint64_t(0), "");
  LocalEngine e(cfg);
  expect_error([&] { shard::load_weights(e.engine, io::ModelWeights((d / "nan").string()), "nan"); },
               "nan: tensor 'model.layers.0.mlp.up_proj.weight': element 7 is nan");
}

// A checkpoint's training state reads back what it wrote, with the keys every checkpoint so far has
// written, and refuses a counter that is not a non-negative JSON integer, naming it.
TEST(ResumeState, TrainingStateKeepsItsKeysAndRefusesCountersThatAreNotIntegers) {
  const train::TrainingState s{7, {1, 3}, 64, 1234, 0.0025};
  const nlohmann::json j = s;
  EXPECT_EQ(j, nlohmann::json::parse(
                   R"({"step": 7, "sampler": {"epoch": 1, "step": 3}, "rows_per_step": 64, "seed": 1234, "lr": 0.0025})"));
  const train::TrainingState back = j.get<train::TrainingState>();
  EXPECT_EQ(back.step, 7);
  EXPECT_EQ(back.sampler, (data::SamplerState{1, 3}));
  EXPECT_EQ(back.rows_per_step, 64);
  EXPECT_EQ(back.seed, 1234u);
  EXPECT_EQ(back.lr, 0.0025);
  nlohmann::json bad = j;
  bad["sampler"]["step"] = 3.5;
  expect_error([&] { (void)bad.get<train::TrainingState>(); }, "malformed training state: 'step' is 3.5");
  bad = j;
  bad["rows_per_step"] = -64;
  expect_error([&] { (void)bad.get<train::TrainingState>(); }, "malformed training state: 'rows_per_step' is -64");
  bad = j;
  bad["seed"] = "1234";
  expect_error([&] { (void)bad.get<train::TrainingState>(); }, "malformed training state: 'seed' is \"1234\"");
}
