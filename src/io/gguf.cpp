#include "io/gguf.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/float_bits.h"

namespace shardlm::io {

namespace {

static_assert(std::endian::native == std::endian::little, "GGUF files are written little-endian as in memory");

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

uint64_t align_up(uint64_t n) { return (n + kGgufAlignment - 1) / kGgufAlignment * kGgufAlignment; }

}  // namespace

const char* ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return "F32";
    case GgmlType::F16: return "F16";
    case GgmlType::Q8_0: return "Q8_0";
    case GgmlType::BF16: return "BF16";
  }
  return "?";
}

uint64_t ggml_nbytes(GgmlType t, int64_t n) {
  switch (t) {
    case GgmlType::F32: return uint64_t(n) * 4;
    case GgmlType::F16:
    case GgmlType::BF16: return uint64_t(n) * 2;
    case GgmlType::Q8_0: return uint64_t(q8_0_bytes(n));
  }
  return 0;
}

// ---- metadata ---------------------------------------------------------------------------------
void GgufMetadata::key(const std::string& k, GgufValueType type) {
  if (!keys_.insert(k).second) throw Error(fmt::format("GGUF key '{}' given twice", k));
  put_string(bytes_, k);
  put<uint32_t>(bytes_, uint32_t(type));
  ++count_;
}

void GgufMetadata::add_u32(const std::string& k, uint32_t v) {
  key(k, GgufValueType::U32);
  put(bytes_, v);
}
void GgufMetadata::add_i32(const std::string& k, int32_t v) {
  key(k, GgufValueType::I32);
  put(bytes_, v);
}
void GgufMetadata::add_f32(const std::string& k, float v) {
  key(k, GgufValueType::F32);
  put(bytes_, v);
}
void GgufMetadata::add_bool(const std::string& k, bool v) {
  key(k, GgufValueType::Bool);
  put<uint8_t>(bytes_, v ? 1 : 0);
}
void GgufMetadata::add_string(const std::string& k, const std::string& v) {
  key(k, GgufValueType::String);
  put_string(bytes_, v);
}
void GgufMetadata::add_strings(const std::string& k, const std::vector<std::string>& v) {
  key(k, GgufValueType::Array);
  put<uint32_t>(bytes_, uint32_t(GgufValueType::String));
  put<uint64_t>(bytes_, v.size());
  for (const std::string& s : v) put_string(bytes_, s);
}
void GgufMetadata::add_f32s(const std::string& k, const std::vector<float>& v) {
  key(k, GgufValueType::Array);
  put<uint32_t>(bytes_, uint32_t(GgufValueType::F32));
  put<uint64_t>(bytes_, v.size());
  bytes_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}
void GgufMetadata::add_i32s(const std::string& k, const std::vector<int32_t>& v) {
  key(k, GgufValueType::Array);
  put<uint32_t>(bytes_, uint32_t(GgufValueType::I32));
  put<uint64_t>(bytes_, v.size());
  bytes_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- the writer ---------------------------------------------------------------------------------
GgufWriter::GgufWriter(std::string path, GgufMetadata metadata, std::vector<GgufTensor> plan)
    : path_(std::move(path)), file_(path_), plan_(std::move(plan)) {
  metadata.add_u32("general.alignment", kGgufAlignment);
  std::string head;
  head.append("GGUF", 4);
  put<uint32_t>(head, kGgufVersion);
  put<uint64_t>(head, plan_.size());
  put<uint64_t>(head, metadata.count());
  head += metadata.bytes();
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const GgufTensor& t : plan_) {
    if (t.name.empty() || t.name.size() > 64)
      throw Error(fmt::format("GGUF tensor name '{}' must be 1 to 64 bytes", t.name), {.file = path_});
    if (!names.insert(t.name).second) throw Error(fmt::format("GGUF tensor '{}' planned twice", t.name), {.file = path_});
    if (t.shape.empty() || t.shape.size() > 4)
      throw Error(fmt::format("GGUF tensor '{}' has {} dimensions (1 to 4)", t.name, t.shape.size()), {.file = path_});
    if (t.type == GgmlType::Q8_0 && t.shape.back() % kQ8_0Block != 0)
      throw Error(fmt::format("GGUF tensor '{}': Q8_0 rows of {} elements are not a multiple of {}", t.name,
                              t.shape.back(), kQ8_0Block),
                  {.file = path_});
    put_string(head, t.name);
    put<uint32_t>(head, uint32_t(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) put<uint64_t>(head, uint64_t(*d));
    put<uint32_t>(head, uint32_t(t.type));
    put<uint64_t>(head, offset);
    offset = align_up(offset + t.nbytes());
  }
  data_offset_ = align_up(head.size());
  file_size_ = data_offset_ + offset;
  file_.write(head.data(), head.size());
  position_ = head.size();
  pad_to_alignment();
}

void GgufWriter::pad_to_alignment() {
  static const char zeros[kGgufAlignment] = {};
  const uint64_t pad = align_up(position_) - position_;
  file_.write(zeros, pad);
  position_ += pad;
}

void GgufWriter::write(const std::string& name, const void* bytes, size_t n) {
  if (current_ >= plan_.size() || plan_[current_].name != name)
    throw Error(fmt::format("GGUF tensor '{}' written out of order (expected '{}')", name,
                            current_ < plan_.size() ? plan_[current_].name : "none: all are written"),
                {.file = path_});
  const uint64_t total = plan_[current_].nbytes();
  if (n > total - written_)
    throw Error(fmt::format("GGUF tensor '{}': {} bytes given but {} left of its {}", name, n, total - written_, total),
                {.file = path_});
  file_.write(bytes, n);
  position_ += n;
  written_ += n;
  if (written_ == total) {
    pad_to_alignment();
    ++current_;
    written_ = 0;
  }
}

void GgufWriter::finish() {
  // A tensor of 0 bytes has nothing to write; step over any such at the end.
  while (current_ < plan_.size() && plan_[current_].nbytes() == 0) ++current_;
  if (current_ != plan_.size())
    throw Error(fmt::format("GGUF tensor '{}' was not written completely", plan_[current_].name), {.file = path_});
  SHARDLM_CHECK(position_ == file_size_, "GGUF writer at byte {} of a planned {}", position_, file_size_);
  file_.commit();
}

}  // namespace shardlm::io
