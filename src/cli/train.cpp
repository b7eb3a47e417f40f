// `shardlm train`: train or fine-tune a model from a YAML configuration.
#include <fmt/format.h>

#include "cli/commands.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace shardlm::cli {

void register_train(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("train", "Train or fine-tune a model (configuration in YAML)");
  struct Opts {
    std::string config;
    std::vector<std::string> overrides;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--config", o->config, "Training configuration (YAML); see docs/training.md")->required();
  cmd->add_option("overrides", o->overrides, "key=value settings that replace the file's (dotted keys for sections)");
  cmd->footer(
      "Examples:\n"
      "  shardlm init --preset tiny --out runs/tiny\n"
      "  shardlm train --config configs/demo-addition.yaml model=runs/tiny output_dir=runs/tiny-trained\n"
      "  shardlm train --config configs/demo-addition.yaml max_steps=50 optimizer.lr=1e-3\n"
      "  shardlm launch --nproc-per-node 4 -- train --config run.yaml sharding_strategy=HYBRID_SHARD shard_group_size=2\n"
      "  mpirun -np 2 shardlm train --config run.yaml\n"
      "  srun --mpi=pmix -n 2 shardlm train --config run.yaml     Slurm (docs/slurm.md; examples/slurm/finetune.sbatch)\n"
      "  shardlm train --config run.yaml deepspeed_config=ds_z3.json   a DeepSpeed JSON's settings (docs/deepspeed.md)\n"
      "  shardlm recipes cp llama3_1-8b-lora-single-device run.yaml   a built-in recipe to start from\n"
      "  shardlm train --config run.yaml report_to=tensorboard   also TensorBoard event files (docs/reports.md)\n"
      "\n"
      "Writes the trained model (Hugging Face layout), metrics.jsonl and report.html (its curves, one\n"
      "self-contained page) into output_dir; with report_to: tensorboard also event files in output_dir/runs\n"
      "(or logging_dir).");
  cmd->callback([o] {
    const train::TrainConfig cfg = train::load_train_config(o->config, o->overrides);
    if (world().rank() == 0)
      for (const std::string& w : cfg.deepspeed.warnings) fmt::print(stderr, "shardlm: warning: {}\n", w);
    train::run_training(cfg, world());
  });
}

}  // namespace shardlm::cli
