// bench_train: tokens/s of full training steps (forward, loss, backward, clipping, AdamW) of a
// Llama in one process, on random tokens, through the sharding engine on a local communicator:
// the path `shardlm train` runs at world size 1. bench/compare_torch.sh runs it beside PyTorch.
//
//   bench_train --dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn 688 --vocab 32000 --seq 256
//               --batch 8 --steps 10 --warmup 2 [--dtype f32|bf16] [--lora-rank R [--qlora 1]]
#include <fmt/format.h>
#include <omp.h>

#include <chrono>
#include <cstring>
#include <string>

#include "core/platform.h"
#include "bench_args.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "model/config.h"
#include "comm/communicator.h"
#include "shard/engine.h"
#include "shard/load.h"

using namespace shardlm;

int main(int argc, char** argv) {
  select_blas_kernels(argv);  // OpenBLAS's kernels as shardlm picks them (core/platform.h)
  bench::BenchArgs defaults{preset("tiny"), 256, 8, 10, 2};
  const bench::BenchArgs args = bench::parse_bench_args(argc, argv, defaults);
  const ModelConfig& cfg = args.cfg;
  const model::FinetuneSpec& ft = args.finetune;
  const int64_t seq = args.seq, batch = args.batch, steps = args.steps, warmup = args.warmup;
  const DType dtype = args.dtype;

  const std::unique_ptr<comm::Communicator> local = comm::make_local_communicator();
  shard::ShardingConfig sc;
  sc.param_dtype = dtype;
  sc.state_dtype = args.state_dtype;
  shard::Mesh mesh = shard::make_mesh(*local, sc, 1);
  shard::ShardedModel engine(cfg, ft, sc, mesh);
  shard::init_random(engine, 0);
  model::LlamaCompute model(cfg, dtype, Device::CPU, ft.lora);
  model.set_checkpointing(args.checkpoint_every, args.offload_activations);

  auto random_batch = [&](int64_t s) {
    data::Example e;
    std::vector<data::Example> rows;
    for (int64_t r = 0; r < batch; ++r) {
      data::Example ex;
      for (int64_t t = 0; t <= seq; ++t)
        ex.ids.push_back(int32_t(philox4x32({uint32_t(t), uint32_t(r), uint32_t(s), 0}, {1, 2})[0] % cfg.vocab_size));
      ex.targets.assign(ex.ids.begin() + 1, ex.ids.end());
      ex.ids.pop_back();
      rows.push_back(std::move(ex));
    }
    return data::make_batch(rows, seq, 0);
  };
  ops::AdamWConfig opt;
  opt.lr = 3e-4;
  double seconds = 0, last_loss = 0;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    const data::BatchBuffers micro = random_batch(s);
    const auto t0 = std::chrono::steady_clock::now();
    last_loss = engine.train_step(model, {micro.batch()}, opt, s + 1, 1.0).loss;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= warmup) seconds += dt;
  }
  const double tokens = double(batch * seq * steps);
  const MemStats mem = MemoryTracker::for_device(Device::CPU).stats();
  std::string peaks;
  for (int i = 0; i < kNumMemCategories; ++i)
    peaks += fmt::format("{}\"{}\": {}", i ? ", " : "", mem_category_name(MemCategory(i)), mem.peak[size_t(i)]);
  int64_t trainable = 0;
  for (const shard::PlannedUnit& u : engine.plan().units) trainable += u.layout.numel;
  const std::string mode = ft.lora ? fmt::format("{} r{}", ft.nf4_base ? "qlora" : "lora", ft.lora->rank) : "full";
  // Model FLOP rate the way issue 19 counts it: 6 FLOPs per non-embedding parameter per token
  // (the lm_head counts, the input embedding, a lookup, does not; attention's T^2 term is left out).
  // A tied matrix is counted once, as the lm_head.
  const double nonembedding =
      double(parameter_count(cfg, ft) - (cfg.tie_word_embeddings ? 0 : cfg.vocab_size * cfg.hidden_size));
  const double model_gflops = 6.0 * nonembedding * tokens / seconds * 1e-9;
  fmt::print("{{\"impl\": \"shardlm\", \"mode\": \"{}\", \"tokens_per_s\": {:.1f}, \"step_ms\": {:.1f}, \"threads\": {}, "
             "\"params\": {}, \"trainable\": {}, \"batch\": {}, \"seq\": {}, \"steps\": {}, \"dtype\": \"{}\", "
             "\"state_dtype\": \"{}\", \"ckpt\": {}, \"offload_activations\": {}, \"last_loss\": {:.4f}, \"nonembedding_params\": {:.0f}, \"model_gflops\": {:.1f}, \"peak_tracked_bytes\": {}, \"peak_by_category\": {{{}}}}}\n",
             mode, tokens / seconds, seconds / double(steps) * 1e3, omp_get_max_threads(), parameter_count(cfg, ft), trainable,
             batch, seq, steps, dtype_name(dtype), dtype_name(args.state_dtype), args.checkpoint_every,
             args.offload_activations, last_loss, nonembedding, model_gflops, mem.peak_total, peaks);
  return 0;
}
