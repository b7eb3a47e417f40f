// How a rank learns its node layout from its launcher's environment (mpirun, srun, sbatch): ranks per
// node (which sizes HYBRID_SHARD's shard groups), local rank (which picks the GPU) and the log line
// naming the launcher. The real srun path runs in tests/scripts/slurm_cli.sh; these cover the
// layouts one machine cannot produce (several nodes, uneven placement).
// Owner: comm.
#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "comm/communicator.h"

using namespace shardlm;

namespace {

// Sets exactly the given launcher variables for the test's lifetime (every other one it knows is
// unset, so a ctest run inside a Slurm job or under mpirun sees the same), and restores them after.
class LauncherEnv {
 public:
  explicit LauncherEnv(std::initializer_list<std::pair<std::string, std::string>> vars) {
    for (const char* name : kNames) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      unsetenv(name);
    }
    for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  }
  ~LauncherEnv() {
    for (const auto& [k, v] : saved_) v ? setenv(k.c_str(), v->c_str(), 1) : unsetenv(k.c_str());
  }
  LauncherEnv(const LauncherEnv&) = delete;
  LauncherEnv& operator=(const LauncherEnv&) = delete;

 private:
  static constexpr const char* kNames[] = {
      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_RANK", "PMI_RANK",
      "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
      "SLURM_LOCALID", "SLURM_MPI_TYPE", "MPI_LOCALNRANKS", "LOCAL_RANK"};
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace

TEST(LauncherEnv, SrunTasksPerNodeInEveryForm) {
  const std::pair<const char*, int> cases[] = {
      {"2", 2}, {"8(x2)", 8}, {"8,8", 8}, {"8(x2),8", 8}, {"4(x3),4(x1)", 4},
      // srun placed different numbers of tasks on different nodes: no one count is right.
      {"5,3", 0}, {"8(x2),4", 0},
      // Not srun's syntax: unknown rather than a guess.
      {"x", 0}, {"8(x2", 0}, {"0", 0}, {"8;8", 0}};
  for (const auto& [spec, want] : cases) {
    LauncherEnv env({{"SLURM_STEP_TASKS_PER_NODE", spec}});
    EXPECT_EQ(comm::ranks_per_node_from_environment(), want) << spec;
  }
}

TEST(LauncherEnv, RanksPerNodePrecedence) {
  {
    LauncherEnv env({});
    EXPECT_EQ(comm::ranks_per_node_from_environment(), 0);
  }
  {  // mpirun inside an sbatch allocation: mpirun's own count wins over the job's.
    LauncherEnv env({{"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"SLURM_NTASKS_PER_NODE", "2"}});
    EXPECT_EQ(comm::ranks_per_node_from_environment(), 4);
  }
  {  // srun's step layout wins over sbatch --ntasks-per-node (the step may use fewer tasks).
    LauncherEnv env({{"SLURM_STEP_TASKS_PER_NODE", "8(x2)"}, {"SLURM_NTASKS_PER_NODE", "4"}});
    EXPECT_EQ(comm::ranks_per_node_from_environment(), 8);
  }
  {
    LauncherEnv env({{"SLURM_NTASKS_PER_NODE", "8"}});
    EXPECT_EQ(comm::ranks_per_node_from_environment(), 8);
  }
}

TEST(LauncherEnv, SrunRankNamesItsJobAndLocalRank) {
  LauncherEnv env({{"SLURM_JOB_ID", "42"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "16"},
                   {"SLURM_STEP_TASKS_PER_NODE", "8(x2)"}, {"SLURM_LOCALID", "3"}, {"SLURM_MPI_TYPE", "pmix"},
                   {"PMIX_RANK", "11"}});
  EXPECT_TRUE(comm::launched_by_mpi());
  EXPECT_EQ(comm::local_rank_from_environment(), 3);
  EXPECT_EQ(comm::describe_launcher(),
            "srun (Slurm job 42, step 0, pmix), 8 ranks per node, local rank from SLURM_LOCALID");
}

TEST(LauncherEnv, MpirunInsideAnAllocation) {
  LauncherEnv env({{"SLURM_JOB_ID", "42"}, {"SLURM_LOCALID", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  EXPECT_EQ(comm::local_rank_from_environment(), 1);  // mpirun's, not the batch script's SLURM_LOCALID
  EXPECT_EQ(comm::describe_launcher(),
            "mpirun inside Slurm job 42, 2 ranks per node, local rank from OMPI_COMM_WORLD_LOCAL_RANK");
}

TEST(LauncherEnv, OneProcessByHandOrOneSrunTask) {
  {
    LauncherEnv env({});
    EXPECT_FALSE(comm::launched_by_mpi());
    EXPECT_EQ(comm::describe_launcher(), "");
  }
  {  // srun -n 1: not an MPI job (no PMIx server needed), one process.
    LauncherEnv env({{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}});
    EXPECT_FALSE(comm::launched_by_mpi());
    EXPECT_EQ(comm::describe_launcher(), "");
  }
}
