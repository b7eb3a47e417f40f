// bench_sharding: step time, bytes communicated per step and per-rank peak memory of every
// sharding strategy, on however many ranks mpirun starts (bench/sharding.sh runs 1, 2 and 4).
//
//   mpirun -np N bench_sharding [--dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn 688 --vocab 32000
//                                --seq 128 --batch 4 --steps 8 --warmup 2 --rounds 2]
// Strategies are interleaved round by round so that drift affects all alike; each reports its best
// round. --batch is per rank: the global batch grows with the ranks, as in data parallelism.
#include <fmt/format.h>
#include <omp.h>

#include <chrono>
#include <map>
#include <string>

#include "bench_args.h"
#include "comm/communicator.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "shard/engine.h"
#include "shard/load.h"

using namespace shardlm;

int main(int argc, char** argv) {
  const std::unique_ptr<comm::Communicator> world = comm::make_world_communicator();
  bench::BenchArgs defaults{preset("tiny"), 128, 4, 8, 2, 2};
  defaults.cfg.hidden_size = 256;
  defaults.cfg.num_hidden_layers = 4;
  defaults.cfg.num_attention_heads = 8;
  defaults.cfg.num_key_value_heads = 4;
  defaults.cfg.intermediate_size = 688;
  defaults.cfg.vocab_size = 32000;
  const bench::BenchArgs args = bench::parse_bench_args(argc, argv, defaults);
  const ModelConfig& cfg = args.cfg;
  const int64_t seq = args.seq, batch = args.batch, steps = args.steps, warmup = args.warmup, rounds = args.rounds;
  const int W = world->size();

  std::vector<shard::Strategy> strategies = {shard::Strategy::NoShard, shard::Strategy::Zero1,
                                             shard::Strategy::ShardGradOp, shard::Strategy::FullShard};
  if (W >= 4) strategies.push_back(shard::Strategy::HybridShard);
  std::map<shard::Strategy, double> best_ms;
  std::map<shard::Strategy, std::string> report;

  // Random tokens for this rank's rows.
  std::vector<data::Example> rows;
  for (int64_t r = 0; r < batch; ++r) {
    data::Example e;
    for (int64_t t = 0; t <= seq; ++t)
      e.ids.push_back(int32_t(philox4x32({uint32_t(t), uint32_t(r), uint32_t(world->rank()), 0}, {3, 4})[0] %
                              uint32_t(cfg.vocab_size)));
    e.targets.assign(e.ids.begin() + 1, e.ids.end());
    e.ids.pop_back();
    rows.push_back(std::move(e));
  }
  const data::BatchBuffers buf = data::make_batch(rows, seq, 0);
  const std::vector<model::Batch> micro = {buf.batch()};
  ops::AdamWConfig opt;
  opt.lr = 1e-4;

  for (int64_t round = 0; round < rounds; ++round) {
    for (shard::Strategy s : strategies) {
      shard::ShardingConfig c;
      c.strategy = s;
      c.shard_group_size = 2;
      shard::Mesh mesh = shard::make_mesh(*world, c, 2);
      MemoryTracker::for_device(Device::CPU).reset_peaks();
      const MemStats base = MemoryTracker::for_device(Device::CPU).stats();
      double ms = 0;
      comm::CommStats comm_bytes;
      MemStats mem;
      {
        shard::ShardedModel engine(cfg, {}, c, mesh);
        shard::init_random(engine, 1);
        model::LlamaCompute compute(cfg, DType::F32);
        for (int64_t i = 0; i < warmup + steps; ++i) {
          if (i == warmup) {
            mesh.shard->reset_stats();
            mesh.replicate->reset_stats();
          }
          world->barrier();
          const auto t0 = std::chrono::steady_clock::now();
          engine.train_step(compute, micro, opt, i + 1, 1.0);
          world->barrier();
          if (i >= warmup) ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        }
        comm_bytes = mesh.shard->stats();
        const comm::CommStats& rep = mesh.replicate->stats();
        comm_bytes.all_reduce_bytes += rep.all_reduce_bytes;
        mem = MemoryTracker::for_device(Device::CPU).stats();
      }
      ms /= double(steps);
      if (round == 0 || ms < best_ms[s]) best_ms[s] = ms;
      auto peak = [&](MemCategory m) { return format_bytes(mem.peak[int(m)] - base.live[int(m)]); };
      report[s] = fmt::format(
          "comm {}/step (AG {}, RS {}, AR {}) | peak/rank {} (params {}, grads {}, optim {}, activ {}, comm {})",
          format_bytes(comm_bytes.total() / steps), format_bytes(comm_bytes.all_gather_bytes / steps),
          format_bytes(comm_bytes.reduce_scatter_bytes / steps), format_bytes(comm_bytes.all_reduce_bytes / steps),
          format_bytes(mem.peak_total - base.live_total), peak(MemCategory::Parameters), peak(MemCategory::Gradients),
          peak(MemCategory::Optimizer), peak(MemCategory::Activations), peak(MemCategory::Communication));
    }
  }
  if (world->rank() == 0) {
    const double params = double(parameter_count(cfg));
    fmt::print("bench_sharding: {} rank(s) x {} OpenMP thread(s); model {:.1f}M params (dim {}, {} layers, vocab {}); "
               "batch {} x {} tokens per rank; best of {} rounds of {} steps\n",
               W, omp_get_max_threads(), params / 1e6, cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, batch,
               seq, rounds, steps);
    for (shard::Strategy s : strategies)
      fmt::print("  {:<14} {:8.1f} ms/step | {}\n", shard::strategy_name(s), best_ms[s], report[s]);
    if (W == 1)
      fmt::print("  FULL_SHARD / NO_SHARD step time at 1 rank: {:.3f}\n",
                 best_ms[shard::Strategy::FullShard] / best_ms[shard::Strategy::NoShard]);
  }
  return 0;
}
