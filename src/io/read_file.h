// Reading a whole input file into memory: data files, tokenizer files, JSON side files.
//
// One reader so that every input gets the same checks: the path must be a regular file (a
// directory, /dev/zero or a FIFO would otherwise read as empty, fail with a bare C++ stream error,
// or never end), no larger than `max_bytes`, and read completely; each failure is one Error
// naming the path and `what` the file is ("data file", "tokenizer file" ...).
#pragma once

#include <cstdint>
#include <string>

namespace shardlm::io {

// Larger than any tokenizer or JSON side file, and than a data file this process could tokenize
// in memory anyway.
inline constexpr uint64_t kMaxInputFileBytes = uint64_t(64) << 30;

std::string read_file(const std::string& path, const std::string& what, uint64_t max_bytes = kMaxInputFileBytes);

}  // namespace shardlm::io
