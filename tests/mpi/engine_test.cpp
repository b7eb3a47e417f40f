// The sharding engine against the single-process run, under MPI at 1, 2 and 4 ranks.
//
// Every rank also trains the single-process reference (the same engine on a local communicator,
// world size 1) on the whole global batch, in-process, and compares: step losses, gradient norms
// and the final weights. Each rank
// feeds the engine only its slice of every global batch, as data parallelism does.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string_view>

#include "comm/communicator.h"
#include "mpi_test_main.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "shard/engine.h"
#include "shard/load.h"
#include "io/model_files.h"
#include "model/hf_dir.h"
#include "infer/param_store.h"
#include "ops/nf4.h"
#include "bnb_dir.h"
#include "model/nf4_loader.h"
#include "testing.h"

using namespace shardlm;

static comm::Communicator* g_world = nullptr;

namespace {

constexpr int kSteps = 20, kAccum = 2, kRowsPerMicro = 4, kT = 12;  // global batch: 8 rows of 12 tokens

ModelConfig test_config() {
  ModelConfig c = preset("tiny");
  c.num_hidden_layers = 3;
  c.initializer_range = 0.1;
  return c;
}

// Global micro-batch m of step s: kRowsPerMicro rows with some ignored targets.
data::Example row(int s, int m, int r) {
  data::Example e;
  for (int t = 0; t < kT; ++t) {
    e.ids.push_back(3 + int32_t(philox4x32({uint32_t(s), uint32_t(m), uint32_t(r), uint32_t(t)}, {7, 0})[0] % 250));
    e.targets.push_back(t < (r % 3) ? ops::kIgnoreIndex
                                    : 3 + int32_t(philox4x32({uint32_t(s), uint32_t(m), uint32_t(r), uint32_t(t)}, {8, 0})[0] % 250));
  }
  return e;
}

// A directory of this test job's own: ctest runs engine_np1, np2, np2_mpi and np4 at once, and two
// of them share a world size. Named by rank 0's pid, which the first call (on every rank, in the
// same test) broadcasts.
std::string job_dir(const std::string& name) {
  static const int64_t pid = [] {
    int64_t p = ::getpid();
    g_world->broadcast_bytes(&p, sizeof p, 0);
    return p;
  }();
  return ::testing::TempDir() + fmt::format("shardlm_engine_{}_{}", pid, name);
}

struct Case {
  const char* name;
  shard::ShardingConfig cfg;
  int checkpoint_every = 0;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  auto add = [&](const char* name, shard::Strategy s, auto tweak) {
    shard::ShardingConfig c;
    c.strategy = s;
    c.shard_group_size = std::min(2, g_world->size());
    tweak(c);
    out.push_back({name, c});
  };
  auto none = [](shard::ShardingConfig&) {};
  add("NO_SHARD", shard::Strategy::NoShard, none);
  add("ZERO1", shard::Strategy::Zero1, none);
  add("SHARD_GRAD_OP", shard::Strategy::ShardGradOp, none);
  add("FULL_SHARD", shard::Strategy::FullShard, none);
  add("HYBRID_SHARD", shard::Strategy::HybridShard, none);
  add("_HYBRID_SHARD_ZERO2", shard::Strategy::HybridShardZero2, none);
  add("FULL_SHARD size-wrap fwd-prefetch post", shard::Strategy::FullShard, [](shard::ShardingConfig& c) {
    c.wrap = shard::WrapPolicy::SizeBased;
    c.min_num_params = 60000;  // two decoder layers per unit
    c.forward_prefetch = true;
    c.backward_prefetch = shard::BackwardPrefetch::Post;
  });
  add("FULL_SHARD no-wrap no_sync", shard::Strategy::FullShard, [](shard::ShardingConfig& c) {
    c.wrap = shard::WrapPolicy::NoWrap;
    c.reduce_every_microbatch = false;
  });
  add("FULL_SHARD activation checkpointing", shard::Strategy::FullShard, none);
  out.back().checkpoint_every = 1;  // recomputation happens while the unit is gathered for backward
  return out;
}

}  // namespace

// Trains `cfg` under every strategy and compares with the single-process run, AdamW's moments kept
// in `state_dtype`.
static void expect_every_strategy_matches_one_process(const ModelConfig& cfg, const model::FinetuneSpec& ft = {},
                                                      DType state_dtype = DType::F32) {
  const int W = g_world->size(), R = g_world->rank();
  ASSERT_EQ(kRowsPerMicro % W, 0);
  ops::AdamWConfig opt;
  opt.lr = 1e-3;
  opt.weight_decay = 0.1;
  // A larger epsilon than AdamW's 1e-8 keeps the update a smooth function of the gradient. With
  // 1e-8, an element whose gradient is near zero on some step (an embedding row whose contributions
  // nearly cancel) moves by up to ~lr in a direction the rounding noise picks, and the order of f32
  // sums differs between 1 and W ranks: at 4 ranks such elements ended 6e-4 apart (3e-3 under
  // clang's ASan build) while the losses agreed to 1e-5. With 1e-5 the worst element over every
  // strategy is 2.6e-6 at 4 ranks and 1.1e-6 at 2, so the weights can be checked tightly.
  opt.eps = 1e-5;

  // The reference: one process, the whole global batch.
  const std::unique_ptr<comm::Communicator> local = comm::make_local_communicator();
  shard::ShardingConfig one_process;
  one_process.state_dtype = state_dtype;
  shard::Mesh ref_mesh = shard::make_mesh(*local, one_process, 1);
  shard::ShardedModel ref(cfg, ft, one_process, ref_mesh);
  shard::init_random(ref, 5);
  model::LlamaCompute ref_model(cfg, DType::F32, Device::CPU, ft.lora);
  std::vector<shard::StepStats> ref_steps;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<data::BatchBuffers> bufs;
    for (int m = 0; m < kAccum; ++m) {
      std::vector<data::Example> rows;
      for (int r = 0; r < kRowsPerMicro; ++r) rows.push_back(row(s, m, r));
      bufs.push_back(data::make_batch(rows, kT, 0));
    }
    std::vector<model::Batch> micro;
    for (const auto& b : bufs) micro.push_back(b.batch());
    ref_steps.push_back(ref.train_step(ref_model, micro, opt, s + 1, 1.0));
  }
  const auto ref_weights = shardlm::testing::gather_weights(ref);

  // 8-bit moments: a code moved by a last-bit difference of a gradient changes the next steps'
  // losses a little, and over twenty steps that grows; 1.4e-5 of the loss was the worst seen
  // (clang's build), so 1e-4 there. A wrong reduction moves the loss by the world size.
  const double loss_tolerance = state_dtype == DType::U8 ? 1e-4 : 1e-5;
  for (Case tc : cases()) {
    // Low-precision moments: the six strategies; the wrap, prefetch, no_sync and checkpointing
    // variants change nothing the optimizer sees (and cost the suite time at 4 ranks).
    if (state_dtype != DType::F32 && std::string_view(tc.name).find(' ') != std::string_view::npos) continue;
    SCOPED_TRACE(tc.name);
    tc.cfg.state_dtype = state_dtype;
    shard::Mesh mesh = shard::make_mesh(*g_world, tc.cfg, std::min(W, 2));
    shard::ShardedModel engine(cfg, ft, tc.cfg, mesh);
    shard::init_random(engine, 5);
    model::LlamaCompute compute(cfg, DType::F32, Device::CPU, ft.lora);
    compute.set_checkpointing(tc.checkpoint_every);
    for (int s = 0; s < kSteps; ++s) {
      std::vector<data::BatchBuffers> bufs;
      for (int m = 0; m < kAccum; ++m) {
        std::vector<data::Example> rows;  // this rank's contiguous slice of the global micro-batch
        const int per = kRowsPerMicro / W;
        for (int r = R * per; r < (R + 1) * per; ++r) rows.push_back(row(s, m, r));
        bufs.push_back(data::make_batch(rows, kT, 0));
      }
      std::vector<model::Batch> micro;
      for (const auto& b : bufs) micro.push_back(b.batch());
      const shard::StepStats st = engine.train_step(compute, micro, opt, s + 1, 1.0);
      EXPECT_EQ(st.tokens, ref_steps[size_t(s)].tokens);
      EXPECT_NEAR(st.loss, ref_steps[size_t(s)].loss, loss_tolerance * ref_steps[size_t(s)].loss) << "step " << s + 1;
      EXPECT_NEAR(st.grad_norm, ref_steps[size_t(s)].grad_norm, 1e-4 * ref_steps[size_t(s)].grad_norm) << "step " << s + 1;
    }
    // Losses (1e-5) and gradient norms (1e-4) above catch a wrong reduction (an average where the
    // global 1/tokens scaling needs a sum changes both by the world size); the final weights, to
    // 2e-5 (8x the worst seen), catch a wrong optimizer shard or a missed update (lr = 1e-3). With
    // bf16 moments a gradient that differs in its last f32 bit (another order of the sums) can
    // tip a stochastic rounding the other way: one bf16 ulp of a moment, about 4e-6 of an update;
    // the worst seen over the twenty steps was 3.1e-5, so 1e-4 there, a tenth of one missed update.
    const double weight_tolerance = state_dtype == DType::F32 ? 2e-5 : state_dtype == DType::BF16 ? 1e-4 : 1e-3;
    const auto weights = shardlm::testing::gather_weights(engine);
    for (const std::string& name : engine.names()) {
      const std::vector<float>& got = weights.at(name);
      const std::vector<float>& want = ref_weights.at(name);
      double worst = 0;
      size_t at = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (std::fabs(got[i] - want[i]) > worst) {
          worst = std::fabs(got[i] - want[i]);
          at = i;
        }
      EXPECT_LT(worst, weight_tolerance) << name << "[" << at << "]: " << got[at] << " vs " << want[at];
    }
  }
}

TEST(Engine, EveryStrategyMatchesTheSingleProcessRun) { expect_every_strategy_matches_one_process(test_config()); }

// optimizer_state_dtype: bf16. Each moment's stochastic rounding draws by the element's place in
// its tensor (ops::adamw_step), not by the rank that owns it, so sharded runs round as one process.
TEST(Engine, Bf16MomentsUnderEveryStrategyMatchTheSingleProcessRun) {
  expect_every_strategy_matches_one_process(test_config(), {}, DType::BF16);
}

// optim: adamw_8bit. Quantization blocks start with each tensor and each rank's shard (the plan
// aligns both), so a block is quantized whole by one rank, as in one process. Losses and gradient
// norms match one process (losses to 1e-4: see above); the weights only to 1e-3: a gradient
// that differs in its last bit (another order of the sums) can move a moment to the next 8-bit
// code, a few percent of that element's update (7e-4 was the worst seen over the twenty steps).
// What each rank does with its own gradients is checked exactly below.
TEST(Engine, EightBitMomentsUnderEveryStrategyMatchTheSingleProcessRun) {
  expect_every_strategy_matches_one_process(test_config(), {}, DType::U8);
}

// After one step from zero moments, m = (1 - beta1) g and v = (1 - beta2) g^2 of the rank's own
// reduced gradients; each rank's 8-bit state must be exactly their blockwise quantization, whatever
// the strategy (its shard's blocks, absmax and codes in place, m signed and v unsigned). The
// embedding's unit keeps f32 moments (PlannedUnit::state_dtype): there they are m and v exactly.
TEST(Engine, EightBitMomentsAreEachRanksGradientsQuantizedInPlace) {
  const ModelConfig cfg = test_config();
  for (shard::Strategy strategy : {shard::Strategy::NoShard, shard::Strategy::Zero1, shard::Strategy::FullShard,
                                   shard::Strategy::HybridShard}) {
    SCOPED_TRACE(shard::strategy_name(strategy));
    shard::ShardingConfig sc;
    sc.strategy = strategy;
    sc.state_dtype = DType::U8;
    sc.shard_group_size = std::min(2, g_world->size());
    shard::Mesh mesh = shard::make_mesh(*g_world, sc, std::min(g_world->size(), 2));
    shard::ShardedModel engine(cfg, {}, sc, mesh);
    shard::init_random(engine, 5);
    model::LlamaCompute compute(cfg, DType::F32);
    const int W = g_world->size(), R = g_world->rank(), per = kRowsPerMicro / W;
    std::vector<data::Example> rows;
    for (int r = R * per; r < (R + 1) * per; ++r) rows.push_back(row(0, 0, r));
    const data::BatchBuffers b = data::make_batch(rows, kT, 0);
    ops::AdamWConfig opt;
    engine.train_step(compute, {b.batch()}, opt, 1, 0.0);  // no clipping: the gradients as reduced
    const float w1 = float(1.0 - opt.beta1), w2 = float(1.0 - opt.beta2);
    for (int k = 0; k < engine.num_units(); ++k) {
      const auto st = engine.owned_state(k);
      if (st.numel == 0) continue;
      const Tensor g = engine.owned_grad(k);
      ASSERT_EQ(st.numel % ops::kQuant8Block, 0);
      std::vector<float> m(static_cast<size_t>(st.numel)), v(m), absmax(static_cast<size_t>(st.numel / ops::kQuant8Block));
      for (int64_t i = 0; i < st.numel; ++i) {
        const float gi = g.f32()[i];
        m[size_t(i)] = w1 * gi;
        v[size_t(i)] = (w2 * gi) * gi;
      }
      const bool embedding = engine.plan().units[size_t(k)].parts.front() == 0;
      ASSERT_EQ(st.exp_avg.dtype, embedding ? DType::F32 : DType::U8) << "unit " << k;
      if (embedding) {
        EXPECT_EQ(std::memcmp(st.exp_avg.data, m.data(), m.size() * 4), 0) << "unit " << k << " f32 m";
        EXPECT_EQ(std::memcmp(st.exp_avg_sq.data, v.data(), v.size() * 4), 0) << "unit " << k << " f32 v";
        continue;
      }
      std::vector<uint8_t> codes(m.size());
      const Tensor c = Tensor::view(codes.data(), DType::U8, {st.numel});
      const Tensor a = Tensor::view(absmax.data(), DType::F32, {int64_t(absmax.size())});
      for (bool second : {false, true}) {
        ops::quantize_blockwise8(c, a, Tensor::view((second ? v : m).data(), DType::F32, {st.numel}), !second);
        const Tensor have = second ? st.exp_avg_sq : st.exp_avg, have_absmax = second ? st.exp_avg_sq_absmax : st.exp_avg_absmax;
        EXPECT_EQ(std::memcmp(have.data, codes.data(), codes.size()), 0) << "unit " << k << (second ? " v" : " m") << " codes";
        EXPECT_EQ(std::memcmp(have_absmax.data, absmax.data(), absmax.size() * 4), 0) << "unit " << k << " absmax";
      }
    }
  }
}

// LoRA: the frozen base in its own buffers (sharded where parameters are), only the adapters
// trained; every strategy, checkpointing and no_sync included, equals one process.
TEST(Engine, LoraUnderEveryStrategyMatchesTheSingleProcessRun) {
  const ModelConfig cfg = test_config();
  model::FinetuneSpec ft;
  ft.lora = model::LoraSpec{.rank = 4, .alpha = 8, .target_modules = {"all-linear"}};
  expect_every_strategy_matches_one_process(cfg, ft);
  ft.lora = model::LoraSpec{.rank = 2, .alpha = 3, .target_modules = {"q_proj", "v_proj", "down_proj"}, .use_rslora = true};
  expect_every_strategy_matches_one_process(cfg, ft);
}

// DoRA: the magnitude vectors are trained beside A and B (sharded with them, initialized by each
// rank from its own rows of the base): every strategy equals one process, with dropout too.
TEST(Engine, DoraUnderEveryStrategyMatchesTheSingleProcessRun) {
  const ModelConfig cfg = test_config();
  model::FinetuneSpec ft;
  ft.lora = model::LoraSpec{.rank = 4, .alpha = 8, .dropout = 0.1, .target_modules = {"all-linear"}, .use_dora = true};
  expect_every_strategy_matches_one_process(cfg, ft);
}

// PEFT's DoRA starts as the base model: B = 0 and each magnitude is its base weight's row norms, so
// the first logits are the base's (to rounding: m / ||W|| is 1 within an ulp).
TEST(Engine, DoraStartsAsTheBaseModel) {
  const ModelConfig cfg = test_config();
  model::FinetuneSpec dora;
  dora.lora = model::LoraSpec{.rank = 4, .alpha = 8, .target_modules = {"all-linear"}, .use_dora = true};
  std::vector<data::Example> rows;
  for (int r = 0; r < kRowsPerMicro; ++r) rows.push_back(row(0, 0, r));
  const data::BatchBuffers b = data::make_batch(rows, kT, 0);
  const std::unique_ptr<comm::Communicator> local = comm::make_local_communicator();
  // The logits of the model `ft` describes, its magnitudes scaled by `m_scale`.
  auto logits = [&](const model::FinetuneSpec& ft, float m_scale) {
    shard::ShardingConfig sc;
    shard::Mesh mesh = shard::make_mesh(*local, sc, 1);
    shard::ShardedModel engine(cfg, ft, sc, mesh);
    shard::init_random(engine, 5);
    if (m_scale != 1.0f) {
      auto w = shardlm::testing::gather_weights(engine);
      for (auto& [name, v] : w)
        if (name.ends_with(".lora_magnitude_vector"))
          for (float& x : v) x *= m_scale;
      shardlm::testing::set_weights(engine, w);
    }
    model::LlamaCompute compute(cfg, DType::F32, Device::CPU, ft.lora);
    std::vector<float> out(size_t(b.B * b.T * cfg.vocab_size));
    engine.forward_logits(compute, b.batch(), Tensor::view(out.data(), DType::F32, {b.B * b.T, cfg.vocab_size}));
    return out;
  };
  auto max_diff = [](const std::vector<float>& x, const std::vector<float>& y) {
    float d = 0;
    for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::abs(x[i] - y[i]));
    return d;
  };
  const std::vector<float> base = logits({}, 1.0f);
  EXPECT_LT(max_diff(logits(dora, 1.0f), base), 1e-5f);
  // Not vacuous: magnitudes other than ||W|| change the logits.
  EXPECT_GT(max_diff(logits(dora, 1.1f), base), 1e-2f);
}

// A model whose Linear weights span several NF4 groups of 16384 (so their chunks are spread over
// the ranks), for QLoRA.
static ModelConfig qlora_config() {
  ModelConfig c = test_config();
  c.hidden_size = 128;
  c.intermediate_size = 384;  // gate/up/down: 49152 weights, 3 groups
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  return c;
}
// QLoRA (nf4_base) or, without it, LoRA on a dense base; the same adapters either way.
static model::FinetuneSpec qlora_spec(bool double_quant, bool nf4_base = true, bool dora = false) {
  return {.lora = model::LoraSpec{.rank = 4, .alpha = 8, .target_modules = {"all-linear"}, .use_dora = dora},
          .nf4_base = nf4_base,
          .nf4_double_quant = double_quant};
}

// QLoRA: each rank quantizes its chunks, the offset is summed over the group, chunks are gathered
// and dequantized per visit: every strategy equals one process.
TEST(Engine, QloraUnderEveryStrategyMatchesTheSingleProcessRun) {
  expect_every_strategy_matches_one_process(qlora_config(), qlora_spec(true));
  expect_every_strategy_matches_one_process(qlora_config(), qlora_spec(false));
}

// QDoRA: DoRA's magnitudes start at the row norms of the NF4-rounded base, each rank's from its rows.
TEST(Engine, QdoraUnderEveryStrategyMatchesTheSingleProcessRun) {
  expect_every_strategy_matches_one_process(qlora_config(), qlora_spec(true, true, true));
}

// QLoRA trains on exactly the NF4 rounding of the base: its losses equal those of LoRA on a base
// that was quantized and dequantized whole by the NF4 ops (in one process). So does QDoRA, whose
// magnitudes start at the norms of that rounded base (DoRA's weight norm is of the dequantized W).
static void expect_nf4_base_equals_rounded_base(bool dora) {
  const ModelConfig cfg = qlora_config();
  const model::FinetuneSpec qlora = qlora_spec(true, true, dora), lora = qlora_spec(true, false, dora);
  const std::string dir = job_dir("qlora_base"), rounded = job_dir("qlora_rounded");
  if (g_world->rank() == 0) {
    infer::ParamStore store(cfg, DType::F32);
    store.init_random(11);
    store.save(dir, DType::F32, 1 << 30, "");
    for (const model::ModelPart& part : model::llama_parts(cfg, qlora))
      for (const model::ParamInfo& info : part.params) {
        if (!info.nf4) continue;
        const Tensor w = store.master(info.name);
        const ops::Nf4Layout layout = ops::Nf4Layout::of(w.numel(), true);
        std::vector<uint8_t> bytes(layout.total_bytes);
        const ops::Nf4Tensor q = ops::nf4_view(bytes.data(), layout, info.shape, DType::F32);
        ops::nf4_quantize(q, w);
        ops::nf4_dequantize(w, q);
      }
    store.save(rounded, DType::F32, 1 << 30, "");
  }
  g_world->barrier();
  ops::AdamWConfig opt;
  opt.lr = 1e-2;
  auto losses = [&](const model::FinetuneSpec& ft, const std::string& model_dir, comm::Communicator& world) {
    shard::ShardingConfig sc;
    sc.strategy = shard::Strategy::FullShard;
    shard::Mesh mesh = shard::make_mesh(world, sc, 1);
    shard::ShardedModel engine(cfg, ft, sc, mesh);
    shard::load_weights(engine, io::ModelWeights(model_dir), model_dir, 3);
    model::LlamaCompute compute(cfg, DType::F32, Device::CPU, ft.lora);
    std::vector<double> out;
    const int W = world.size(), R = world.rank(), per = kRowsPerMicro / W;
    for (int s = 0; s < 4; ++s) {
      std::vector<data::Example> rows;
      for (int r = R * per; r < (R + 1) * per; ++r) rows.push_back(row(s, 0, r));
      const data::BatchBuffers b = data::make_batch(rows, kT, 0);
      out.push_back(engine.train_step(compute, {b.batch()}, opt, s + 1, 1.0).loss);
    }
    return out;
  };
  const std::unique_ptr<comm::Communicator> local = comm::make_local_communicator();
  const std::vector<double> want = losses(lora, rounded, *local), got = losses(qlora, dir, *g_world);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6 * want[i]) << "step " << i + 1;
}
TEST(Engine, QloraEqualsLoraOnTheNf4RoundedBase) { expect_nf4_base_equals_rounded_base(false); }
TEST(Engine, QdoraEqualsDoraOnTheNf4RoundedBase) { expect_nf4_base_equals_rounded_base(true); }

// ---- directories saved by transformers with bitsandbytes 4-bit (model/nf4_loader.h) -------------

namespace {

// What a run loaded from a model directory computes under `strategy` over `world`: the logits of
// this rank's slice of a first batch before any step, then the losses of a few steps.
struct LoadedRun {
  std::vector<float> logits;
  std::vector<double> losses;
};
LoadedRun run_loaded(const model::FinetuneSpec& ft, const std::string& dir, comm::Communicator& world,
                     shard::Strategy strategy = shard::Strategy::FullShard) {
  const ModelConfig cfg = qlora_config();
  shard::ShardingConfig sc;
  sc.strategy = strategy;
  shard::Mesh mesh = shard::make_mesh(world, sc, 1);
  shard::ShardedModel engine(cfg, ft, sc, mesh);
  shard::load_weights(engine, io::ModelWeights(dir), dir, 3);
  model::LlamaCompute compute(cfg, DType::F32, Device::CPU, ft.lora);
  ops::AdamWConfig opt;
  opt.lr = 1e-2;
  const int W = world.size(), R = world.rank(), per = kRowsPerMicro / W;
  LoadedRun out;
  for (int s = 0; s < 4; ++s) {
    std::vector<data::Example> rows;
    for (int r = R * per; r < (R + 1) * per; ++r) rows.push_back(row(s, 0, r));
    const data::BatchBuffers b = data::make_batch(rows, kT, 0);
    if (s == 0) {
      out.logits.resize(size_t(per * kT * cfg.vocab_size));
      engine.forward_logits(compute, b.batch(), Tensor::view(out.logits.data(), DType::F32, {per * kT, cfg.vocab_size}));
    }
    out.losses.push_back(engine.train_step(compute, {b.batch()}, opt, s + 1, 1.0).loss);
  }
  return out;
}

// A bitsandbytes directory of qlora_config's model (written by rank 0 in this job's own directory,
// job_dir) and, beside it, its dequantization in f32.
struct BnbDirs {
  std::string bnb, dense;
};
BnbDirs write_bnb_dirs(const std::string& name, const shardlm::testing::BnbDirOptions& o) {
  const std::string base = job_dir("bnb_" + name);
  BnbDirs d{base + "/bnb", base + "/dense"};
  if (g_world->rank() == 0) {
    const ModelConfig plain = qlora_config();
    infer::ParamStore store(plain, DType::F32);
    store.init_random(11);
    shardlm::testing::write_bnb_dir(d.bnb, plain, store, o);
    shardlm::testing::write_dequantized_dir(d.bnb, d.dense);
  }
  g_world->barrier();
  return d;
}

}  // namespace

// The reader's pieces the engine uses: any element range dequantizes as the whole weight does,
// and the directory says whether its double quantization can be kept as stored.
TEST(Engine, BitsandbytesDirectoryReadsByRange) {
  struct Variant {
    const char* name;
    shardlm::testing::BnbDirOptions o;
    std::optional<bool> as_stored;
  };
  for (const Variant& v : {Variant{"dq", {.double_quant = true}, true}, Variant{"plain", {.double_quant = false}, false},
                           Variant{"odd_map", {.double_quant = true, .standard_nested_map = false}, false}}) {
    SCOPED_TRACE(v.name);
    const BnbDirs d = write_bnb_dirs(v.name, v.o);
    const model::Nf4ModelReader reader(d.bnb);
    EXPECT_EQ(reader.double_quant_as_stored(), v.as_stored);
    EXPECT_EQ(reader.quantized_names().size(), 7u * 3u);
    EXPECT_EQ(model::Nf4ModelReader(d.dense).double_quant_as_stored(), std::nullopt);
    EXPECT_EQ(reader.state("model.layers.1.mlp.up_proj.weight").standard_nested_map, v.o.standard_nested_map);
    for (const std::string name : {"model.layers.1.mlp.up_proj.weight", "model.layers.2.self_attn.k_proj.weight"}) {
      const OwnedTensor whole = reader.dequantize_f32(name);
      const int64_t n = whole.t.numel();
      for (auto [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{0, n}, {1, 2}, {63, 130}, {16383, 16385},
                                                                     {n - 77, n}, {5000, 5000}}) {
        lo = std::min(lo, n), hi = std::min(hi, n);  // k_proj holds 8192
        std::vector<float> part(size_t(hi - lo));
        reader.dequantize_range(name, lo, hi, part.data());
        if (!part.empty()) {  // memcmp's pointers must not be null, even for no bytes
          EXPECT_EQ(std::memcmp(part.data(), whole.t.f32() + lo, part.size() * 4), 0) << name << " [" << lo << ", " << hi << ")";
        }
      }
    }
  }
}

// QLoRA from a bitsandbytes directory keeps every NF4 state as stored: each rank copies its
// chunk, nothing is re-quantized, so the base it computes with is bitsandbytes' dequantization
// bit for bit, and it computes exactly what LoRA computes on a dense directory holding that
// dequantization (the same logits before any step, the same losses after). With chunks over the
// shard group (FULL_SHARD) and whole on every rank (NO_SHARD). A double-quantized file also reads
// into the plain layout exactly (f32 absmax values computed as bitsandbytes does), as does one
// with a non-standard nested map, which only the plain layout can hold.
TEST(Engine, QloraKeepsABitsandbytesDirectoryAsStored) {
  struct Variant {
    const char* name;
    shardlm::testing::BnbDirOptions o;
    bool double_quant;  // the run's layout (what the trainer chooses: the file's)
  };
  for (const Variant& v : {Variant{"dq", {.double_quant = true}, true}, Variant{"dq_read_plain", {.double_quant = true}, false},
                           Variant{"plain", {.double_quant = false}, false},
                           Variant{"odd_map", {.double_quant = true, .standard_nested_map = false}, false}}) {
    SCOPED_TRACE(v.name);
    const BnbDirs d = write_bnb_dirs(v.name, v.o);
    const model::FinetuneSpec qlora = qlora_spec(v.double_quant), lora = qlora_spec(v.double_quant, false);
    for (shard::Strategy s : {shard::Strategy::FullShard, shard::Strategy::NoShard}) {
      SCOPED_TRACE(shard::strategy_name(s));
      const LoadedRun got = run_loaded(qlora, d.bnb, *g_world, s), want = run_loaded(lora, d.dense, *g_world, s);
      ASSERT_EQ(got.logits.size(), want.logits.size());
      EXPECT_EQ(std::memcmp(got.logits.data(), want.logits.data(), got.logits.size() * 4), 0);
      EXPECT_EQ(got.losses, want.losses);
    }
  }
}

// Re-quantizing is never done silently: a double-quantized layout over a file that cannot give
// one as stored is refused, naming lora.double_quant (every rank, before reading anything).
TEST(Engine, QloraRefusesALayoutABitsandbytesDirectoryCannotKeep) {
  for (const auto& [name, o] : {std::pair{"plain", shardlm::testing::BnbDirOptions{.double_quant = false}},
                                std::pair{"odd_map", shardlm::testing::BnbDirOptions{.double_quant = true,
                                                                                      .standard_nested_map = false}}}) {
    SCOPED_TRACE(name);
    const BnbDirs d = write_bnb_dirs(name, o);
    try {
      run_loaded(qlora_spec(true), d.bnb, *g_world);
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("lora.double_quant"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn.q_proj.weight"), std::string::npos) << e.what();
    }
  }
}

// LoRA (a dense frozen base) and full fine-tuning read the NF4 weights of a bitsandbytes
// directory as bitsandbytes dequantizes them: LoRA computes exactly what it computes from the
// dense directory of that dequantization, and full fine-tuning starts from its values.
TEST(Engine, LoraAndFullFineTuningReadABitsandbytesDirectoryDequantized) {
  const BnbDirs d = write_bnb_dirs("dense_runs", {.double_quant = true});
  const model::FinetuneSpec lora = qlora_spec(true, false);
  const LoadedRun want = run_loaded(lora, d.dense, *g_world), got = run_loaded(lora, d.bnb, *g_world);
  EXPECT_EQ(got.logits, want.logits);
  EXPECT_EQ(got.losses, want.losses);

  const ModelConfig full = qlora_config();
  shard::ShardingConfig sc;
  sc.strategy = shard::Strategy::FullShard;
  shard::Mesh mesh = shard::make_mesh(*g_world, sc, 1);
  shard::ShardedModel engine(full, {}, sc, mesh);
  shard::load_weights(engine, io::ModelWeights(d.bnb), d.bnb);
  const auto weights = shardlm::testing::gather_weights(engine);
  const std::map<std::string, OwnedTensor> dense = model::load_dequantized_f32(d.bnb);
  for (const std::string& name : engine.names()) {
    const std::vector<float>& w = weights.at(name);
    ASSERT_EQ(int64_t(w.size()), dense.at(name).t.numel()) << name;
    EXPECT_EQ(std::memcmp(w.data(), dense.at(name).t.f32(), w.size() * 4), 0) << name;
  }
}

TEST(Engine, OptimizerBytesFallWithTheShardCount) {
  const ModelConfig cfg = test_config();
  auto optimizer_bytes = [&](shard::Strategy s) {
    shard::ShardingConfig c;
    c.strategy = s;
    shard::Mesh mesh = shard::make_mesh(*g_world, c, 1);
    const int64_t before = MemoryTracker::for_device(Device::CPU).stats().live[int(MemCategory::Optimizer)];
    shard::ShardedModel engine(cfg, {}, c, mesh);
    return MemoryTracker::for_device(Device::CPU).stats().live[int(MemCategory::Optimizer)] - before;
  };
  const double full = double(optimizer_bytes(shard::Strategy::NoShard));
  const double sharded = double(optimizer_bytes(shard::Strategy::FullShard));
  EXPECT_NEAR(sharded * g_world->size() / full, 1.0, 0.01);  // padding adds at most a few elements
}

namespace {
// One step of the engine on this rank's slice of a global batch of `global_rows` rows, split into
// `micro_batches` micro-batches.
shard::StepStats one_step(shard::ShardedModel& engine, model::LlamaCompute& compute, int step, int micro_batches,
                          const ops::AdamWConfig& opt, int global_rows = kRowsPerMicro) {
  const int W = g_world->size(), R = g_world->rank();
  const int rows_per_micro = global_rows / micro_batches;
  std::vector<data::BatchBuffers> bufs;
  for (int m = 0; m < micro_batches; ++m) {
    std::vector<data::Example> rows;
    const int per = rows_per_micro / W;
    for (int r = R * per; r < (R + 1) * per; ++r) rows.push_back(row(step, 0, m * rows_per_micro + r));
    bufs.push_back(data::make_batch(rows, kT, 0));
  }
  std::vector<model::Batch> micro;
  for (const auto& b : bufs) micro.push_back(b.batch());
  return engine.train_step(compute, micro, opt, step + 1, 1.0);
}
}  // namespace

TEST(Engine, BytesPerStepMatchZeroTheory) {
  // Per step with one micro-batch, in units of the (padded) parameter count Psi, ring accounting:
  // NO_SHARD all-reduce 2 Psi; ZERO1 reduce-scatter + all-gather 2 Psi; SHARD_GRAD_OP 2 Psi;
  // FULL_SHARD 3 Psi, less one all-gather of the head, whose forward and backward are one visit,
  // and one of the embedding, whose backward reads no parameters.
  const ModelConfig cfg = test_config();
  const int W = g_world->size();
  for (shard::Strategy s : {shard::Strategy::NoShard, shard::Strategy::Zero1, shard::Strategy::ShardGradOp,
                            shard::Strategy::FullShard}) {
    SCOPED_TRACE(shard::strategy_name(s));
    shard::ShardingConfig c;
    c.strategy = s;
    shard::Mesh mesh = shard::make_mesh(*g_world, c, 1);
    shard::ShardedModel engine(cfg, {}, c, mesh);
    shard::init_random(engine, 1);
    model::LlamaCompute compute(cfg, DType::F32);
    mesh.shard->reset_stats();
    one_step(engine, compute, 0, 1, {});
    const comm::CommStats& st = mesh.shard->stats();
    // FULL_SHARD gathers every unit twice (forward, backward) except the head (untied in this
    // model), whose forward and backward are one visit, and the embedding, gathered only forward.
    const int64_t psi = engine.plan().padded_numel(), head = engine.layout(engine.num_units() - 1).padded_numel;
    const int64_t embed = engine.layout(0).padded_numel;
    auto ring = [&](int64_t elems) { return elems * 4 * (W - 1) / W; };
    switch (s) {
      case shard::Strategy::NoShard:
        EXPECT_EQ(st.all_reduce_bytes, 2 * ring(psi));
        EXPECT_EQ(st.all_gather_bytes + st.reduce_scatter_bytes, 0);
        break;
      case shard::Strategy::Zero1:
      case shard::Strategy::ShardGradOp:
        EXPECT_EQ(st.reduce_scatter_bytes, ring(psi));
        EXPECT_EQ(st.all_gather_bytes, ring(psi));
        break;
      default:
        EXPECT_EQ(st.reduce_scatter_bytes, ring(psi));
        EXPECT_EQ(st.all_gather_bytes, 2 * ring(psi) - ring(head) - ring(embed));
    }
    EXPECT_EQ(st.all_reduce_bytes + st.all_gather_bytes + st.reduce_scatter_bytes,
              s == shard::Strategy::FullShard ? 3 * ring(psi) - ring(head) - ring(embed) : 2 * ring(psi));
  }
}

TEST(Engine, GradientBytesFallWithTheShardCount) {
  // After a step NO_SHARD keeps full gradients; sharded strategies keep 1/W of them.
  const ModelConfig cfg = test_config();
  auto gradient_bytes = [&](shard::Strategy s) {
    shard::ShardingConfig c;
    c.strategy = s;
    shard::Mesh mesh = shard::make_mesh(*g_world, c, 1);
    const int64_t before = MemoryTracker::for_device(Device::CPU).stats().live[int(MemCategory::Gradients)];
    shard::ShardedModel engine(cfg, {}, c, mesh);
    shard::init_random(engine, 1);
    model::LlamaCompute compute(cfg, DType::F32);
    one_step(engine, compute, 0, 1, {});
    return double(MemoryTracker::for_device(Device::CPU).stats().live[int(MemCategory::Gradients)] - before);
  };
  const double full = gradient_bytes(shard::Strategy::NoShard);
  EXPECT_NEAR(gradient_bytes(shard::Strategy::FullShard) * g_world->size() / full, 1.0, 0.01);
  EXPECT_NEAR(gradient_bytes(shard::Strategy::ShardGradOp) * g_world->size() / full, 1.0, 0.01);
}

TEST(Engine, TwoMicroBatchesEqualOneBatchTwiceTheSize) {
  const ModelConfig cfg = test_config();
  for (bool no_sync : {false, true}) {
    SCOPED_TRACE(no_sync ? "no_sync" : "reduce every micro-batch");
    shard::ShardingConfig c;
    c.strategy = shard::Strategy::FullShard;
    c.reduce_every_microbatch = !no_sync;
    shard::Mesh mesh = shard::make_mesh(*g_world, c, 1);
    shard::ShardedModel one(cfg, {}, c, mesh), two(cfg, {}, c, mesh);
    shard::init_random(one, 9);
    shard::init_random(two, 9);
    model::LlamaCompute compute(cfg, DType::F32);
    ops::AdamWConfig opt;
    opt.lr = 1e-3;
    for (int s = 0; s < 3; ++s) {
      const shard::StepStats a = one_step(one, compute, s, 1, opt, 8);
      const shard::StepStats b = one_step(two, compute, s, 2, opt, 8);
      EXPECT_EQ(a.tokens, b.tokens);
      EXPECT_NEAR(a.loss, b.loss, 1e-6 * a.loss);
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-5 * a.grad_norm);
    }
  }
}

TEST(Engine, EachRankLoadsItsShardOfAHuggingFaceDirectory) {
  // Rank 0 writes a model (bf16 on disk); every rank then reads only its shard's byte ranges.
  // Gathering the shards back must give the file's values exactly.
  const ModelConfig cfg = test_config();
  const std::string dir = job_dir("engine_load_model");
  infer::ParamStore src(cfg, DType::F32);
  src.init_random(17);
  if (g_world->rank() == 0) src.save(dir, DType::BF16, 200000, "");  // several shard files
  g_world->barrier();
  for (shard::Strategy s : {shard::Strategy::FullShard, shard::Strategy::NoShard}) {
    shard::ShardingConfig c;
    c.strategy = s;
    shard::Mesh mesh = shard::make_mesh(*g_world, c, 1);
    shard::ShardedModel engine(cfg, {}, c, mesh);
    shard::load_weights(engine, io::ModelWeights(dir), dir);
    const auto weights = shardlm::testing::gather_weights(engine);
    for (const std::string& name : engine.names()) {
      const std::vector<float>& got = weights.at(name);
      const Tensor want = src.master(name);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], bf16_to_f32(f32_to_bf16(want.f32()[i]))) << shard::strategy_name(s) << " " << name << "[" << i << "]";
    }
  }
}

TEST(Engine, Bf16MixedPrecisionTracksF32) {
  // param_dtype bf16 (gathers and compute) and reduce_dtype bf16 (gradient communication) with f32
  // master weights and AdamW: losses stay within bf16 precision of the f32 run (1%).
  const ModelConfig cfg = test_config();
  ops::AdamWConfig opt;
  opt.lr = 1e-3;
  std::vector<double> losses[2];
  for (int mixed = 0; mixed < 2; ++mixed) {
    shard::ShardingConfig c;
    c.strategy = shard::Strategy::FullShard;
    if (mixed) c.param_dtype = c.reduce_dtype = DType::BF16;
    shard::Mesh mesh = shard::make_mesh(*g_world, c, 1);
    shard::ShardedModel engine(cfg, {}, c, mesh);
    shard::init_random(engine, 4);
    model::LlamaCompute compute(cfg, c.param_dtype);
    for (int s = 0; s < 4; ++s) losses[mixed].push_back(one_step(engine, compute, s, 1, opt).loss);
  }
  for (size_t s = 0; s < losses[0].size(); ++s) EXPECT_NEAR(losses[1][s], losses[0][s], 0.01 * losses[0][s]) << "step " << s + 1;
}

TEST(Engine, ImpossibleMeshIsRefusedBeforeAnyWork) {
  shard::ShardingConfig c;
  c.strategy = shard::Strategy::HybridShard;
  c.shard_group_size = g_world->size() + 1;  // never divides the world
  EXPECT_THROW(shard::make_mesh(*g_world, c, 1), Error);
}

int main(int argc, char** argv) { return shardlm::testing::run_mpi_tests(argc, argv, g_world); }
