#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <unordered_set>

#include "core/error.h"
#include "io/json_integer.h"
#include "io/json_parse.h"

namespace shardlm::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swapping");

using json = nlohmann::json;

namespace {

// The reference implementation refuses headers above 100 MB; so do we, before parsing.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Builds the one-line error: "<path>: tensor '<name>': <message>".
Error file_error(const std::string& path, const std::string& tensor, std::string message) {
  Error e(std::move(message));
  e.set_file(path);
  if (!tensor.empty()) e.set_tensor(tensor);
  return e;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

// Element count of `shape`, or nullopt if it overflows int64 (or the byte count overflows uint64).
std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape, size_t elem_size) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, uint64_t(d), &n)) return std::nullopt;
  }
  uint64_t bytes;
  if (n > uint64_t(std::numeric_limits<int64_t>::max()) || __builtin_mul_overflow(n, uint64_t(elem_size), &bytes))
    return std::nullopt;
  return int64_t(n);
}

// A JSON value that is a non-negative integer fitting int64, or nullopt.
std::optional<int64_t> non_negative_int(const json& v) { return json_integer(v, 0); }

}  // namespace

// ---- dtypes --------------------------------------------------------------------------------------

size_t safetensors_dtype_size(const std::string& name) {
  // The fixed-width dtypes of the format. Sub-byte ones (F4, F6_*) cannot be described by a byte
  // range per element and are treated as unknown.
  static const std::unordered_map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},     {"C64", 8},
  };
  auto it = sizes.find(name);
  return it == sizes.end() ? 0 : it->second;
}

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(const std::string& name) {
  if (name == "F32") return DType::F32;
  if (name == "BF16") return DType::BF16;
  if (name == "F16") return DType::F16;
  if (name == "I32") return DType::I32;
  if (name == "U8") return DType::U8;
  return std::nullopt;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated on open not to overflow
  return n;
}

std::string TensorInfo::shape_str() const { return shape_string(shape); }

// ---- reading ---------------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw file_error(path_, "", fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd);
    throw file_error(path_, "", S_ISREG(st.st_mode) ? fmt::format("cannot stat: {}", std::strerror(err))
                                                     : std::string("not a regular file"));
  }
  size_ = uint64_t(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw file_error(path_, "", fmt::format("file of {} bytes is too short for a safetensors file "
                                            "(the header length alone takes 8 bytes)", size_));
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) throw file_error(path_, "", fmt::format("cannot mmap: {}", std::strerror(err)));
  base_ = static_cast<const uint8_t*>(p);
  try {
    parse();
  } catch (...) {
    unmap();
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() noexcept {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  base_ = nullptr;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      data_offset_(o.data_offset_),
      infos_(std::move(o.infos_)),
      index_(std::move(o.index_)),
      metadata_(std::move(o.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    data_offset_ = o.data_offset_;
    infos_ = std::move(o.infos_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

void SafetensorsFile::parse() {
  uint64_t header_len;
  std::memcpy(&header_len, base_, 8);  // little-endian (static_assert above)
  if (header_len > kMaxHeaderBytes)
    throw file_error(path_, "", fmt::format("header length {} is absurd (limit {} bytes): not a safetensors file?",
                                            header_len, kMaxHeaderBytes));
  if (header_len > size_ - 8)
    throw file_error(path_, "", fmt::format("header length {} exceeds the {} bytes after the length field "
                                            "(truncated or not a safetensors file)", header_len, size_ - 8));
  data_offset_ = 8 + header_len;
  const uint64_t data_size = size_ - data_offset_;

  json header;
  try {
    header = parse_json(base_ + 8, base_ + 8 + header_len);
  } catch (const json::exception& e) {
    throw file_error(path_, "", fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object())
    throw file_error(path_, "", fmt::format("header is JSON {} but must be an object", header.type_name()));

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      // The reference reader accepts null here; anything else must be string -> string.
      if (entry.is_null()) continue;
      if (!entry.is_object())
        throw Error(fmt::format("must be an object of strings, not {}", entry.type_name()))
            .set_file(path_).set_key("__metadata__");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          throw Error(fmt::format("value of '{}' is {}, but metadata values must be strings", k, v.type_name()))
              .set_file(path_).set_key("__metadata__");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    // (name captured by copy: clang before 16 cannot capture a structured binding)
    auto bad = [this, tensor = name](std::string msg) { return file_error(path_, tensor, std::move(msg)); };
    if (name.empty()) throw file_error(path_, "", "header holds a tensor with an empty name");
    if (!entry.is_object()) throw bad(fmt::format("header entry is JSON {}, not an object", entry.type_name()));

    TensorInfo ti;
    ti.name = name;
    auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) throw bad("missing or non-string \"dtype\"");
    ti.dtype_name = dt->get<std::string>();
    const size_t esize = safetensors_dtype_size(ti.dtype_name);
    if (esize == 0) throw bad(fmt::format("unknown dtype '{}'", ti.dtype_name));
    ti.dtype = dtype_from_safetensors(ti.dtype_name);

    auto sh = entry.find("shape");
    if (sh == entry.end() || !sh->is_array()) throw bad("missing \"shape\" array");
    for (const json& d : *sh) {
      auto v = non_negative_int(d);
      if (!v) throw bad(fmt::format("shape {} has an entry that is not a non-negative integer", sh->dump()));
      ti.shape.push_back(*v);
    }

    auto off = entry.find("data_offsets");
    if (off == entry.end() || !off->is_array() || off->size() != 2 || !non_negative_int((*off)[0]) ||
        !non_negative_int((*off)[1]))
      throw bad("\"data_offsets\" must be an array of two non-negative integers [begin, end]");
    const uint64_t b = uint64_t(*non_negative_int((*off)[0]));
    const uint64_t e = uint64_t(*non_negative_int((*off)[1]));
    if (b > e) throw bad(fmt::format("data_offsets [{}, {}) has begin after end", b, e));
    if (e > data_size)
      throw bad(fmt::format("data_offsets [{}, {}) extend past the data section of {} bytes (truncated file?)", b,
                            e, data_size));
    auto numel = checked_numel(ti.shape, esize);
    if (!numel) throw bad(fmt::format("shape {} is too large", shape_string(ti.shape)));
    if (uint64_t(*numel) * esize != e - b)
      throw bad(fmt::format("data_offsets [{}, {}) span {} bytes but shape {} of {} needs {}", b, e, e - b,
                            shape_string(ti.shape), ti.dtype_name, uint64_t(*numel) * esize));
    ti.begin = data_offset_ + b;
    ti.end = data_offset_ + e;
    infos_.push_back(std::move(ti));
  }

  // The byte ranges must tile the data section: sorted by offset, each starts where the previous
  // one ended. This catches overlaps, gaps and trailing junk (and duplicate JSON keys, whose
  // dropped entry leaves a hole).
  std::sort(infos_.begin(), infos_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t expected = data_offset_;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& ti : infos_) {
    if (ti.begin < expected)
      throw file_error(path_, ti.name,
                       fmt::format("data_offsets [{}, {}) overlap tensor '{}' at [{}, {})", ti.begin - data_offset_,
                                   ti.end - data_offset_, prev->name, prev->begin - data_offset_,
                                   prev->end - data_offset_));
    if (ti.begin > expected)
      throw file_error(path_, ti.name,
                       fmt::format("gap in the data section: bytes [{}, {}) before this tensor belong to no tensor",
                                   expected - data_offset_, ti.begin - data_offset_));
    expected = ti.end;
    prev = &ti;
  }
  if (expected != size_)
    throw file_error(path_, "",
                     fmt::format("data section has {} bytes after the last tensor that belong to no tensor",
                                 size_ - expected));
  for (size_t i = 0; i < infos_.size(); ++i) index_.emplace(infos_[i].name, i);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(infos_.size());
  for (const TensorInfo& ti : infos_) out.push_back(ti.name);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw file_error(path_, name, "no such tensor in this file");
  return infos_[it->second];
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo& ti = info(name);
  if (!ti.dtype)
    throw file_error(path_, name, fmt::format("dtype {} has no shardlm equivalent (F32, BF16, F16, I32, U8); "
                                              "read_range() can still copy its raw bytes", ti.dtype_name));
  if (ti.shape.size() > size_t(kMaxDims))
    throw file_error(path_, name, fmt::format("rank {} (shape {}) exceeds shardlm's maximum of {}",
                                              ti.shape.size(), ti.shape_str(), kMaxDims));
  // The mapping is page-aligned, so the file offset decides the alignment of the view.
  if (ti.begin % ti.element_size() != 0)
    throw file_error(path_, name, fmt::format("data at file offset {} is not aligned to its {}-byte elements "
                                              "(written by a tool that does not pad the header); use read_range()",
                                              ti.begin, ti.element_size()));
  // const_cast: Tensor has no const flavour; the mapping is PROT_READ, see the header comment.
  return Tensor::view(const_cast<uint8_t*>(base_ + ti.begin), *ti.dtype, ti.shape.data(), int(ti.shape.size()));
}

std::span<const uint8_t> SafetensorsFile::bytes(const std::string& name) const {
  const TensorInfo& ti = info(name);
  return {base_ + ti.begin, size_t(ti.nbytes())};
}

void SafetensorsFile::read_range(const std::string& name, uint64_t elem_begin, uint64_t elem_count,
                                 void* dst) const {
  const TensorInfo& ti = info(name);
  const uint64_t n = uint64_t(ti.numel());
  if (elem_begin > n || elem_count > n - elem_begin)
    throw file_error(path_, name, fmt::format("element range [{}, {}+{}) outside the tensor's {} elements",
                                              elem_begin, elem_begin, elem_count, n));
  const size_t es = ti.element_size();
  if (elem_count > 0) std::memcpy(dst, base_ + ti.begin + elem_begin * es, elem_count * es);
}

void SafetensorsFile::drop_resident_pages() const {
  if (base_) ::madvise(const_cast<uint8_t*>(base_), size_, MADV_DONTNEED);  // advisory: failure is harmless
}

// ---- writing ---------------------------------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<PlannedTensor> plan,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), file_(path_) {
  // Validate the plan (a failure here destroys file_, which removes the temporary file).
  std::unordered_set<std::string> seen;
  std::vector<size_t> esize(plan.size());
  std::vector<uint64_t> nbytes(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedTensor& p = plan[i];
    auto bad = [&](std::string msg) { return file_error(path_, p.name, std::move(msg)); };
    if (p.name.empty()) throw file_error(path_, "", "cannot write a tensor with an empty name");
    if (p.name == "__metadata__") throw bad("the name is reserved by the format");
    if (!seen.insert(p.name).second) throw bad("planned twice");
    esize[i] = safetensors_dtype_size(p.dtype);
    if (esize[i] == 0) throw bad(fmt::format("unknown dtype '{}'", p.dtype));
    for (int64_t d : p.shape)
      if (d < 0) throw bad(fmt::format("negative dimension in shape {}", shape_string(p.shape)));
    auto numel = checked_numel(p.shape, esize[i]);
    if (!numel) throw bad(fmt::format("shape {} is too large", shape_string(p.shape)));
    nbytes[i] = uint64_t(*numel) * esize[i];
    order_.push_back(p.name);
  }

  // Largest elements first (stable otherwise): with the data section starting 8-byte aligned,
  // every tensor then starts at a multiple of its own element size.
  std::vector<size_t> layout(plan.size());
  std::iota(layout.begin(), layout.end(), size_t(0));
  std::stable_sort(layout.begin(), layout.end(), [&](size_t a, size_t b) { return esize[a] > esize[b]; });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<uint64_t> rel_offset(plan.size());
  for (size_t i : layout) {
    rel_offset[i] = offset;
    header[plan[i].name] = {{"dtype", plan[i].dtype},
                            {"shape", plan[i].shape},
                            {"data_offsets", {offset, offset + nbytes[i]}}};
    offset += nbytes[i];
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data section starts 8-byte aligned
  const uint64_t header_len = text.size();
  file_.write(&header_len, 8);
  file_.write(text.data(), text.size());
  const uint64_t data_offset = 8 + header_len;
  for (size_t i = 0; i < plan.size(); ++i)
    slots_.emplace(plan[i].name, Slot{data_offset + rel_offset[i], nbytes[i]});
  file_size_ = data_offset + offset;
}

void SafetensorsWriter::write(const std::string& name, const void* bytes, size_t n) {
  auto it = slots_.find(name);
  if (it == slots_.end()) throw file_error(path_, name, "tensor was not planned for this file");
  Slot& s = it->second;
  if (n > s.nbytes - s.written)
    throw file_error(path_, name, fmt::format("writing {} more bytes would exceed its {} bytes ({} already written)",
                                              n, s.nbytes, s.written));
  if (n == 0) return;
  file_.pwrite(bytes, n, s.offset + s.written);
  s.written += n;
}

void SafetensorsWriter::seal() {
  for (const std::string& name : order_) {
    const Slot& s = slots_.at(name);
    if (s.written != s.nbytes)
      throw file_error(path_, name, fmt::format("only {} of its {} bytes were written before finish()", s.written,
                                                s.nbytes));
  }
  file_.seal();
}

void SafetensorsWriter::finish() {
  if (file_.fd() >= 0) seal();
  file_.commit();
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<PlannedTensor> plan;
  plan.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    if (t.device != Device::CPU)
      throw file_error(path, name, fmt::format("cannot write {}: only CPU tensors can be saved", t.describe()));
    if (!t.is_contiguous())
      throw file_error(path, name, fmt::format("cannot write non-contiguous {}", t.describe()));
    if (t.numel() > 0 && !t.defined()) throw file_error(path, name, "tensor has no data");
    plan.emplace_back(name, t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim));
  }
  SafetensorsWriter w(path, std::move(plan), metadata);
  for (const auto& [name, t] : tensors) w.write(name, t.data, t.nbytes());
  w.finish();
}

}  // namespace shardlm::io
