// The safetensors format (https://github.com/huggingface/safetensors): reading and writing.
//
// A file is: 8 bytes little-endian header length N, N bytes of JSON header, then the data
// section. The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the data section) and may hold "__metadata__", a string->string object.
// Tensors are stored row-major, little-endian, and their byte ranges must tile the data section
// exactly: no overlaps, no gaps, nothing left over.
//
// Reading: SafetensorsFile maps the whole file read-only and validates the header completely
// when it is opened, so later accesses cannot meet a malformed entry. Every problem is one Error
// line naming the file and, where there is one, the tensor:
//   "m/model.safetensors: tensor 'lm_head.weight': data_offsets [0, 96) but shape [4, 8] of F32 needs 128 bytes"
//
// Writing: write_safetensors() for tensors in memory, SafetensorsWriter to stream a large model
// tensor by tensor. Both write atomically (io/atomic_file.h): the file at `path` is replaced only
// once it is complete and synced. Both pad the header with spaces to a multiple of 8 bytes and lay
// the data out by descending element size (as Hugging Face's writer does), so every tensor starts
// aligned to its element size and SafetensorsFile::tensor() can view it in place.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/atomic_file.h"

namespace shardlm::io {

// Bytes per element of a safetensors dtype name ("F32", "BF16", "I64", "BOOL", ...), or 0 if the
// name is not one of the fixed-width dtypes of the format.
size_t safetensors_dtype_size(const std::string& name);
// The safetensors name of a shardlm dtype: "F32", "BF16", "F16", "I32", "U8".
const char* safetensors_dtype_name(DType dtype);
// The shardlm dtype of a safetensors name, if it has one (only F32, BF16, F16, I32, U8 do).
std::optional<DType> dtype_from_safetensors(const std::string& name);

struct TensorInfo {
  std::string name;
  std::string dtype_name;      // as written in the file: "F32", "BF16", "I64", "U8", ...
  std::optional<DType> dtype;  // set only for F32, BF16, F16, I32, U8
  std::vector<int64_t> shape;  // any rank; [] is a scalar
  uint64_t begin = 0, end = 0; // absolute byte offsets in the file, [begin, end)

  size_t element_size() const { return safetensors_dtype_size(dtype_name); }
  int64_t numel() const;  // 1 for a scalar, 0 if any dimension is 0
  uint64_t nbytes() const { return end - begin; }
  std::string shape_str() const;  // "[2, 3]"
};

// A safetensors file, memory-mapped read-only and fully validated on open.
//
// Ownership and lifetime: the object owns the mapping. Tensor views returned by tensor() and the
// spans returned by bytes() point into it and are valid only while this object (or the object it
// was moved into) lives. The mapping is read-only: writing through a view crashes (SIGSEGV).
// Moving keeps the mapping (and so every view) where it is. Thread-safe for concurrent reads.
class SafetensorsFile {
 public:
  // Opens and validates `path`; throws Error (naming the file, and the tensor at fault if any).
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }  // 8 + header length

  // Tensor names in the order their data is stored in the file.
  std::vector<std::string> names() const;
  // Every entry, in the order of names().
  const std::vector<TensorInfo>& tensors() const { return infos_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // Throws Error naming the file and the tensor if there is no such tensor.
  const TensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A read-only CPU view of the tensor, in place in the mapping. Refuses (Error) dtypes without a
  // shardlm equivalent, rank above 4, and data not aligned to the element size (files written by
  // other tools may be unaligned; read_range() always works).
  Tensor tensor(const std::string& name) const;
  // The tensor's raw bytes, for any dtype and alignment.
  std::span<const uint8_t> bytes(const std::string& name) const;
  // Copy elements [elem_begin, elem_begin + elem_count) of the flattened tensor to dst (which
  // needs elem_count * element size bytes). Any dtype, any alignment; touches only those pages.
  void read_range(const std::string& name, uint64_t elem_begin, uint64_t elem_count, void* dst) const;
  // Lets the kernel drop this process's mapped pages of the whole file (they stay in the page cache).
  // A reader that streams through a file larger than its memory budget calls this between pieces,
  // so its resident set stays bounded by what it holds, not by what it has read.
  void drop_resident_pages() const;

 private:
  void parse();
  void unmap() noexcept;
  std::string path_;
  const uint8_t* base_ = nullptr;  // the mapping, size_ bytes
  uint64_t size_ = 0;
  uint64_t data_offset_ = 0;
  std::vector<TensorInfo> infos_;                    // in data order
  std::unordered_map<std::string, size_t> index_;   // name -> position in infos_
  std::map<std::string, std::string> metadata_;
};

// One tensor of a file to be streamed by SafetensorsWriter.
struct PlannedTensor {
  std::string name;
  std::string dtype;  // safetensors dtype name, e.g. "F32", "BF16", or "I64" to copy a foreign tensor
  std::vector<int64_t> shape;
  PlannedTensor(std::string name, std::string dtype, std::vector<int64_t> shape)
      : name(std::move(name)), dtype(std::move(dtype)), shape(std::move(shape)) {}
  PlannedTensor(std::string name, DType dtype, std::vector<int64_t> shape)
      : name(std::move(name)), dtype(safetensors_dtype_name(dtype)), shape(std::move(shape)) {}
};

// Streams a safetensors file whose tensors are declared up front, so a converter never has to
// hold the whole model: the header is written at construction, then write() supplies each
// tensor's bytes, in one or several consecutive chunks. Tensors may be written in any order
// (each lands at its planned offset); chunks of one tensor must come in order.
//
// finish() checks that every planned byte was written, then atomically replaces `path`.
// Destroying the writer without finish() (e.g. during an exception) removes the temporary file
// and leaves any previous file at `path` untouched.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<PlannedTensor> plan,
                    const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(SafetensorsWriter&&) noexcept = default;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept = default;

  // Append n bytes to tensor `name`. Throws if `name` is not planned or n exceeds what is left.
  void write(const std::string& name, const void* bytes, size_t n);
  // Checks that every tensor is complete and syncs the file without publishing it (AtomicFile::seal),
  // for a caller that publishes several files together; finish() then only renames it.
  void seal();
  // seal() if not done, then publish the file at its path.
  void finish();
  uint64_t file_size() const { return file_size_; }

 private:
  struct Slot {
    uint64_t offset;   // absolute file offset of the tensor's first byte
    uint64_t nbytes;
    uint64_t written = 0;
  };
  std::string path_;
  AtomicFile file_;
  std::vector<std::string> order_;  // names in plan order, for error messages
  std::unordered_map<std::string, Slot> slots_;
  uint64_t file_size_ = 0;
};

// Write `tensors` (CPU, contiguous, dtype F32/BF16/F16/I32, unique names) to `path` atomically.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace shardlm::io
