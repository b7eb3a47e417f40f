// `shardlm launch`: start a multi-rank job through mpirun, as accelerate launch / torchrun do.
//
// mpirun starts every rank of every node from the first node (ssh to the others, per the
// hostfile); ranks then find each other through MPI. Each rank gets cores / nproc_per_node
// OpenMP threads so that ranks sharing a node do not oversubscribe it.
//
// launch stays mpirun's parent for the job's life rather than becoming it (exec), for two things:
//  - Errors stay one line: mpirun's stderr passes through MpirunStderrFilter, which drops the
//    notice Open MPI prints after a rank's MPI_Abort (comm/mpirun_output.h).
//  - A stop saves: mpirun answers SIGINT or SIGTERM by killing the ranks about a second later,
//    too soon for a checkpoint, and exits 1. So mpirun runs in a process group of its own (Ctrl-C
//    and a signal to launch's group reach launch alone), and launch relays the first SIGINT,
//    SIGTERM or SIGHUP as SIGUSR1, which mpirun passes to every rank on every node and the trainer
//    takes as a stop (save_on_signal: finish the step, checkpoint, exit 0). A second one is relayed
//    as SIGTERM, mpirun's own teardown. SIGUSR1 and SIGUSR2 are relayed as they are.
// launch exits with mpirun's status (128 + the signal if mpirun was killed by one).
//
// Settings reach every node: mpirun passes its own environment to the ranks of its own node only;
// the other nodes' ranks start from what ssh gives them. So launch names every SHARDLM_* and OMP_*
// variable of its environment with `-x NAME` (mpirun then sets it on every node), as it sets
// OMP_NUM_THREADS itself. A setting on one node alone is worse than none: with SHARDLM_SHM=0 on
// one node only, the nodes took different collective paths and the job hung.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <string_view>
#include <thread>

#include "cli/commands.h"
#include "comm/mpirun_output.h"
#include "core/error.h"

namespace shardlm::cli {

namespace {
std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw Error(fmt::format("cannot find the shardlm executable: {}", std::strerror(errno)));
  return std::string(buf, size_t(n));
}

// The variables of launch's environment that every node's ranks must see (see the top), sorted so
// that the command line does not depend on the environment's order. OMP_NUM_THREADS is launch's own.
std::vector<std::string> forwarded_variables() {
  std::vector<std::string> names;
  for (char** e = environ; *e; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    if ((name.starts_with("SHARDLM_") || name.starts_with("OMP_")) && name != "OMP_NUM_THREADS")
      names.emplace_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// ---- relaying signals to mpirun (see the top) -------------------------------------------------------
volatile std::sig_atomic_t g_mpirun = 0;  // mpirun's pid while it runs
volatile std::sig_atomic_t g_stops = 0;   // stop signals received so far
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr int kRelayedSignals[] = {SIGUSR1, SIGUSR2};

void say(std::string_view text) {  // async-signal-safe
  while (!text.empty()) {
    const ssize_t n = write(STDERR_FILENO, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(size_t(n));
  }
}

void relay_signal(int sig) {
  const int saved_errno = errno;
  const pid_t mpirun = g_mpirun;
  if (mpirun > 0 && (sig == SIGUSR1 || sig == SIGUSR2)) {
    kill(mpirun, sig);
  } else if (mpirun > 0) {
    const char* name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
    say("shardlm launch: ");
    say(name);
    const int stops = g_stops;
    g_stops = stops + 1;
    if (stops == 0) {
      say(": every rank stops after its current step and saves a checkpoint if checkpointing is configured "
          "(save_on_signal); a second signal ends the job at once\n");
      kill(mpirun, SIGUSR1);
    } else {
      say(" again: ending the job now\n");
      kill(mpirun, SIGTERM);
    }
  }
  errno = saved_errno;
}

// Runs `args` (mpirun and its arguments) as described at the top; returns its exit status.
int run_mpirun(std::vector<std::string>& args) {
  std::vector<char*> argv;  // made before fork: the child only calls what is safe after it
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) throw Error(fmt::format("cannot make a pipe for mpirun: {}", std::strerror(errno)));
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) throw Error(fmt::format("cannot start mpirun: {}", std::strerror(errno)));
  if (child == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // launch killed: mpirun ends the job rather than run on unseen
    if (getppid() != parent) _exit(1);
    // In a background process group a read from the terminal would stop mpirun (SIGTTIN); the
    // ranks read nothing from it. A pipe or file stays stdin, forwarded to rank 0 as before.
    if (isatty(STDIN_FILENO)) {
      const int null = open("/dev/null", O_RDONLY);
      if (null >= 0) dup2(null, STDIN_FILENO);
    }
    dup2(out[1], STDERR_FILENO);
    execvp("mpirun", argv.data());
    say("shardlm: error: cannot run mpirun: ");
    say(std::strerror(errno));
    say(" (install openmpi-bin)\n");
    _exit(127);
  }
  setpgid(child, 0);  // also here, so that no signal finds mpirun still in our group
  close(out[1]);
  g_mpirun = child;
  struct sigaction sa {};
  sa.sa_handler = relay_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : kStopSignals) sigaddset(&sa.sa_mask, s);
  for (int s : kRelayedSignals) sigaddset(&sa.sa_mask, s);
  for (int s : kStopSignals) sigaction(s, &sa, nullptr);
  for (int s : kRelayedSignals) sigaction(s, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // our stderr gone: keep draining mpirun's, so that it never blocks

  comm::MpirunStderrFilter filter(say);
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(out[0], buf, sizeof buf);
    if (n > 0) {
      filter.feed(std::string_view(buf, size_t(n)));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  filter.finish();
  close(out[0]);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  g_mpirun = 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
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
      "  srun --mpi=pmix -n 4 shardlm train --config run.yaml   (Slurm: ranks from PMIx; docs/slurm.md)\n"
      "\n"
      "Ctrl-C or SIGTERM to launch: every rank finishes its step, checkpoints (save_on_signal) and exits 0;\n"
      "a second one ends the job at once. launch exits with mpirun's status.");
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
    for (const std::string& name : forwarded_variables()) args.insert(args.end(), {"-x", name});
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
    std::fflush(stderr);
    const int status = run_mpirun(args);
    std::fflush(stdout);
    std::exit(status);  // the job's status is launch's
  });
}

}  // namespace shardlm::cli
