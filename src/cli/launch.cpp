// `shardlm launch`: start a multi-rank job through mpirun, as accelerate launch / torchrun do.
//
// mpirun starts every rank of every node from the first node (ssh to the others, per the
// hostfile); ranks then find each other through MPI. Each rank gets cores / nproc_per_node
// OpenMP threads so that ranks sharing a node do not oversubscribe it.
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "cli/commands.h"
#include "core/error.h"

namespace shardlm::cli {

namespace {
std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw Error(fmt::format("cannot find the shardlm executable: {}", std::strerror(errno)));
  return std::string(buf, size_t(n));
}
}  // namespace

void register_launch(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("launch", "Start a job on several ranks through mpirun");
  struct Opts {
    int nproc_per_node = 1, nnodes = 1, node_rank = 0, threads = 0;
    std::string hostfile, master_addr;
    bool dry_run = false;
    std::vector<std::string> command;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--nproc-per-node", o->nproc_per_node, "Ranks per node")->required()->check(CLI::PositiveNumber);
  cmd->add_option("--nnodes", o->nnodes, "Nodes (more than one needs --hostfile)")->check(CLI::PositiveNumber);
  cmd->add_option("--hostfile", o->hostfile, "OpenMPI hostfile naming the nodes")->check(CLI::ExistingFile);
  cmd->add_option("--node-rank", o->node_rank,
                  "This node's index; mpirun starts all nodes from node 0, so other nodes have nothing to do");
  cmd->add_option("--master-addr", o->master_addr, "Accepted for torchrun compatibility; MPI needs no rendezvous");
  cmd->add_option("--threads-per-rank", o->threads, "OpenMP threads per rank (default: cores / nproc-per-node)");
  cmd->add_flag("--dry-run", o->dry_run, "Print the mpirun command instead of running it");
  cmd->add_option("command", o->command, "The shardlm command each rank runs (after --)")->required();
  cmd->footer(
      "Examples:\n"
      "  shardlm launch --nproc-per-node 4 -- train --config configs/hybrid-2x2.yaml sharding_strategy=HYBRID_SHARD\n"
      "  shardlm launch --nproc-per-node 8 --nnodes 2 --hostfile hosts -- train --config run.yaml\n"
      "  mpirun -np 4 shardlm train --config run.yaml      (equivalent)\n"
      "  srun --mpi=pmix -n 4 shardlm train --config run.yaml   (Slurm: ranks from PMIx; docs/slurm.md)");
  cmd->callback([o] {
    if (o->node_rank != 0) {
      std::printf("node %d: nothing to start here; run shardlm launch on node 0, which starts every node's ranks\n",
                  o->node_rank);
      return;
    }
    if (o->nnodes > 1 && o->hostfile.empty())
      throw Error("--nnodes > 1 needs --hostfile naming the nodes (mpirun starts them all from here)",
                  {.key = "--hostfile"});
    const int ranks = o->nproc_per_node * o->nnodes;
    const int cores = int(std::thread::hardware_concurrency());
    const int threads = o->threads > 0 ? o->threads : std::max(1, cores / o->nproc_per_node);
    std::vector<std::string> args = {"mpirun", "-np", std::to_string(ranks), "--bind-to", "none",
                                     "-x", fmt::format("OMP_NUM_THREADS={}", threads)};
    if (o->nnodes > 1) {
      args.insert(args.end(), {"--hostfile", o->hostfile, "--map-by", fmt::format("ppr:{}:node", o->nproc_per_node)});
    } else if (o->nproc_per_node > cores) {
      args.push_back("--oversubscribe");  // more ranks than cores on one machine: allowed, but slow
    }
    if (geteuid() == 0) args.push_back("--allow-run-as-root");
    args.push_back(self_path());
    args.insert(args.end(), o->command.begin(), o->command.end());
    std::string line;
    for (const std::string& a : args) line += (line.empty() ? "" : " ") + a;
    if (o->dry_run) {
      std::printf("%s\n", line.c_str());
      return;
    }
    std::fprintf(stderr, "shardlm launch: %s\n", line.c_str());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp("mpirun", argv.data());
    throw Error(fmt::format("cannot run mpirun: {} (install openmpi-bin)", std::strerror(errno)));
  });
}

}  // namespace shardlm::cli
