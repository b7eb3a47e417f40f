// Shared by the fuzz targets (one per file format the program reads; see docs/fuzzing.md).
//
// Each target hands the fuzzer's bytes to the product's own loader, through a file, since the
// loaders take paths as the product does. The rule every target checks: the loader returns, or
// throws shardlm::Error (the one-line error a user would see). Anything else is a finding: a
// crash, a sanitizer report (ASan, UBSan, LeakSanitizer), a hang, or another exception type
// escaping, which libFuzzer reports as an uncaught exception and aborts on.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace shardlm::fuzz {

// A directory of this process's own on tmpfs (/dev/shm when present), so writing the input costs
// no disk I/O per execution. Files are overwritten per input; the directory goes at exit.
class Scratch {
 public:
  Scratch() {
    const std::filesystem::path base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    dir_ = base / ("shardlm-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  const std::filesystem::path& dir() const { return dir_; }
  // Writes `bytes` to `name` in the directory and returns its path.
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::string p = path(name);
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    return p;
  }

 private:
  std::filesystem::path dir_;
};

inline Scratch& scratch() {
  static Scratch s;  // one per fuzzing process
  return s;
}

// The input as text.
inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Splits the input at NUL bytes into at most `parts` pieces (targets that read several files take
// one piece each; the seeds in fuzz/corpus show the layout). Missing pieces are empty.
inline std::vector<std::string_view> split_parts(std::string_view in, size_t parts) {
  std::vector<std::string_view> out;
  while (out.size() + 1 < parts) {
    const size_t nul = in.find('\0');
    if (nul == std::string_view::npos) break;
    out.push_back(in.substr(0, nul));
    in.remove_prefix(nul + 1);
  }
  out.push_back(in);
  out.resize(parts);
  return out;
}

}  // namespace shardlm::fuzz

// The body of a target: Errors are the expected outcome of bad input; nothing else may escape.
#define SHARDLM_FUZZ_EXPECT_ERRORS(...)  \
  do {                                   \
    try {                                \
      __VA_ARGS__                        \
    } catch (const ::shardlm::Error&) {  \
    }                                    \
  } while (0)
