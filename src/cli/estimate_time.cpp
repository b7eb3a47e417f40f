// `shardlm estimate-time`: predicted step time, throughput and scaling efficiency of a training
// run per strategy and world size, from the dry run that estimates memory (memory/step_time.h),
// and the fastest strategy that fits in memory at each size.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "cli/estimate_options.h"
#include "core/error.h"
#include "memory/step_time.h"
#include "model/config.h"

namespace shardlm::cli {

namespace {

struct TimeOpts {
  std::string tflops, memory_bw, intra_bw, inter_bw, host_copy_bw, overlap = "true", world_sizes, strategies;
  double intra_latency_us = 2, inter_latency_us = 8;
  bool json = false;
};

// The number a value starts with and the rest of it ("400GB/s": 400, "GB/s"); no number: nullopt.
std::optional<std::pair<double, std::string>> leading_number(const std::string& v) {
  size_t used = 0;
  try {
    const double x = std::stod(v, &used);
    return std::pair(x, v.substr(used));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// "400GB/s", "3.2Tbit/s", "10gbit", "125MB/s", "1e9" (bytes/s): bytes per second.
double parse_bandwidth(const std::string& flag, const std::string& v) {
  static const std::map<std::string, double> units = {
      {"", 1},           {"b/s", 1},         {"kb/s", 1e3},  {"mb/s", 1e6},        {"gb/s", 1e9},
      {"tb/s", 1e12},    {"gbit/s", 1e9 / 8}, {"gbit", 1e9 / 8}, {"mbit/s", 1e6 / 8}, {"mbit", 1e6 / 8},
      {"tbit/s", 1e12 / 8}, {"tbit", 1e12 / 8}};
  if (const auto n = leading_number(v)) {
    std::string unit;
    for (char c : n->second) unit += char(std::tolower(static_cast<unsigned char>(c)));
    const auto u = units.find(unit);
    if (u != units.end() && n->first > 0 && n->first * u->second <= 1e15) return n->first * u->second;
  }
  throw Error(fmt::format("{} {}: expected a bandwidth such as 400GB/s, 25GB/s, 100Gbit/s or 1gbit", flag, v));
}

double parse_positive(const std::string& flag, const std::string& v) {
  const auto n = leading_number(v);
  if (!n || !n->second.empty() || !(n->first > 0) || n->first > 1e9)
    throw Error(fmt::format("{} {}: expected a number > 0", flag, v));
  return n->first;
}

std::vector<int> parse_worlds(const std::string& v, int nproc, int largest) {
  std::vector<int> out;
  if (v.empty()) {
    for (int w = std::max(1, nproc); w <= largest; w *= 2) out.push_back(w);
    if (out.empty() || out.back() != largest) out.push_back(largest);
    return out;
  }
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int w = 0;
    try {
      w = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || w < 1 || w > (1 << 20))
      throw Error(fmt::format("--world-sizes {}: '{}' is not a world size (1 to 1048576)", v, item));
    if (nproc > 0 && w % nproc != 0 && w > nproc)
      throw Error(fmt::format("--world-sizes {}: {} is not a multiple of --nproc-per-node {}", v, w, nproc));
    out.push_back(w);
  }
  if (out.empty()) throw Error("--world-sizes: empty");
  return out;
}

struct Cell {
  shard::Strategy strategy;
  memory::Estimate estimate;
  memory::StepTime time;
};

void run(const EstimateOptions& opts, const TimeOpts& t, bool strategy_given) {
  const std::vector<int> worlds = parse_worlds(t.world_sizes, opts.nproc, opts.world);
  EstimateOptions o = opts;
  o.world = *std::max_element(worlds.begin(), worlds.end());
  memory::EstimateInput base = estimate_input(o);
  std::string budget_source;
  const int64_t budget = device_budget(o, &budget_source);
  if (t.tflops.empty()) throw Error("--tflops: the FLOP/s one rank achieves in training is needed (e.g. 400 for an H100 in bf16)");
  memory::Hardware hw{.flops_per_s = parse_positive("--tflops", t.tflops) * 1e12,
                      .intra_latency_s = t.intra_latency_us * 1e-6,
                      .inter_latency_s = t.inter_latency_us * 1e-6};
  if (!t.intra_bw.empty()) hw.intra_bytes_per_s = parse_bandwidth("--intra-node-bandwidth", t.intra_bw);
  if (!t.inter_bw.empty()) hw.inter_bytes_per_s = parse_bandwidth("--inter-node-bandwidth", t.inter_bw);
  if (!t.memory_bw.empty()) hw.memory_bytes_per_s = parse_bandwidth("--memory-bandwidth", t.memory_bw);
  if (!t.host_copy_bw.empty()) hw.host_copy_bytes_per_s = parse_bandwidth("--host-copy-bandwidth", t.host_copy_bw);
  if (t.overlap != "true" && t.overlap != "false")
    throw Error(fmt::format("--overlap {}: expected true or false", t.overlap));
  hw.overlap = t.overlap == "true";
  if (t.intra_latency_us < 0 || t.inter_latency_us < 0) throw Error("--intra/--inter-node-latency-us must be >= 0");

  std::vector<std::vector<Cell>> rows;
  for (int w : worlds) {
    memory::EstimateInput in = base;
    in.world_size = w;
    in.ranks_per_node = o.nproc > 0 ? std::min(o.nproc, w) : 0;
    const std::vector<shard::Strategy> strategies =
        strategy_given ? std::vector<shard::Strategy>{base.sharding.strategy}
                       : memory::auto_candidates(w, in.ranks_per_node > 0 ? in.ranks_per_node : w);
    std::vector<Cell>& row = rows.emplace_back();
    for (shard::Strategy s : strategies) {
      in.sharding.strategy = s;
      memory::Estimate e;
      try {
        e = memory::estimate(in);
      } catch (const Error& err) {
        throw Error(fmt::format("{} at world size {} ({}; --nproc-per-node / --shard-group-size)", err.message(), w,
                                shard::strategy_name(s)));
      }
      memory::StepTime st;
      try {
        st = memory::predict_step_time(in, e, hw);
      } catch (const Error& err) {
        throw Error(fmt::format("{} at world size {} ({}): give --intra-node-bandwidth / --inter-node-bandwidth",
                                err.message(), w, shard::strategy_name(s)));
      }
      row.push_back({s, std::move(e), st});
    }
  }
  // Per strategy: tokens/s per rank at the smallest world size it ran at, for the efficiency.
  std::map<shard::Strategy, double> first;
  for (const auto& row : rows)
    for (const Cell& c : row) first.emplace(c.strategy, c.time.tokens_per_s());
  auto fits = [&](const Cell& c) { return budget <= 0 || c.estimate.device_bytes <= budget; };

  const int64_t params = parameter_count(base.model, base.finetune);
  if (t.json) {
    fmt::print("[");
    bool comma = false;
    for (size_t i = 0; i < rows.size(); ++i)
      for (const Cell& c : rows[i]) {
        fmt::print("{}\n {{\"world_size\": {}, \"strategy\": \"{}\", \"step_s\": {:.6g}, \"compute_s\": {:.6g}, "
                   "\"memory_s\": {:.6g}, \"host_copy_s\": {:.6g}, \"comm_s\": {:.6g}, \"exposed_comm_s\": {:.6g}, "
                   "\"tokens_per_s_per_rank\": {:.6g}, \"efficiency\": {:.6g}, \"flops_per_step\": {:.6g}, "
                   "\"memory_bytes_per_step\": {:.6g}, \"comm_bytes_per_step\": {:.6g}, "
                   "\"inter_node_bytes_per_step\": {:.6g}, \"peak_bytes\": {}, \"fits\": {}, \"parameters\": {}}}",
                   comma ? "," : "", worlds[i], shard::strategy_name(c.strategy), c.time.step_s, c.time.compute_s,
                   c.time.memory_s, c.time.host_copy_s, c.time.comm_s, c.time.exposed_comm_s, c.time.tokens_per_s(),
                   c.time.tokens_per_s() / first[c.strategy], c.time.flops, c.time.memory_bytes,
                   c.estimate.comm_bytes_per_step,
                   c.estimate.inter_node_bytes_per_step, c.estimate.device_bytes, fits(c) ? "true" : "false",
                   params);
        comma = true;
      }
    fmt::print("\n]\n");
    return;
  }
  fmt::print("shardlm estimate-time: {} ({}), micro-batch {} x {} tokens, {} accumulation step{}, param {}, reduce {}\n",
             o.model, params >= 1e9 ? fmt::format("{:.2f}B parameters", params / 1e9)
                                    : fmt::format("{:.2f}M parameters", params / 1e6),
             base.micro_batch_size, base.seq_len, base.grad_accum, base.grad_accum > 1 ? "s" : "",
             dtype_name(base.sharding.param_dtype), dtype_name(base.sharding.reduce_dtype));
  fmt::print("hardware: {:.4g} TFLOP/s achieved per rank{}; within a node {} per rank, latency {} us; between nodes {} "
             "per node, latency {} us; {}{}\n",
             hw.flops_per_s / 1e12,
             hw.memory_bytes_per_s > 0
                 ? fmt::format(", memory-bound ops at {}/s", format_bytes(int64_t(hw.memory_bytes_per_s)))
                 : "",
             hw.intra_bytes_per_s > 0 ? format_bytes(int64_t(hw.intra_bytes_per_s)) + "/s" : "-",
             t.intra_latency_us, hw.inter_bytes_per_s > 0 ? format_bytes(int64_t(hw.inter_bytes_per_s)) + "/s" : "-",
             t.inter_latency_us,
             hw.overlap ? "communication overlaps compute" : "no overlap (communication adds to compute)",
             hw.host_copy_bytes_per_s > 0
                 ? fmt::format("; the ranks' cores copy what they send at {}/s, within compute",
                               format_bytes(int64_t(hw.host_copy_bytes_per_s)))
                 : "");
  fmt::print("{:>6}  {:<20} {:>9} {:>9} {:>9} {:>9} {:>12} {:>6} {:>11} {:>10}\n", "world", "strategy", "step s",
             "compute", "comm", "exposed", "tok/s/rank", "eff", "peak/rank", "inter/step");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Cell* best = nullptr;
    for (const Cell& c : rows[i]) {
      fmt::print("{:>6}  {:<20} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>12.1f} {:>5.1f}% {:>11} {:>10}{}\n", worlds[i],
                 shard::strategy_name(c.strategy), c.time.step_s, c.time.compute_s, c.time.comm_s,
                 c.time.exposed_comm_s, c.time.tokens_per_s(), 100 * c.time.tokens_per_s() / first[c.strategy],
                 format_bytes(c.estimate.device_bytes), format_bytes(int64_t(c.estimate.inter_node_bytes_per_step)),
                 fits(c) ? "" : "  does not fit");
      if (fits(c) && (!best || c.time.step_s < best->time.step_s)) best = &c;
    }
    if (rows[i].size() > 1 || budget > 0)
      fmt::print("{:>6}  fastest{}: {}\n", worlds[i], budget > 0 ? fmt::format(" that fits {}", format_bytes(budget)) : "",
                 best ? shard::strategy_name(best->strategy) : "none fits");
  }
  fmt::print("eff: tokens/s per rank against the strategy's smallest world size here (weak scaling). The model replays\n"
             "the engine's own step (docs/memory.md, \"Step time\"): matmul and attention FLOPs at --tflops (the\n"
             "memory-bound ops' bytes at --memory-bandwidth, where given), each collective as latency + bytes /\n"
             "bandwidth, overlapped as the engine issues and waits for them.\n");
}

}  // namespace

void register_estimate_time(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "estimate-time", "Predicted step time and scaling per strategy and world size, from a model config alone");
  auto o = std::make_shared<EstimateOptions>();
  auto t = std::make_shared<TimeOpts>();
  add_estimate_options(cmd, *o);
  cmd->add_option("--tflops", t->tflops, "TFLOP/s one rank achieves in training: a run's model_flops_per_s / ranks on one node; with "
                  "--memory-bandwidth, its matmuls' and attention's alone (bench/slow_links.sh measures both)")
      ->required();
  cmd->add_option("--memory-bandwidth", t->memory_bw,
                  "The rate one rank's memory-bound ops (elementwise, norms, casts, the optimizer) move bytes, each "
                  "tensor read and written, e.g. 2TB/s; then --tflops is the matmuls' rate alone (default: their time "
                  "folded into --tflops)");
  cmd->add_option("--intra-node-bandwidth", t->intra_bw, "One rank's bandwidth within its node, e.g. 300GB/s");
  cmd->add_option("--inter-node-bandwidth", t->inter_bw,
                  "One node's bandwidth to the others, all its ranks together, e.g. 400GB/s (8 x 400Gbit/s) or 1gbit");
  cmd->add_option("--intra-node-latency-us", t->intra_latency_us, "Per ring step within a node")->capture_default_str();
  cmd->add_option("--inter-node-latency-us", t->inter_latency_us, "Per ring step across nodes")->capture_default_str();
  cmd->add_option("--host-copy-bandwidth", t->host_copy_bw,
                  "CPU ranks: the rate at which a rank's cores copy the bytes it communicates, time taken from its "
                  "compute (the intra-node bandwidth of CPU ranks; default: none, as on GPUs)");
  cmd->add_option("--overlap", t->overlap,
                  "true: collectives run while compute does (GPUs; CPU ranks, whose progress thread moves them); "
                  "false: they add to it")
      ->capture_default_str();
  cmd->add_option("--world-sizes", t->world_sizes,
                  "Comma-separated world sizes (default: doubling from --nproc-per-node to --world-size)");
  cmd->add_flag("--json", t->json, "One JSON record per world size and strategy instead of the table");
  cmd->footer(
      "Without --sharding-strategy every strategy `sharding_strategy: auto` would consider is predicted (hybrid\n"
      "ones once the world spans nodes) and the fastest that fits --device-memory is named.\n"
      "Examples:\n"
      "  shardlm estimate-time --model llama3-8b --param-dtype bf16 --micro-batch-size 1 --seq-len 8192 \\\n"
      "    --activation-checkpointing true --nproc-per-node 8 --world-size 1024 --device-memory 80GB \\\n"
      "    --tflops 400 --intra-node-bandwidth 300GB/s --inter-node-bandwidth 400GB/s\n"
      "  shardlm estimate-time --model runs/tiny --world-size 4 --nproc-per-node 2 --tflops 0.05 \\\n"
      "    --intra-node-bandwidth 2GB/s --inter-node-bandwidth 1gbit --host-copy-bandwidth 2GB/s");
  cmd->callback([o, t, cmd] { run(*o, *t, cmd->count("--sharding-strategy") > 0); });
}

}  // namespace shardlm::cli
