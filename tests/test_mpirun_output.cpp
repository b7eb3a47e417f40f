// What `shardlm launch` lets through of mpirun's stderr (comm/mpirun_output.h): Open MPI's notice
// after MPI_Abort goes, everything else passes unchanged, however the stream is split into reads.
// Owner: comm.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/mpirun_output.h"

using shardlm::comm::MpirunStderrFilter;

namespace {

const std::string kRule(74, '-');
// Open MPI 4.1's notice after MPI_Abort, as mpirun prints it.
const std::string kAbortNotice = kRule + "\n" +
                                 "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\n"
                                 "with errorcode 1.\n"
                                 "\n"
                                 "NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.\n"
                                 "You may or may not see output from other processes, depending on\n"
                                 "exactly when Open MPI kills them.\n" +
                                 kRule + "\n";
const std::string kSignalNotice = kRule + "\n" +
                                  "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 "
                                  "(Killed).\n" +
                                  kRule + "\n";
const std::string kErrorLine = "shardlm: error: rank 0: command line: key 'max_stepz': unknown key\n";

// The filter's output for `input` fed in pieces of `piece` bytes (0: all at once), then finished.
std::string filtered(const std::string& input, size_t piece = 0, const std::vector<std::string>& echoes = {}) {
  std::string out;
  MpirunStderrFilter filter([&](std::string_view b) { out += b; }, echoes);
  if (piece == 0) piece = input.size() + 1;
  for (size_t i = 0; i < input.size(); i += piece) filter.feed(std::string_view(input).substr(i, piece));
  filter.finish();
  return out;
}

// The same output for every split of the stream into reads of 1..17 bytes and all at once.
void expect_filtered(const std::string& input, const std::string& want, const std::vector<std::string>& echoes = {}) {
  EXPECT_EQ(filtered(input, 0, echoes), want);
  for (size_t piece = 1; piece <= 17; ++piece)
    EXPECT_EQ(filtered(input, piece, echoes), want) << "pieces of " << piece;
}

// The trainer's line when a signal stops it before its first step (train/stop_signal.h), which
// `shardlm launch` gives the filter as an echo.
const std::string kStopped = "error: stopped by a signal before the first step (nothing to save)";
const std::vector<std::string> kEchoes = {kStopped};

}  // namespace

TEST(MpirunStderrFilter, DropsTheAbortNoticeAfterAnErrorLine) {
  const std::string before = "step 1/10 | loss 6.28\n" + kErrorLine;
  expect_filtered(before + kAbortNotice, before);
  expect_filtered(before + kAbortNotice + "after\n", before + "after\n");
}

TEST(MpirunStderrFilter, DropsTheAbortNoticeBeforeAnErrorLine) {
  // The notice and the rank's own line reach mpirun apart, in either order.
  expect_filtered(kAbortNotice + kErrorLine, kErrorLine);
  expect_filtered("step 1\n" + kAbortNotice + "step 2\n" + kErrorLine, "step 1\nstep 2\n" + kErrorLine);
}

TEST(MpirunStderrFilter, CondensesAnAbortNoticeThatNoErrorLineExplains) {
  expect_filtered("step 1/10 | loss 6.28\n" + kAbortNotice,
                  "step 1/10 | loss 6.28\nshardlm launch: MPI_ABORT was invoked on rank 0 in communicator "
                  "MPI_COMM_WORLD with errorcode 1. (no rank printed an error)\n");
  // A line that only mentions an error further in is not the rank's error line.
  expect_filtered("warning: shardlm: error: not at the start\n" + kAbortNotice,
                  "warning: shardlm: error: not at the start\nshardlm launch: MPI_ABORT was invoked on rank 0 in "
                  "communicator MPI_COMM_WORLD with errorcode 1. (no rank printed an error)\n");
}

TEST(MpirunStderrFilter, DropsTheLogLineOfANoticeCutShortAfterAnErrorLine) {
  // What mpirun printed instead of the abort notice in one of two 3-rank aborts here.
  const std::string lost =
      "[vm:27351] [[1577,0],0] ORTE_ERROR_LOG: Data unpack would read past end of buffer in file "
      "../../../orte/util/show_help.c at line 501\n";
  expect_filtered(kErrorLine + lost, kErrorLine);
  for (const char* why : {"Data unpack had inadequate space", "Out of resource"}) {
    const std::string also =
        std::string("[vm:21652] [[14442,0],0] ORTE_ERROR_LOG: ") + why + " in file ../../../orte/util/show_help.c at line 513\n";
    expect_filtered(kErrorLine + also, kErrorLine);
  }
  expect_filtered(kErrorLine + lost + kAbortNotice, kErrorLine);
  expect_filtered(lost + kErrorLine, kErrorLine);
  // With no error line to explain the job's end it stays (written at the end), as do mpirun's
  // other log lines (in place).
  expect_filtered(lost + "step 2\n", "step 2\n" + lost);
  const std::string other = "[vm:27351] [[1577,0],0] ORTE_ERROR_LOG: Not found in file plm_base_launch_support.c\n";
  expect_filtered(kErrorLine + other, kErrorLine + other);
}

TEST(MpirunStderrFilter, KeepsEveryOtherNoticeAndLine) {
  // The notice naming a killed rank is the only place it is named.
  expect_filtered(kSignalNotice, kSignalNotice);
  expect_filtered(kErrorLine + kSignalNotice + kAbortNotice, kErrorLine + kSignalNotice);
  // Lines of or with dashes that are not rules, and a rule alone at the end.
  const std::string dashes = "--- a list item\n-\n----------\n--x--\n" + kRule + "\n" + kRule + "\n";
  expect_filtered(dashes, dashes);
  const std::string brackets = "[1/3] loading\n[\n[" + std::string(3000, 'x') + "]\n[a]\r[b]\n";
  expect_filtered(brackets, brackets);
  const std::string unfinished = kErrorLine + kRule + "\nMPI_ABORT was invoked on rank 0 in comm";
  expect_filtered(unfinished, unfinished);
  expect_filtered(kErrorLine + kRule, kErrorLine + kRule);
}

TEST(MpirunStderrFilter, PassesAPartialLineAtOnce) {
  // A progress bar redraws its line with '\r' and never ends it until the run does.
  std::string out;
  MpirunStderrFilter filter([&](std::string_view b) { out += b; });
  filter.feed("\rstep 1/10 [#    ]");
  EXPECT_EQ(out, "\rstep 1/10 [#    ]");
  filter.feed("\rstep 2/10 [##   ]");
  EXPECT_EQ(out, "\rstep 1/10 [#    ]\rstep 2/10 [##   ]");
  // Dashes are held only while they could be a rule: the first other byte lets them through.
  filter.feed("\n--");
  EXPECT_EQ(out.substr(out.size() - 1), "\n");
  filter.feed("> next");
  EXPECT_EQ(out.substr(out.size() - 9), "\n--> next");
  // So is a line of mpirun's form, which starts with '[': until '\r', or its end.
  filter.feed("\n[##   ] 20%");
  EXPECT_EQ(out.substr(out.size() - 7), "> next\n");
  filter.feed("\r");
  EXPECT_EQ(out.substr(out.size() - 12), "[##   ] 20%\r");
}

TEST(MpirunStderrFilter, LetsAnEndlessNoticeThrough) {
  // A rule opening something that never closes is not held back for ever.
  std::string input = kRule + "\n";
  for (int i = 0; i < 2000; ++i) input += "a line of a notice that does not end, " + std::to_string(i) + "\n";
  std::string out;
  MpirunStderrFilter filter([&](std::string_view b) { out += b; });
  filter.feed(input);
  EXPECT_EQ(out, input);
}

TEST(MpirunStderrFilter, HoldsTheLineOfARankTakenDownInItsSetupForTheEnd) {
  const std::string stopped = kStopped + "\n";
  // Another rank's error took the job down: its line is the one line, wherever the echo falls.
  expect_filtered(kErrorLine + stopped + kAbortNotice, kErrorLine, kEchoes);
  expect_filtered(stopped + kAbortNotice + kErrorLine + stopped, kErrorLine, kEchoes);
  // No rank printed an error (a user's Ctrl-C reached every rank in its setup): once, at the end.
  expect_filtered(stopped + "step 0\n" + stopped, "step 0\n" + stopped, kEchoes);
  // Lines that begin as the echo does, and are not it, pass in place, unchanged.
  const std::string others = "error: stopped by something else\n" + kStopped + " and more\nerror: st\rerror\n";
  expect_filtered(others + stopped, others + stopped, kEchoes);
  expect_filtered(kErrorLine + others + stopped, kErrorLine + others, kEchoes);
  // An echo's beginning left unfinished at the end passes as it is.
  expect_filtered("step 1\nerror: stopped by a sig", "step 1\nerror: stopped by a sig", kEchoes);
  // Without echoes the line is any other.
  expect_filtered(kErrorLine + stopped, kErrorLine + stopped);
  // A line held as a possible echo is still seen as a rank's error line when it is one.
  expect_filtered(kErrorLine + kAbortNotice, kErrorLine, {"shardlm: error: stopped"});
}
