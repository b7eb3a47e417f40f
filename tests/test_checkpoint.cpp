// Sharded checkpoints in one process: save and reload through a different unit layout, every
// kind of broken checkpoint reported by name, the newest-complete rule and pruning, and convert.
// (Resuming across world sizes, strategies and a kill -9 mid-save: tests/scripts/checkpoint_cli.sh.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "core/float_bits.h"
#include "core/rng.h"
#include "io/model_files.h"
#include "ops/ops.h"
#include "shard/engine.h"
#include "shard/load.h"
#include "testing.h"

using namespace shardlm;
using shardlm::testing::error_of;
namespace fs = std::filesystem;

namespace {

ModelConfig small_config(int64_t hidden = 64) {
  ModelConfig c = preset("tiny");
  c.num_hidden_layers = 2;
  c.hidden_size = hidden;
  c.initializer_range = 0.1;
  return c;
}

model::Batch make_batch(std::vector<int32_t>& ids, std::vector<int32_t>& targets, int64_t B, int64_t T, int s) {
  ids.resize(size_t(B * T));
  targets.resize(size_t(B * T));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = 3 + int32_t(philox4x32({uint32_t(s), uint32_t(i), 0, 0}, {5, 1})[0] % 200);
    targets[i] = 3 + int32_t(philox4x32({uint32_t(s), uint32_t(i), 1, 0}, {5, 1})[0] % 200);
  }
  model::Batch b;
  b.B = B;
  b.T = T;
  b.ids = ids.data();
  b.targets = targets.data();
  return b;
}

// A model trained a few steps on one process, so its Adam moments are non-zero.
struct Trained {
  ModelConfig cfg;
  std::unique_ptr<comm::Communicator> world = comm::make_local_communicator();
  shard::Mesh mesh;
  std::unique_ptr<shard::ShardedModel> engine;
  explicit Trained(const ModelConfig& c, shard::ShardingConfig sc = {}) : cfg(c) {
    mesh = shard::make_mesh(*world, sc, 1);
    engine = std::make_unique<shard::ShardedModel>(cfg, model::FinetuneSpec{}, sc, mesh);
  }
  void train(int steps) {
    shard::init_random(*engine, 11);
    model::LlamaCompute compute(cfg, DType::F32);
    std::vector<int32_t> ids, targets;
    for (int s = 1; s <= steps; ++s)
      engine->train_step(compute, {make_batch(ids, targets, 2, 8, s)}, ops::AdamWConfig{.lr = 1e-2}, s, 1.0);
  }
  static ckpt::SaveOptions options(const std::string& dir, int64_t step) {
    ckpt::SaveOptions o;
    o.dir = dir;
    o.step = step;
    o.training = {{"step", step}};
    return o;
  }
  ckpt::SaveReport save(const std::string& dir, int64_t step) {
    return ckpt::save_checkpoint(options(dir, step), *engine, cfg, *world);
  }
};

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Per process: ctest runs these tests in parallel processes.
std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / fmt::format("shardlm_ckpt_test_{}_{}", ::getpid(), name);
  fs::remove_all(d);
  return d.string();
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(offset));
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ 0x10);
  f.seekp(std::streamoff(offset));
  f.write(&c, 1);
}

// Saves a trained model once for the tests that break it; each test works on its own copy.
std::string saved_copy(const std::string& name) {
  static const std::string base = [] {
    Trained t(small_config());
    t.train(2);
    const std::string d = fresh_dir("base");
    t.save(d, 2);
    return d;
  }();
  const std::string d = fresh_dir(name);
  fs::copy(base, d, fs::copy_options::recursive);
  return d;
}

}  // namespace

TEST(Checkpoint, ReloadsEveryStateBitwiseIntoAnotherUnitLayout) {
  Trained a(small_config());
  a.train(3);
  const std::string dir = fresh_dir("reload");
  const ckpt::SaveReport r = a.save(dir, 3);
  EXPECT_GT(r.rank_bytes, 0u);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "COMPLETE"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "config.json"));

  // One unit for the whole model instead of root + one per layer: offsets all differ.
  shard::ShardingConfig nowrap;
  nowrap.wrap = shard::WrapPolicy::NoWrap;
  Trained b(small_config(), nowrap);
  ckpt::CheckpointReader reader(dir);
  EXPECT_EQ(reader.step(), 3);
  ckpt::load_checkpoint(reader, *b.engine);
  const auto wa = shardlm::testing::gather_weights(*a.engine), wb = shardlm::testing::gather_weights(*b.engine);
  for (const std::string& name : a.engine->names()) EXPECT_EQ(wa.at(name), wb.at(name)) << name;
  // The optimizer moments too: compare through the flat views of both layouts, by tensor.
  for (int k = 0; k < a.engine->num_units(); ++k) {
    const auto sa = a.engine->owned_state(k);
    for (const shard::FlatEntry& e : a.engine->layout(k).entries) {
      const auto sb = b.engine->owned_state(0);
      const shard::FlatLayout& lb = b.engine->layout(0);
      const auto it = std::find_if(lb.entries.begin(), lb.entries.end(),
                                   [&](const shard::FlatEntry& x) { return x.info.name == e.info.name; });
      ASSERT_NE(it, lb.entries.end());
      const int64_t n = e.info.numel();
      for (auto [ta, tb] : {std::pair{sa.exp_avg, sb.exp_avg}, std::pair{sa.exp_avg_sq, sb.exp_avg_sq}}) {
        const std::vector<float> va(ta.f32() + e.offset, ta.f32() + e.offset + n);
        const std::vector<float> vb(tb.f32() + it->offset, tb.f32() + it->offset + n);
        EXPECT_EQ(va, vb) << e.info.name;
        EXPECT_TRUE(std::any_of(va.begin(), va.end(), [](float x) { return x != 0.0f; }))
            << e.info.name << ": moments should be non-zero after training";
      }
    }
  }
}

namespace {
// One tensor's AdamW moment (exp_avg, or exp_avg_sq with `second`) of a one-process engine, as f32
// whatever the engine keeps: f32, bf16 widened, or 8-bit dequantized (its blocks start with it).
std::vector<float> moment(shard::ShardedModel& engine, const std::string& name, bool second) {
  for (int k = 0; k < engine.num_units(); ++k)
    for (const shard::FlatEntry& e : engine.layout(k).entries) {
      if (e.info.name != name) continue;
      const auto st = engine.owned_state(k);
      const Tensor t = second ? st.exp_avg_sq : st.exp_avg;
      const int64_t n = e.info.numel(), B = ops::kQuant8Block;
      std::vector<float> out(static_cast<size_t>(n));
      if (t.dtype == DType::U8) {
        const int64_t padded = (n + B - 1) / B * B;
        const Tensor absmax = second ? st.exp_avg_sq_absmax : st.exp_avg_absmax;
        std::vector<float> all(static_cast<size_t>(padded));
        ops::dequantize_blockwise8(Tensor::view(all.data(), DType::F32, {padded}), t.slice(e.offset, e.offset + padded),
                                   absmax.slice(e.offset / B, (e.offset + padded) / B), !second);
        std::copy(all.begin(), all.begin() + n, out.begin());
      } else {
        ops::cast(Tensor::view(out.data(), DType::F32, {n}), t.slice(e.offset, e.offset + n));
      }
      return out;
    }
  ADD_FAILURE() << "no tensor " << name;
  return {};
}
// The moments' dtype of a tensor in a run of state dtype `state`: an 8-bit run keeps the embedding's
// unit in f32 (PlannedUnit::state_dtype).
DType state_of(DType state, const std::string& name) {
  return state == DType::U8 && name == "model.embed_tokens.weight" ? DType::F32 : state;
}
// f32 moments as a run keeping them in `state` holds them after reading them from a checkpoint:
// bf16 rounded to nearest, or 8-bit quantized in blocks from the tensor's start (zero padding after).
std::vector<float> kept_as(std::vector<float> v, DType state, bool second) {
  if (state == DType::F32) return v;
  if (state == DType::BF16) {
    for (float& x : v) x = std::bit_cast<float>(bits::bf16_to_f32(bits::f32_to_bf16(std::bit_cast<uint32_t>(x))));
    return v;
  }
  const int64_t n = int64_t(v.size()), B = ops::kQuant8Block, padded = (n + B - 1) / B * B;
  v.resize(size_t(padded), 0.0f);
  std::vector<uint8_t> codes(static_cast<size_t>(padded));
  std::vector<float> absmax(static_cast<size_t>(padded / B));
  const Tensor x = Tensor::view(v.data(), DType::F32, {padded}), c = Tensor::view(codes.data(), DType::U8, {padded});
  const Tensor a = Tensor::view(absmax.data(), DType::F32, {padded / B});
  ops::quantize_blockwise8(c, a, x, !second);
  ops::dequantize_blockwise8(x, c, a, !second);
  v.resize(size_t(n));
  return v;
}
}  // namespace

// optimizer_state_dtype: bf16, and optim: adamw_8bit. The moments are stored as the run keeps them
// (format version 2: bf16, or u8 codes with their absmax) and resume bit for bit into another unit
// layout; a run keeping f32 moments resumes from them widened (dequantized) exactly, and a bf16 or
// 8-bit run from f32 moments rounded (quantized) once. Training continues from a resumed state
// exactly as without the interruption. The async save's staged copy holds the same bytes.
TEST(Checkpoint, LowPrecisionMomentsResumeExactlyAndConvertToAndFromF32) {
  for (DType state : {DType::BF16, DType::U8}) {
    SCOPED_TRACE(dtype_name(state));
    shard::ShardingConfig low;
    low.state_dtype = state;
    Trained a(small_config(), low);
    a.train(3);
    const std::string dir = fresh_dir(fmt::format("{}_state", dtype_name(state)));
    const std::string async_dir = dir + "_async";
    a.save(dir, 3);
    ckpt::CheckpointReader reader(dir);
    EXPECT_EQ(reader.metadata().at("format_version"), 2);
    {
      ckpt::CheckpointSaver saver(true);
      saver.start(Trained::options(async_dir, 3), *a.engine, a.cfg, *a.world);
      saver.finish(*a.world);
      EXPECT_TRUE(file_bytes(fs::path(dir) / "rank_00000.safetensors") ==
                  file_bytes(fs::path(async_dir) / "rank_00000.safetensors"));
    }

    // Another layout: all layers in one unit (NO_WRAP's single unit would also take the
    // embedding, whose 8-bit run keeps its own unit's moments f32: PlannedUnit::state_dtype).
    shard::ShardingConfig low_nowrap = low;
    low_nowrap.wrap = state == DType::U8 ? shard::WrapPolicy::SizeBased : shard::WrapPolicy::NoWrap;
    Trained b(small_config(), low_nowrap), c(small_config());
    ckpt::load_checkpoint(reader, *b.engine);
    ckpt::load_checkpoint(reader, *c.engine);
    for (const std::string& name : a.engine->names())
      for (bool second : {false, true}) {
        const std::vector<float> want = moment(*a.engine, name, second);
        EXPECT_EQ(moment(*b.engine, name, second), want) << name;
        EXPECT_EQ(moment(*c.engine, name, second), want) << name << " (an f32 run)";
        EXPECT_TRUE(std::any_of(want.begin(), want.end(), [](float x) { return x != 0.0f; })) << name;
      }
    // One more step of the resumed run and of the uninterrupted one: the same weights, bit for bit.
    std::vector<int32_t> ids, targets;
    model::LlamaCompute compute(small_config(), DType::F32);
    for (Trained* t : {&a, &b})
      t->engine->train_step(compute, {make_batch(ids, targets, 2, 8, 4)}, ops::AdamWConfig{.lr = 1e-2}, 4, 1.0);
    const auto wa = shardlm::testing::gather_weights(*a.engine), wb = shardlm::testing::gather_weights(*b.engine);
    for (const std::string& name : a.engine->names()) EXPECT_EQ(wa.at(name), wb.at(name)) << name;

    // f32 moments into a low-precision run: rounded or quantized once.
    Trained d(small_config());
    d.train(3);
    const std::string f32_dir = dir + "_from_f32";
    d.save(f32_dir, 3);
    ckpt::CheckpointReader f32_reader(f32_dir);
    EXPECT_EQ(f32_reader.metadata().at("format_version"), 1);
    Trained e(small_config(), low);
    ckpt::load_checkpoint(f32_reader, *e.engine);
    for (const std::string& name : d.engine->names())
      for (bool second : {false, true})
        EXPECT_EQ(moment(*e.engine, name, second), kept_as(moment(*d.engine, name, second), state_of(state, name), second))
            << name;
  }
}

// The moments' stochastic rounding follows each element's place in its tensor, not its offset in
// a unit, and 8-bit blocks start with each tensor: one process trained with one unit per layer and
// with one unit for the whole model computes the same gradients (checked with f32 moments first),
// and so the same bf16 or 8-bit moments. 8-bit: one unit for all layers (SIZE_BASED_WRAP), the
// embedding kept in its own, whose moments stay f32 (PlannedUnit::state_dtype) in both layouts.
TEST(Checkpoint, LowPrecisionMomentsAreTheSameInAnyUnitLayout) {
  for (DType state : {DType::F32, DType::BF16, DType::U8}) {
    shard::ShardingConfig per_layer, whole;
    per_layer.state_dtype = whole.state_dtype = state;
    whole.wrap = state == DType::U8 ? shard::WrapPolicy::SizeBased : shard::WrapPolicy::NoWrap;
    Trained a(small_config(), per_layer), b(small_config(), whole);
    a.train(3);
    b.train(3);
    const auto wa = shardlm::testing::gather_weights(*a.engine), wb = shardlm::testing::gather_weights(*b.engine);
    for (const std::string& name : a.engine->names()) {
      EXPECT_EQ(wa.at(name), wb.at(name)) << name << " (" << dtype_name(state) << " moments)";
      for (bool second : {false, true})
        EXPECT_EQ(moment(*a.engine, name, second), moment(*b.engine, name, second)) << name;
    }
  }
}

// async_checkpoint: the file holds the state of the save step even though the engine's buffers
// change while it is written (the staging copy), and every file of the checkpoint equals a
// synchronous save's byte for byte.
TEST(Checkpoint, AsyncSaveWritesTheStateOfItsStepWhateverTrainingDoesMeanwhile) {
  Trained a(small_config());
  a.train(3);
  const std::string sync_dir = fresh_dir("sync"), async_dir = fresh_dir("async");
  a.save(sync_dir, 3);
  ckpt::CheckpointSaver saver(true);
  saver.start(Trained::options(async_dir, 3), *a.engine, a.cfg, *a.world);
  EXPECT_TRUE(saver.in_flight());
  // What the next steps would do to the state, while the file may still be being written.
  for (int k = 0; k < a.engine->num_units(); ++k) {
    const auto s = a.engine->owned_state(k);
    for (const Tensor& t : {s.master, s.exp_avg, s.exp_avg_sq}) std::fill(t.f32(), t.f32() + t.numel(), 42.0f);
  }
  const ckpt::SaveReport r = saver.finish(*a.world);
  EXPECT_FALSE(saver.in_flight());
  EXPECT_EQ(r.step, 3);
  EXPECT_GT(r.rank_bytes, 0u);
  EXPECT_TRUE(fs::exists(fs::path(async_dir) / "COMPLETE"));
  for (const char* f : {"rank_00000.safetensors", "metadata.json", "COMPLETE", "config.json"})
    EXPECT_TRUE(file_bytes(fs::path(sync_dir) / f) == file_bytes(fs::path(async_dir) / f))
        << f << " differs from the sync save's";
}

TEST(Checkpoint, AFlippedByteIsReportedWithFileTensorAndBlock) {
  const std::string dir = saved_copy("corrupt");
  const std::string file = dir + "/rank_00000.safetensors";
  const io::SafetensorsFile st(file);
  const uint64_t at = st.info("unit1.exp_avg").begin + 100;
  flip_byte(file, at);
  Trained b(small_config());
  ckpt::CheckpointReader reader(dir);  // sizes are intact: only the checksum can tell
  const std::string msg = error_of([&] { ckpt::load_checkpoint(reader, *b.engine); });
  EXPECT_NE(msg.find("rank_00000.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unit1.exp_avg"), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum mismatch in block 0"), std::string::npos) << msg;
}

TEST(Checkpoint, MissingTruncatedAndForeignFilesAreNamedBeforeReading) {
  {
    const std::string dir = saved_copy("missing");
    fs::remove(dir + "/rank_00000.safetensors");
    const std::string msg = error_of([&] { ckpt::CheckpointReader r(dir); });
    EXPECT_NE(msg.find("rank_00000.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  }
  {
    const std::string dir = saved_copy("truncated");
    const std::string file = dir + "/rank_00000.safetensors";
    fs::resize_file(file, fs::file_size(file) - 4);
    const std::string msg = error_of([&] { ckpt::CheckpointReader r(dir); });
    EXPECT_NE(msg.find("rank_00000.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  }
  {
    const std::string dir = saved_copy("incomplete");
    fs::remove(dir + "/COMPLETE");
    const std::string msg = error_of([&] { ckpt::CheckpointReader r(dir); });
    EXPECT_NE(msg.find("incomplete checkpoint"), std::string::npos) << msg;
  }
  {
    const std::string dir = saved_copy("newer");
    nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir + "/metadata.json"));
    meta["format_version"] = ckpt::kFormatVersion + 1;
    std::ofstream(dir + "/metadata.json") << meta.dump();
    const std::string msg = error_of([&] { ckpt::CheckpointReader r(dir); });
    EXPECT_NE(msg.find("metadata.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("newer shardlm"), std::string::npos) << msg;
  }
  {
    const std::string dir = saved_copy("other_model");
    Trained wider(small_config(96));
    ckpt::CheckpointReader reader(dir);
    const std::string msg = error_of([&] { ckpt::load_checkpoint(reader, *wider.engine); });
    EXPECT_NE(msg.find("checkpoint of another model"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.embed_tokens.weight"), std::string::npos) << msg;
  }
}

TEST(Checkpoint, AutoPicksTheNewestCompleteAndPruningKeepsTheNewest) {
  const std::string root = fresh_dir("root");
  Trained t(small_config());
  t.train(1);
  for (int64_t step : {2, 4, 6}) t.save(root + "/" + ckpt::step_dir_name(step), step);
  fs::remove(root + "/" + ckpt::step_dir_name(6) + "/COMPLETE");  // as a save killed mid-way leaves it
  std::vector<std::string> warnings;
  const auto found = ckpt::latest_complete(root, [&](const std::string& w) { warnings.push_back(w); });
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(fs::path(*found).filename(), ckpt::step_dir_name(4));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(ckpt::step_dir_name(6)), std::string::npos) << warnings[0];

  // Nothing newer than the newest complete checkpoint is touched; older complete ones beyond
  // keep_last_n go, and so do incomplete ones older than it.
  ckpt::prune_checkpoints(root, 1);
  std::vector<int64_t> left;
  for (const ckpt::Found& f : ckpt::list_checkpoints(root)) left.push_back(f.step);
  EXPECT_EQ(left, (std::vector<int64_t>{6, 4}));
  t.save(root + "/" + ckpt::step_dir_name(8), 8);
  ckpt::prune_checkpoints(root, 1);
  left.clear();
  for (const ckpt::Found& f : ckpt::list_checkpoints(root)) left.push_back(f.step);
  EXPECT_EQ(left, (std::vector<int64_t>{8}));
}

TEST(Checkpoint, ConvertWritesTheMasterWeightsInTheAskedDtype) {
  Trained t(small_config());
  t.train(2);
  const std::string dir = fresh_dir("convert_src");
  t.save(dir, 2);
  ckpt::CheckpointReader reader(dir);
  for (DType dtype : {DType::F32, DType::BF16}) {
    const std::string out = fresh_dir(std::string("convert_") + dtype_name(dtype));
    // A tiny shard limit forces several files and an index.
    ckpt::convert_checkpoint(reader, {.out = out, .dtype = dtype, .max_shard_bytes = 200000});
    EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
    EXPECT_EQ(load_model_config(out), [&] {
      ModelConfig c = t.cfg;
      c.torch_dtype = dtype == DType::F32 ? "float32" : "bfloat16";
      return c;
    }());
    const io::ModelWeights w(out);
    EXPECT_EQ(w.names().size(), t.engine->names().size());
    const auto weights = shardlm::testing::gather_weights(*t.engine);
    for (const std::string& name : t.engine->names()) {
      const std::vector<float>& want = weights.at(name);
      std::vector<float> got(want.size());
      const Tensor stored = w.tensor(name);
      ASSERT_EQ(stored.dtype, dtype) << name;
      ops::cast(Tensor::view(got.data(), DType::F32, {int64_t(got.size())}), stored.reshape({stored.numel()}));
      if (dtype == DType::F32) {
        EXPECT_EQ(got, want) << name;
      } else {
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(got[i], bf16_to_f32(f32_to_bf16(want[i]))) << name << "[" << i << "]";
      }
    }
  }
}
