// `shardlm env`: what this build and machine offer. The first thing to paste into a bug report.
#include <fmt/format.h>

#include <cstdlib>

#include "cli/commands.h"
#include "core/alloc.h"
#include "core/platform.h"
#include "ops/cpu_bf16.h"

namespace shardlm::cli {

void register_env(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("env", "Print the build configuration and the devices this machine offers");
  cmd->footer("Example:\n  shardlm env");
  cmd->callback([] {
    const PlatformInfo p = platform_info();
    fmt::print("shardlm {}\n", p.version);
    fmt::print("cpu threads (OpenMP): {}\n", p.omp_threads);
    fmt::print("blas: {}\n", p.blas);
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    fmt::print("blas core: {}{}\n", blas_core(),
               coretype ? fmt::format(" (OPENBLAS_CORETYPE={})", coretype) : std::string());
    fmt::print("cpu bf16: {}\n", ops::cpu_bf16_status().line);
    fmt::print("mpi: {}\n", p.built_with_mpi ? "built in" : "not built");
    fmt::print("cuda: {}\n", p.built_with_cuda ? "built in" : "not built");
    if (p.cuda_devices.empty()) fmt::print("cuda devices: none ({})\n", p.cuda_status);
    for (size_t i = 0; i < p.cuda_devices.size(); ++i) {
      const auto& d = p.cuda_devices[i];
      fmt::print("cuda device {}: {} (sm_{}{}, {})\n", i, d.name, d.compute_major, d.compute_minor,
                 format_bytes(int64_t(d.total_bytes)));
    }
  });
}

}  // namespace shardlm::cli
