// `shardlm launch`: start a multi-rank job through mpirun, as accelerate launch / torchrun do.
//
// mpirun starts every rank of every node from the first node (ssh to the others, per the
// hostfile); ranks then find each other through MPI. Each rank gets cores / nproc_per_node
// OpenMP threads so that ranks sharing a node do not oversubscribe it.
//
// launch stays mpirun's parent for the job's life rather than becoming it (exec), for two things:
//  - Errors stay one line: mpirun's stderr passes through MpirunStderrFilter, which drops the
//    notice Open MPI prints after a rank's MPI_Abort, and holds back the line of another rank
//    stopped in its setup by that abort (comm/mpirun_output.h).
//  - A stop saves: mpirun answers SIGINT or SIGTERM by killing the ranks about a second later,
//    too soon for a checkpoint, and exits 1. So mpirun runs in a process group of its own (Ctrl-C
//    and a signal to launch's group reach launch alone), and launch relays the first SIGINT,
//    SIGTERM or SIGHUP as SIGUSR1, which mpirun passes to every rank on every node and the trainer
//    takes as a stop (save_on_signal: finish the step, checkpoint, exit 0). A second one is relayed
//    as SIGTERM, mpirun's own teardown. SIGUSR1 and SIGUSR2 are relayed as they are.
// launch exits with mpirun's status (128 + the signal if mpirun was killed by one).
//
// Restarts (--max-restarts N, torchrun's option): when mpirun ends non-zero because a rank failed
// (a rank killed, a rank's error: mpirun exits with the failed rank's status) and launch itself was
// not asked to stop, launch runs the job again, up to N times. A `train` command resumes: launch
// adds resume_from=auto to it (the newest complete checkpoint; none yet: it starts from `model`)
// unless the config or the command line already sets resume_from. MPI cannot replace a lost rank
// inside a running job, so a restart is of the whole job, from the checkpoint, as torchrun's is.
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
#include "train/stop_signal.h"
#include "train/train_config.h"

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
  } else if (mpirun <= 0 && sig != SIGUSR1 && sig != SIGUSR2) {
    g_stops = g_stops + 1;  // between two runs of a restarted job: no further run starts
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

// How mpirun ended: its exit status, or the signal that killed mpirun itself (launch's teardown,
// or someone else's kill: not a rank failure, so not a reason to restart).
struct MpirunEnd {
  int status = 0;          // launch's exit status for it: the exit code, or 128 + the signal
  bool signaled = false;   // mpirun itself was killed by a signal
};

// Runs `args` (mpirun and its arguments) as described at the top.
MpirunEnd run_mpirun(std::vector<std::string>& args) {
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

  // A rank taken down in its setup by another's abort says so; that line waits for the end (the
  // filter's lines are without their '\n').
  std::string_view stopped_in_setup = train::kStoppedInSetupLine;
  stopped_in_setup.remove_suffix(1);
  comm::MpirunStderrFilter filter(say, {std::string(stopped_in_setup)});
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
  if (WIFEXITED(status)) return {WEXITSTATUS(status), false};
  return {128 + WTERMSIG(status), true};
}

// What a restart of `command` continues from, and the command it runs. A `train` command gets
// resume_from=auto unless its config or its overrides set resume_from: the config is read by the
// trainer's own reader (train::load_train_config), so "set" means what training would see. A
// config that cannot be read is left alone: the restarted ranks report it as the first run's did.
struct Restart {
  std::vector<std::string> command;
  std::string from;  // for launch's line: "from the latest checkpoint", ...
};
Restart restart_of(const std::vector<std::string>& command) {
  if (command.empty() || command[0] != "train") return {command, "(the same command)"};
  std::string config;
  std::vector<std::string> overrides;
  for (size_t i = 1; i < command.size(); ++i) {
    const std::string& a = command[i];
    if (a == "--config" && i + 1 < command.size()) {
      config = command[++i];
    } else if (a.starts_with("--config=")) {
      config = a.substr(9);
    } else if (!a.starts_with("-")) {
      overrides.push_back(a);
    }
  }
  if (config.empty()) return {command, "(the same command)"};
  train::TrainConfig cfg;
  try {
    cfg = train::load_train_config(config, overrides);
  } catch (const std::exception&) {
    return {command, "(the same command)"};
  }
  if (!cfg.resume_from.empty())
    return {command, fmt::format("with resume_from: {} as configured", cfg.resume_from)};
  std::vector<std::string> resumed = command;
  resumed.push_back("resume_from=auto");
  if (!cfg.saves_checkpoints())
    return {resumed, "from the start (no checkpointing configured: set save_every to make restarts resume)"};
  return {resumed, "from the latest checkpoint"};
}
}  // namespace

void register_launch(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("launch", "Start a job on several ranks through mpirun");
  struct Opts {
    int nproc_per_node = 1, nnodes = 1, node_rank = 0, threads = 0, max_restarts = 0;
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
  cmd->add_option("--max-restarts", o->max_restarts,
                  "Run the job again, up to N times, after a rank fails (train resumes from the latest "
                  "checkpoint: resume_from=auto)")
      ->check(CLI::NonNegativeNumber);
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
      "a second one ends the job at once. launch exits with mpirun's status.\n"
      "\n"
      "--max-restarts N: when a rank fails (mpirun ends non-zero, and launch was not asked to stop), the whole\n"
      "job runs again, at most N times; a train command resumes with resume_from=auto (the newest complete\n"
      "checkpoint) unless its config or command line sets resume_from. Set save_every so there is one.");
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
    const size_t command_at = args.size();
    args.insert(args.end(), o->command.begin(), o->command.end());
    auto command_line = [&] {
      std::string line;
      for (const std::string& a : args) line += (line.empty() ? "" : " ") + a;
      return line;
    };
    if (o->dry_run) {
      std::printf("%s\n", command_line().c_str());
      return;
    }
    // What a restart runs, the same for every restart (the config is read only when restarts may come).
    const Restart next = o->max_restarts > 0 ? restart_of(o->command) : Restart{};
    for (int restart = 0;; ++restart) {
      std::fprintf(stderr, "shardlm launch: %s\n", command_line().c_str());
      std::fflush(stderr);
      const MpirunEnd end = run_mpirun(args);
      std::fflush(stdout);
      // A rank failure is a non-zero exit of mpirun itself; a stop asked of launch (Ctrl-C,
      // SIGTERM: the trainer saves and exits 0, or the second signal's teardown) or a signal that
      // killed mpirun is the user's or the scheduler's, and is not undone by a restart.
      if (end.status == 0 || end.signaled || g_stops > 0 || restart >= o->max_restarts) {
        if (end.status != 0 && !end.signaled && g_stops == 0 && o->max_restarts > 0)
          std::fprintf(stderr, "shardlm launch: rank failure (exit %d); no restarts left (--max-restarts %d)\n",
                       end.status, o->max_restarts);
        std::exit(end.status);  // the job's status is launch's
      }
      if (g_stops > 0) std::exit(end.status);  // a stop that came while no job ran: none starts
      args.resize(command_at);
      args.insert(args.end(), next.command.begin(), next.command.end());
      std::fprintf(stderr, "shardlm launch: rank failure (exit %d); restart %d of %d %s\n", end.status, restart + 1,
                   o->max_restarts, next.from.c_str());
    }
  });
}

}  // namespace shardlm::cli
