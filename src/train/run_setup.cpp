#include "train/run_setup.h"

#include <fmt/format.h>

#include <filesystem>

#include "core/alloc.h"
#include "core/device.h"
#include "io/staged_dir.h"
#include "memory/levers.h"
#include "model/hf_dir.h"
#include "model/llama.h"
#include "model/nf4_loader.h"
#include "train/sample_check.h"

namespace shardlm::train {

namespace {

// The run's rows against what the model can attend over.
void check_row_length(const TrainConfig& c, const ModelConfig& m, int64_t T) {
  if (T > m.max_position_embeddings)
    throw Error(fmt::format("seq_len {} exceeds the model's max_position_embeddings {}", T, m.max_position_embeddings),
                {.file = c.source, .key = "seq_len"});
  if (m.sliding_window > 0 && T > m.sliding_window)
    throw Error(fmt::format("seq_len {} exceeds the model's sliding_window {}, which shardlm does not implement", T,
                            m.sliding_window),
                {.file = c.source, .key = "seq_len"});
}

// A lever (memory/levers.h) as the config says it.
std::string lever_key(const memory::LeverStep& s) {
  using memory::Lever;
  switch (s.lever) {
    case Lever::StateBf16: return "optimizer_state_dtype: bf16";
    case Lever::State8bit: return "optim: adamw_8bit";
    case Lever::ComputeBf16: return "compute_dtype: bf16";
    case Lever::FullShard: return "sharding_strategy: FULL_SHARD";
    case Lever::ActivationCheckpointing: return "activation_checkpointing: true";
    case Lever::OffloadActivations: return "offload_activations: true";
    case Lever::SmallerMicroBatch:
      return fmt::format("micro_batch_size: {} with gradient_accumulation_steps: {}", s.input.micro_batch_size,
                         s.input.grad_accum);
    case Lever::Offload: return "offload_params: true";
  }
  return "?";
}

// The run's LoRA / QLoRA settings as the model builder, the estimator and the engine take them.
model::FinetuneSpec finetune_of(const TrainConfig& c) {
  return {.lora = c.lora, .nf4_base = c.lora && c.lora_quantize_base, .nf4_double_quant = c.lora_double_quant};
}

}  // namespace

// The directories a run writes its model into must not be the one it reads it from: a full
// fine-tune writes output_dir itself, a LoRA run output_dir/adapter (and output_dir/merged).
static void check_outputs(const TrainConfig& c) {
  namespace fs = std::filesystem;
  auto check = [&](const std::string& dir, const std::string& role, bool replaced_whole) {
    try {
      io::refuse_output_over_input(dir, role, c.model, "model directory");
      // The adapter and merged directories are replaced whole at the end; refuse now, not then.
      if (replaced_whole) io::check_publishable(dir, io::Publish::Replace, role);
    } catch (Error& e) {
      throw Error(e.message(), {.file = c.source, .key = "output_dir"});
    }
  };
  check(c.output_dir, "output_dir", false);
  if (c.lora) {
    check((fs::path(c.output_dir) / "adapter").string(), "output_dir/adapter", true);
    if (c.merge_on_save) check((fs::path(c.output_dir) / "merged").string(), "output_dir/merged", true);
  }
}

RunInputs load_inputs(const TrainConfig& c) {
  check_outputs(c);
  return read_inputs(c);
}

RunInputs read_inputs(const TrainConfig& c) {
  RunInputs in;
  in.model = load_hf_config(c.model);
  in.finetune = finetune_of(c);
  if (in.model.quantization && in.model.quantization->is_bnb_nf4()) {
    // A directory saved by transformers from a bitsandbytes 4-bit model. QLoRA keeps its NF4
    // weights as stored (not re-quantized), so their double quantization is the file's whatever
    // lora.double_quant says; LoRA and full fine-tuning read them as bitsandbytes dequantizes them.
    const std::optional<bool> stored = model::Nf4ModelReader(c.model).double_quant_as_stored();
    if (in.finetune.nf4_base && stored) {
      std::string why;  // why the run's double quantization is not lora.double_quant's, if it is not
      if (*stored != c.lora_double_quant)
        why = *stored ? "the file is double-quantized"
              : in.model.quantization->double_quant
                  ? "the file's nested_quant_map is not bitsandbytes' standard one, so its absmax values are kept in f32"
                  : "the file is not double-quantized";
      in.base_note = fmt::format("base: {}'s NF4 weights (bitsandbytes 4-bit) kept as stored, not re-quantized{}",
                                 c.model,
                                 why.empty() ? "" : fmt::format("; lora.double_quant: {} overridden: {}", c.lora_double_quant, why));
      in.finetune.nf4_double_quant = *stored;
    } else if (stored) {
      in.base_note = fmt::format("base: {}'s NF4 weights (bitsandbytes 4-bit) dequantized as bitsandbytes does{}",
                                 c.model, c.lora ? " (lora.quantize_base: nf4 would keep them as stored)" : "");
    }
  }
  in.tok = data::load_model_tokenizer(c.model, in.model.vocab_size, data::reads_text(c.data));
  data::DataConfig dc = c.data;
  dc.chat_template = data::read_chat_template(c.model);
  in.data = data::load_run_data(dc, c.seq_len, c.seed, *in.tok, in.model.vocab_size);
  in.T = in.data.seq_len;
  if (c.preference != in.data.pairs)
    throw Error(c.preference ? fmt::format("the dpo: section needs preference data ({{\"prompt\", \"chosen\", "
                                           "\"rejected\"}} records); {} is {} data", c.data.train, in.data.type)
                             : "preference data ({\"prompt\", \"chosen\", \"rejected\"} records) is for DPO: add a "
                               "dpo: section (docs/preference.md)",
                {.file = c.source, .key = c.preference ? "dpo" : "data.train"});
  in.B = rows_per_micro_batch(c);
  check_row_length(c, in.model, in.T);
  return in;
}

namespace {
// "try, in order of cost to speed: ..." for a run that does not fit `budget`: the levers in config
// keys, and what is left when even all of them do not fit.
std::string what_to_try(const memory::EstimateInput& in, int64_t budget, bool gpu) {
  const std::vector<memory::LeverStep> levers = memory::levers_to_fit(in, budget, gpu);
  return fmt::format("try, in order of cost to speed: {}{}", memory::describe_levers(levers, budget, lever_key),
                     levers.empty() || levers.back().device_bytes > budget
                         ? "; beyond that: more ranks, a shorter seq_len, or LoRA/QLoRA"
                         : "");
}
}  // namespace

MemoryPlan plan_memory(const TrainConfig& c, const RunInputs& in, int world_size, int node_ranks, bool enforce_budget) {
  MemoryPlan p;
  p.sharding = c.sharding;
  const bool gpu = c.device == Device::CUDA;
  memory::EstimateInput est{.model = in.model, .finetune = in.finetune, .sharding = p.sharding, .world_size = world_size,
                            .ranks_per_node = node_ranks, .micro_batch_size = in.B, .seq_len = in.T,
                            .grad_accum = c.gradient_accumulation_steps,
                            .checkpoint_every = c.activation_checkpointing,
                            .offload_activations = c.offload_activations,
                            .offload = p.sharding.offload_params,
                            .preference = c.preference,
                            .mpi_ring = !gpu};
  if (p.sharding.auto_strategy) {
    try {
      p.sharding.strategy = est.sharding.strategy =
          memory::choose_strategy(est, c.max_memory_per_rank, &p.auto_why, [&](const memory::EstimateInput& smallest) {
            return what_to_try(smallest, c.max_memory_per_rank, gpu);
          });
    } catch (const Error& e) {
      throw Error(e.message(), c.max_memory_per_rank_at);
    }
  }
  if (p.sharding.offload_params && !p.sharding.shard_gradients())
    throw Error(fmt::format("CPU offload needs a strategy that shards gradients, and sharding_strategy: auto chose {}",
                            shard::strategy_name(p.sharding.strategy)),
                {.file = c.source, .key = "offload_params"});
  est.sharding = p.sharding;
  p.input = est;
  p.estimate = memory::estimate(est);
  if (enforce_budget && c.max_memory_per_rank > 0 && p.estimate.device_bytes > c.max_memory_per_rank)
    throw Error(fmt::format("{}: the estimated peak per rank, {} ({} on {} rank{}), does not fit; {}",
                            format_bytes(c.max_memory_per_rank), format_bytes(p.estimate.device_bytes),
                            shard::strategy_name(p.sharding.strategy), world_size, world_size == 1 ? "" : "s",
                            what_to_try(est, c.max_memory_per_rank, gpu)),
                c.max_memory_per_rank_at);
  return p;
}

RunCheck check_run(const TrainConfig& config, int world_size, int node_ranks, const ModelConfig* shape) {
  RunCheck check;
  std::vector<std::string>& out = check.lines;
  const TrainConfig c = with_batch_size(config, world_size);
  RunInputs in;
  if (shape) {
    in.model = *shape;
    in.finetune = finetune_of(c);
    in.B = rows_per_micro_batch(c);
    in.T = c.seq_len;
    check_row_length(c, in.model, in.T);
  } else {
    in = load_inputs(c);  // config.json, the tokenizer and every data file, exactly as training reads them
    out.push_back(fmt::format("tokenizer: {} ({} ids)", in.tok->name(), in.tok->vocab_size()));
    for (const std::string& line : in.data.report) out.push_back("data: " + line);
    SampleCheck samples = check_samples(c, in);
    for (const std::string& line : samples.lines) out.push_back("samples: " + line);
    check.warnings = std::move(samples.warnings);
    check.sample = std::move(samples.sample);
  }
  const double params = double(parameter_count(in.model, in.finetune));
  out.insert(out.begin(), fmt::format("model: {} ({}, {} layers, hidden {}, vocab {}){}", c.model,
                                      params >= 1e9 ? fmt::format("{:.2f}B parameters", params / 1e9)
                                                    : fmt::format("{:.2f}M parameters", params / 1e6),
                                      in.model.num_hidden_layers, in.model.hidden_size, in.model.vocab_size,
                                      shape ? " -- the preset's shape; the directory, tokenizer and data are not read"
                                            : ""));
  const MemoryPlan p = plan_memory(c, in, world_size, node_ranks);
  const int64_t need = check.memory_per_rank = p.estimate.device_bytes;
  out.push_back(fmt::format("memory per rank (estimated peak of tracked buffers): {} with {} on {} rank{}{}{}",
                            format_bytes(need), shard::strategy_name(p.sharding.strategy), world_size,
                            world_size == 1 ? "" : "s", p.auto_why.empty() ? "" : " -- ",
                            p.auto_why));
  if (c.max_memory_per_rank > 0) {  // plan_memory refused a run above it
    out.push_back(fmt::format("fits max_memory_per_rank {} ({:.0f}% used)", format_bytes(c.max_memory_per_rank),
                              100.0 * double(need) / double(c.max_memory_per_rank)));
  } else if (const int64_t gpu = c.device == Device::CUDA ? device::cuda_device_memory() : 0; gpu > 0) {
    // No stated budget: this machine's GPU is the one, reported, not enforced (the estimate counts
    // a CPU rank's scratch, which a GPU run may not need).
    if (need <= gpu) {
      out.push_back(fmt::format("fits this machine's GPU, {} ({:.0f}% used)", format_bytes(gpu),
                                100.0 * double(need) / double(gpu)));
    } else {
      out.push_back(fmt::format("does NOT fit this machine's GPU, {}; {}", format_bytes(gpu), what_to_try(p.input, gpu, true)));
    }
  }
  return check;
}

}  // namespace shardlm::train
