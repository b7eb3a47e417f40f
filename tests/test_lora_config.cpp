// The `lora:` section of a training config (src/train/train_config.cpp, docs/lora.md): PEFT's and
// torchtune's key names, the defaults, and one-line errors naming the file, line and key.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "testing.h"
#include "train/train_config.h"

using namespace shardlm;
using shardlm::testing::error_of;
using shardlm::testing::expect_error;
using Modules = std::vector<std::string>;

namespace {

const std::string kHead = "model: models/llama\noutput_dir: o\ndata: {train: x.txt}\n";  // lines 1-3

train::TrainConfig read(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  ConfigTree t = ConfigTree::parse(kHead + yaml, "run.yaml");
  t.apply_overrides(overrides);
  return train::read_train_config(t);
}

// The error reading `yaml` (after kHead) gives.
std::string error_reading(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { read(yaml, overrides); });
}

}  // namespace

TEST(LoraConfig, AbsentMeansNoLora) {
  const train::TrainConfig c = read("");
  EXPECT_FALSE(c.lora.has_value());
  EXPECT_FALSE(c.lora_quantize_base);
  EXPECT_TRUE(c.lora_double_quant);
  EXPECT_FALSE(c.merge_on_save);
  // A null section is "not set", as everywhere in a config; so is `lora=null` on the command line.
  EXPECT_FALSE(read("lora:\n").lora.has_value());
  EXPECT_FALSE(read("lora: {rank: 4}\n", {"lora=null"}).lora.has_value());
}

TEST(LoraConfig, Defaults) {
  for (const std::string yaml : {"lora: {}\n", "lora:\n  use_rslora: false\n", "lora: {quantize_base: none}\n"}) {
    const train::TrainConfig c = read(yaml);
    ASSERT_TRUE(c.lora.has_value()) << yaml;
    EXPECT_EQ(c.lora->rank, 8);
    EXPECT_DOUBLE_EQ(c.lora->alpha, 16);
    EXPECT_DOUBLE_EQ(c.lora->dropout, 0);
    EXPECT_EQ(c.lora->target_modules, (Modules{"q_proj", "v_proj"}));
    EXPECT_FALSE(c.lora->use_rslora);
    EXPECT_FALSE(c.lora->use_dora);
    EXPECT_EQ(c.lora->init, model::LoraInit::Kaiming);
    EXPECT_EQ(c.lora->base_model_name_or_path, "models/llama");
    EXPECT_EQ(c.lora->task_type, "CAUSAL_LM");
    EXPECT_FALSE(c.lora_quantize_base);
    EXPECT_TRUE(c.lora_double_quant);
    EXPECT_FALSE(c.merge_on_save);
  }
  // A key given on the command line alone turns LoRA on.
  const train::TrainConfig o = read("", {"lora.rank=4"});
  ASSERT_TRUE(o.lora.has_value());
  EXPECT_EQ(o.lora->rank, 4);
}

TEST(LoraConfig, EveryKey) {
  const train::TrainConfig c = read(
      "lora:\n"
      "  rank: 16\n"
      "  alpha: 32\n"
      "  dropout: 0.05\n"
      "  target_modules: [v_proj, down_proj, q_proj]\n"
      "  use_rslora: true\n"
      "  use_dora: true\n"
      "  init: gaussian\n"
      "  quantize_base: nf4\n"
      "  double_quant: false\n"
      "  merge_on_save: true\n");
  ASSERT_TRUE(c.lora.has_value());
  EXPECT_EQ(c.lora->rank, 16);
  EXPECT_DOUBLE_EQ(c.lora->alpha, 32);
  EXPECT_DOUBLE_EQ(c.lora->dropout, 0.05);
  EXPECT_EQ(c.lora->target_modules, (Modules{"q_proj", "v_proj", "down_proj"}));  // in the layer's order
  EXPECT_TRUE(c.lora->use_rslora);
  EXPECT_TRUE(c.lora->use_dora);
  EXPECT_DOUBLE_EQ(c.lora->scale(), 32 / 4.0);
  EXPECT_EQ(c.lora->init, model::LoraInit::Gaussian);
  EXPECT_TRUE(c.lora_quantize_base);
  EXPECT_FALSE(c.lora_double_quant);
  EXPECT_TRUE(c.merge_on_save);
  EXPECT_EQ(read("lora: {init: kaiming}\n").lora->init, model::LoraInit::Kaiming);
}

TEST(LoraConfig, PeftAndTorchtuneNamesAreAliases) {
  for (const std::string key : {"rank", "r", "lora_rank"})
    EXPECT_EQ(read("lora: {" + key + ": 4}\n").lora->rank, 4) << key;
  for (const std::string key : {"alpha", "lora_alpha"})
    EXPECT_DOUBLE_EQ(read("lora: {" + key + ": 8}\n").lora->alpha, 8) << key;
  for (const std::string key : {"dropout", "lora_dropout"})
    EXPECT_DOUBLE_EQ(read("lora: {" + key + ": 0.1}\n").lora->dropout, 0.1) << key;
  EXPECT_TRUE(read("lora: {qlora: true}\n").lora_quantize_base);
  EXPECT_FALSE(read("lora: {qlora: false}\n").lora_quantize_base);
  // Two names of one key: the error names both.
  EXPECT_EQ(
      error_reading("lora:\n  r: 4\n  lora_rank: 8\n"),
      "run.yaml:6: key 'lora.lora_rank': is another name for 'lora.r', which is also set at run.yaml:5; set only one");
  expect_error([&] { read("lora: {quantize_base: nf4, qlora: true}\n"); },
               "key 'lora.qlora': is another name for 'lora.quantize_base'");
  // The command line wins over the file.
  EXPECT_EQ(read("lora: {r: 4}\n", {"lora.rank=2"}).lora->rank, 2);
}

TEST(LoraConfig, TargetModules) {
  EXPECT_EQ(read("lora: {target_modules: all-linear}\n").lora->target_modules,
            (Modules{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  EXPECT_EQ(read("lora: {target_modules: [all-linear]}\n").lora->target_modules.size(), 7u);
  EXPECT_EQ(read("lora: {target_modules: o_proj}\n").lora->target_modules, (Modules{"o_proj"}));
  EXPECT_EQ(read("lora: {target_modules: [k_proj, k_proj, up_proj]}\n").lora->target_modules,
            (Modules{"k_proj", "up_proj"}));
}

TEST(LoraConfig, TorchtuneTargets) {
  // torchtune's output_proj is Hugging Face's o_proj; apply_lora_to_mlp adds w1 w3 w2 = gate up down.
  EXPECT_EQ(read("lora: {lora_attn_modules: [q_proj, v_proj, output_proj]}\n").lora->target_modules,
            (Modules{"q_proj", "v_proj", "o_proj"}));
  EXPECT_EQ(read("lora:\n  lora_attn_modules: [q_proj, k_proj]\n  apply_lora_to_mlp: true\n").lora->target_modules,
            (Modules{"q_proj", "k_proj", "gate_proj", "up_proj", "down_proj"}));
  EXPECT_EQ(read("lora: {lora_attn_modules: [], apply_lora_to_mlp: true}\n").lora->target_modules,
            (Modules{"gate_proj", "up_proj", "down_proj"}));
  EXPECT_EQ(read("lora: {lora_attn_modules: [output_proj], apply_lora_to_mlp: false}\n").lora->target_modules,
            (Modules{"o_proj"}));
  // Without lora_attn_modules the attention targets are the default ones.
  EXPECT_EQ(read("lora: {apply_lora_to_mlp: true}\n").lora->target_modules,
            (Modules{"q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"}));
  ASSERT_TRUE(read("lora: {apply_lora_to_output: false}\n").lora.has_value());
  // A torchtune model section's LoRA keys, moved under lora: as they are.
  const train::TrainConfig c = read(
      "lora:\n"
      "  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']\n"
      "  apply_lora_to_mlp: true\n"
      "  apply_lora_to_output: false\n"
      "  lora_rank: 8\n"
      "  lora_alpha: 16\n"
      "  lora_dropout: 0.0\n"
      "  quantize_base: true\n");
  EXPECT_EQ(c.lora->target_modules, (Modules{"q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  EXPECT_EQ(c.lora->rank, 8);
  EXPECT_TRUE(c.lora_quantize_base);
}

TEST(LoraConfig, QuantizeBase) {
  for (const std::string v : {"nf4", "NF4", "true", "True"})
    EXPECT_TRUE(read("lora: {quantize_base: " + v + "}\n").lora_quantize_base) << v;
  for (const std::string v : {"none", "None", "false", "False"})
    EXPECT_FALSE(read("lora: {quantize_base: " + v + "}\n").lora_quantize_base) << v;
  // NF4 dequantizes to the compute dtype, whichever it is; double_quant alone is accepted (no effect).
  EXPECT_TRUE(read("compute_dtype: f32\nlora: {quantize_base: nf4}\n").lora_quantize_base);
  EXPECT_TRUE(read("compute_dtype: bf16\nlora: {quantize_base: nf4}\n").lora_quantize_base);
  EXPECT_FALSE(read("lora: {double_quant: true}\n").lora_quantize_base);
}

TEST(LoraConfig, MergeOnSave) {
  EXPECT_TRUE(read("merge_on_save: true\nlora: {}\n").merge_on_save);
  EXPECT_TRUE(read("lora: {merge_on_save: true}\n").merge_on_save);
  EXPECT_FALSE(read("merge_on_save: false\n").merge_on_save);  // false needs no LoRA
  EXPECT_FALSE(read("merge_on_save: false\n").lora.has_value());
  EXPECT_EQ(
      error_reading("merge_on_save: true\n"),
      "run.yaml:4: key 'merge_on_save': needs LoRA (a lora: section); a full fine-tune always writes the whole model");
  EXPECT_EQ(error_reading("merge_on_save: true\nlora: {merge_on_save: false}\n"),
            "run.yaml:4: key 'merge_on_save': lora.merge_on_save is also set (run.yaml:5); set only one");
}

TEST(LoraConfig, BadValuesNameTheKey) {
  EXPECT_EQ(error_reading("lora:\n  rank: 0\n"), "run.yaml:5: key 'lora.rank': rank must be positive, got 0");
  EXPECT_EQ(error_reading("lora:\n  r: -2\n"), "run.yaml:5: key 'lora.r': rank must be positive, got -2");
  EXPECT_EQ(error_reading("lora:\n  lora_rank: 4.5\n"),
            "run.yaml:5: key 'lora.lora_rank': expected an integer, got '4.5'");
  EXPECT_EQ(error_reading("lora:\n  alpha: 0\n"), "run.yaml:5: key 'lora.alpha': must be a positive number, got 0");
  EXPECT_EQ(error_reading("lora:\n  lora_alpha: -1\n"),
            "run.yaml:5: key 'lora.lora_alpha': must be a positive number, got -1");
  expect_error([&] { read("lora: {alpha: .inf}\n"); }, "run.yaml:4: key 'lora.alpha': must be a positive number");
  EXPECT_EQ(error_reading("lora:\n  dropout: 1\n"), "run.yaml:5: key 'lora.dropout': must be in [0, 1), got 1");
  EXPECT_EQ(error_reading("lora:\n  lora_dropout: -0.1\n"),
            "run.yaml:5: key 'lora.lora_dropout': must be in [0, 1), got -0.1");
  EXPECT_EQ(error_reading("lora:\n  init: xavier\n"),
            "run.yaml:5: key 'lora.init': expected kaiming or gaussian, got 'xavier'");
  EXPECT_EQ(error_reading("lora:\n  use_rslora: maybe\n"),
            "run.yaml:5: key 'lora.use_rslora': expected true or false, got 'maybe'");
  EXPECT_EQ(error_reading("lora:\n  use_dora: 1.5\n"),
            "run.yaml:5: key 'lora.use_dora': expected true or false, got '1.5'");
  EXPECT_EQ(error_reading("lora:\n  double_quant: 2\n"),
            "run.yaml:5: key 'lora.double_quant': expected true or false, got '2'");
  // The command line's values are placed there.
  EXPECT_EQ(error_reading("lora: {}\n", {"lora.rank=0"}),
            "command line: key 'lora.rank': rank must be positive, got 0");
}

TEST(LoraConfig, BadTargetsNameTheKey) {
  const std::string msg = error_reading("lora:\n  target_modules: [q_proj, lm_head]\n");
  EXPECT_TRUE(msg.starts_with("run.yaml:5: key 'lora.target_modules': unknown target module 'lm_head'")) << msg;
  EXPECT_NE(msg.find("q_proj k_proj v_proj o_proj gate_proj up_proj down_proj"), std::string::npos) << msg;
  expect_error([&] { read("lora: {target_modules: []}\n"); },
               "run.yaml:4: key 'lora.target_modules': no target modules");
  expect_error([&] { read("lora: {target_modules: '.*proj'}\n"); },
               "key 'lora.target_modules': unknown target module '.*proj'");
  expect_error([&] { read("lora: {target_modules: {q: 1}}\n"); },
               "key 'lora.target_modules': expected a module name or a list of them");
  EXPECT_EQ(
      error_reading("lora:\n  lora_attn_modules: [q_proj, o_proj]\n"),
      "run.yaml:5: key 'lora.lora_attn_modules': unknown attention module 'o_proj' (torchtune's are q_proj k_proj "
      "v_proj output_proj; the MLP's: apply_lora_to_mlp: true)");
  EXPECT_EQ(error_reading("lora:\n  lora_attn_modules: []\n"),
            "run.yaml:5: key 'lora.lora_attn_modules': no modules to adapt (lora_attn_modules is empty and "
            "apply_lora_to_mlp is not true)");
  EXPECT_EQ(error_reading("lora:\n  apply_lora_to_output: true\n"),
            "run.yaml:5: key 'lora.apply_lora_to_output': adapting the output projection (lm_head) is not supported; "
            "set it to false");
  // PEFT's and torchtune's ways of naming the modules, both: the error names both keys.
  EXPECT_EQ(error_reading("lora:\n  target_modules: [q_proj]\n  lora_attn_modules: [q_proj]\n"),
            "run.yaml:6: key 'lora.lora_attn_modules': lora.target_modules is also set (run.yaml:5); name the adapted "
            "modules one way: target_modules (PEFT's) or lora_attn_modules/apply_lora_to_mlp (torchtune's)");
  expect_error([&] { read("lora:\n  target_modules: all-linear\n  apply_lora_to_mlp: false\n"); },
               "run.yaml:6: key 'lora.apply_lora_to_mlp': lora.target_modules is also set (run.yaml:5)");
}

TEST(LoraConfig, QuantizeBaseOnlyNf4) {
  for (const std::string v : {"fp4", "int8", "8"})
    EXPECT_EQ(error_reading("lora:\n  quantize_base: " + v + "\n"),
              "run.yaml:5: key 'lora.quantize_base': only nf4 is supported (or false/none for a base in "
              "compute_dtype), got '" +
                  v + "'");
  expect_error([&] { read("lora:\n  qlora: int4\n"); }, "run.yaml:5: key 'lora.qlora': only nf4 is supported");
}

TEST(LoraConfig, SectionAndUnknownKeys) {
  expect_error([&] { read("lora: true\n"); }, "run.yaml:4: key 'lora': expected a map");
  expect_error([&] { read("lora: [rank, 4]\n"); }, "run.yaml:4: key 'lora': ");
  EXPECT_EQ(error_reading("lora:\n  rnak: 4\n"), "run.yaml:5: key 'lora.rnak': unknown key; did you mean 'lora.rank'?");
  // torchtune's names are read inside lora: only.
  expect_error([&] { read("lora_rank: 4\n"); }, "run.yaml:4: key 'lora_rank': unknown key");
}
