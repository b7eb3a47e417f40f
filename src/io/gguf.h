// The GGUF file format (ggml's docs/gguf.md, version 3): writing, and the tensor types shardlm
// exports (F32, F16, BF16, Q8_0).
//
// A file is, little-endian throughout:
//   "GGUF", u32 version 3, u64 tensor count, u64 key-value count,
//   the key-values: each a string key, a u32 value type and the value (strings are a u64 length
//     and the bytes; arrays a u32 element type, a u64 count and the elements),
//   the tensor infos: each a string name, u32 n_dims, n_dims u64 dimensions in ggml order (the
//     fastest-varying first: a row-major [rows, cols] matrix is {cols, rows}), u32 ggml type, u64
//     offset of its data from the start of the data section (a multiple of the alignment),
//   zero padding to the alignment ("general.alignment", 32 here), then the data section, each
//   tensor's data padded to the alignment.
//
// GgufMetadata builds the key-values; GgufWriter streams a file whose tensors are declared up
// front, tensor by tensor, so a converter never holds the whole model. The file is written
// atomically (io/atomic_file.h): the path is replaced only once the file is complete and synced.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/q8_0.h"
#include "io/atomic_file.h"

namespace shardlm::io {

inline constexpr uint32_t kGgufVersion = 3;
inline constexpr uint32_t kGgufAlignment = 32;

// The ggml tensor types written here (ggml's enum ggml_type values).
enum class GgmlType : uint32_t { F32 = 0, F16 = 1, Q8_0 = 8, BF16 = 30 };
const char* ggml_type_name(GgmlType t);  // "F32", "F16", "Q8_0", "BF16"

// Q8_0: ggml's blocks of an f16 scale and 32 int8 (core/q8_0.h, which generation shares).
using shardlm::kQ8_0Block;
using shardlm::kQ8_0BlockBytes;
using shardlm::quantize_q8_0;
// Bytes of n elements of type t (n a multiple of 32 for Q8_0).
uint64_t ggml_nbytes(GgmlType t, int64_t n);

// GGUF's metadata value types.
enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};

// Key-values in the order they are added, serialized as they come. A key given twice is an Error.
class GgufMetadata {
 public:
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_strings(const std::string& key, const std::vector<std::string>& v);
  void add_f32s(const std::string& key, const std::vector<float>& v);
  void add_i32s(const std::string& key, const std::vector<int32_t>& v);

  bool has(const std::string& key) const { return keys_.count(key) != 0; }
  uint64_t count() const { return count_; }
  const std::string& bytes() const { return bytes_; }  // the serialized key-values

 private:
  void key(const std::string& k, GgufValueType type);
  std::string bytes_;
  std::set<std::string> keys_;
  uint64_t count_ = 0;
};

// One tensor of a GGUF file: `shape` row-major as PyTorch writes it ([rows, cols]); the file stores
// it reversed (ggml order). For Q8_0 the last dimension must be a multiple of 32.
struct GgufTensor {
  std::string name;  // at most 64 bytes (the spec's limit)
  std::vector<int64_t> shape;
  GgmlType type = GgmlType::F32;
  int64_t numel() const;
  uint64_t nbytes() const { return ggml_nbytes(type, numel()); }
};

// Streams a GGUF file: the header, key-values (with general.alignment added) and tensor infos are
// written at construction; then write() supplies each tensor's bytes, in plan order, in one or
// several chunks. finish() checks that every tensor is complete, then atomically replaces `path`.
// Destroyed without finish() (an exception), the temporary file is removed and `path` is untouched.
class GgufWriter {
 public:
  GgufWriter(std::string path, GgufMetadata metadata, std::vector<GgufTensor> plan);

  // Appends n bytes of tensor `name`, which must be the current tensor of the plan (the one after
  // the last completed); an Error names the tensor when it is another or n exceeds what it has left.
  void write(const std::string& name, const void* bytes, size_t n);
  void finish();
  uint64_t file_size() const { return file_size_; }
  uint64_t data_offset() const { return data_offset_; }  // where the data section starts

 private:
  void pad_to_alignment();
  std::string path_;
  AtomicFile file_;
  std::vector<GgufTensor> plan_;
  size_t current_ = 0;       // index of the tensor being written
  uint64_t written_ = 0;     // bytes of it written so far
  uint64_t position_ = 0;    // bytes of the file written so far
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
};

}  // namespace shardlm::io
