// The f32 absmax of a non-standard nested map is code * nested + offset in two roundings: no FMA.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "model/nf4_loader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_parse.h"
#include "ops/ops.h"

namespace shardlm::model {

namespace {

constexpr const char* kStateSuffix = ".quant_state.bitsandbytes__nf4";
constexpr const char* kAuxSuffixes[] = {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", kStateSuffix};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// An Error about weight `name` of the directory (the entry at fault in the message).
Error weight_error(const io::ModelWeights& w, const std::string& name, const std::string& message) {
  Error e(message);
  e.set_file(w.dir());
  e.set_tensor(name);
  return e;
}

std::vector<float> f32_values(const io::ModelWeights& w, const std::string& entry) {
  const io::TensorInfo& info = w.info(entry);
  std::vector<float> v(size_t(info.numel()));
  w.read_range(entry, 0, v.size(), v.data());
  return v;
}

}  // namespace

ops::Nf4Layout Nf4State::layout() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return ops::Nf4Layout::of(n, nested && standard_nested_map);
}

Nf4ModelReader::Nf4ModelReader(std::string dir)
    : owned_(std::make_unique<io::ModelWeights>(dir)), weights_(owned_.get()), config_(load_model_config(dir)) {
  find_quantized();
}

Nf4ModelReader::Nf4ModelReader(const io::ModelWeights& weights, ModelConfig config)
    : weights_(&weights), config_(std::move(config)) {
  find_quantized();
}

void Nf4ModelReader::find_quantized() {
  for (const std::string& name : weights_->names())
    if (ends_with(name, kStateSuffix)) quantized_.push_back(name.substr(0, name.size() - std::strlen(kStateSuffix)));
  std::sort(quantized_.begin(), quantized_.end());
  for (const std::string& q : quantized_)
    if (!weights_->has(q)) throw weight_error(*weights_, q, fmt::format("has {} but no packed weight", kStateSuffix));
}

bool Nf4ModelReader::is_quantized(const std::string& name) const {
  return std::binary_search(quantized_.begin(), quantized_.end(), name);
}

std::vector<std::string> Nf4ModelReader::names() const {
  std::vector<std::string> out;
  for (const std::string& name : weights_->names()) {
    bool aux = false;
    for (const char* suffix : kAuxSuffixes) {
      if (ends_with(name, suffix) && is_quantized(name.substr(0, name.size() - std::strlen(suffix)))) aux = true;
    }
    if (!aux) out.push_back(name);
  }
  return out;
}

Nf4State Nf4ModelReader::state(const std::string& name) const {
  if (!is_quantized(name))
    throw weight_error(*weights_, name, fmt::format("is not an NF4 weight (no '{}{}' entry)", name, kStateSuffix));
  auto fail = [&](const std::string& what) { return weight_error(*weights_, name, what); };

  const std::string key = name + kStateSuffix;
  const std::span<const uint8_t> blob = weights_->file_holding(key).bytes(key);
  nlohmann::json j;
  try {
    j = io::parse_json(std::string(reinterpret_cast<const char*>(blob.data()), blob.size()));
  } catch (const nlohmann::json::exception& e) {
    throw fail(fmt::format("'{}' is not JSON: {}", key, e.what()));
  }
  if (!j.is_object()) throw fail(fmt::format("'{}' is not a JSON object", key));
  auto field = [&](const char* k) -> const nlohmann::json& {
    auto it = j.find(k);
    if (it == j.end()) throw fail(fmt::format("quant_state has no '{}'", k));
    return *it;
  };
  Nf4State s;
  const nlohmann::json& qt = field("quant_type");
  if (!qt.is_string() || qt.get<std::string>() != "nf4")
    throw fail(fmt::format("quant_type {} is not supported (only \"nf4\")", qt.dump()));
  const nlohmann::json& bs = field("blocksize");
  if (!bs.is_number_integer() || bs.get<int64_t>() != ops::kNf4BlockSize)
    throw fail(fmt::format("blocksize {} is not supported (only {})", bs.dump(), ops::kNf4BlockSize));
  const nlohmann::json& dt = field("dtype");
  if (!dt.is_string()) throw fail(fmt::format("dtype {} is not a string", dt.dump()));
  const std::string dts = dt.get<std::string>();
  if (dts == "float32") s.dtype = DType::F32;
  else if (dts == "bfloat16") s.dtype = DType::BF16;
  else if (dts == "float16") s.dtype = DType::F16;
  else throw fail(fmt::format("dtype '{}' is not supported (float32, bfloat16, float16)", dts));
  const nlohmann::json& shape = field("shape");
  if (!shape.is_array() || shape.empty()) throw fail(fmt::format("shape {} is not a list of sizes", shape.dump()));
  int64_t n = 1;
  for (const nlohmann::json& d : shape) {
    if (!d.is_number_integer() || d.get<int64_t>() <= 0) throw fail(fmt::format("shape {} is not a list of sizes", shape.dump()));
    s.shape.push_back(d.get<int64_t>());
    n *= d.get<int64_t>();
  }
  const int64_t blocks = ceil_div(n, ops::kNf4BlockSize);
  s.nested = weights_->has(name + ".nested_absmax");

  // The packed codes: ceil(n/2) bytes (bnb_4bit_quant_storage may pad to its element size).
  const io::TensorInfo& packed = weights_->info(name);
  if (packed.nbytes() < uint64_t((n + 1) / 2))
    throw fail(fmt::format("packed weight {}{} holds {} bytes, but shape {} needs {}", packed.dtype_name,
                           packed.shape_str(), packed.nbytes(), shape.dump(), (n + 1) / 2));

  auto expect = [&](const std::string& entry, const char* dtype, int64_t count) {
    if (!weights_->has(entry)) throw fail(fmt::format("'{}' is missing", entry));
    const io::TensorInfo& info = weights_->info(entry);
    if (info.dtype_name != dtype || info.numel() != count)
      throw fail(fmt::format("'{}' is {}{}, expected {} with {} elements", entry, info.dtype_name, info.shape_str(),
                             dtype, count));
  };
  expect(name + ".quant_map", "F32", 16);
  const std::vector<float> map4 = f32_values(*weights_, name + ".quant_map");
  for (int i = 0; i < 16; ++i)
    if (std::memcmp(&map4[size_t(i)], &ops::kNf4Code[size_t(i)], 4) != 0)
      throw fail(fmt::format("quant_map[{}] = {} differs from NF4's {}", i, map4[size_t(i)], ops::kNf4Code[size_t(i)]));

  if (!s.nested) {
    expect(name + ".absmax", "F32", blocks);
    return s;
  }
  expect(name + ".absmax", "U8", blocks);
  expect(name + ".nested_absmax", "F32", ceil_div(blocks, ops::kNf4NestedBlockSize));
  expect(name + ".nested_quant_map", "F32", 256);
  const nlohmann::json& nbs = field("nested_blocksize");
  if (!nbs.is_number_integer() || nbs.get<int64_t>() != ops::kNf4NestedBlockSize)
    throw fail(fmt::format("nested_blocksize {} is not supported (only {})", nbs.dump(), ops::kNf4NestedBlockSize));
  if (auto it = j.find("nested_dtype"); it != j.end() && !(it->is_string() && it->get<std::string>() == "float32"))
    throw fail(fmt::format("nested_dtype {} is not supported (only \"float32\")", it->dump()));
  const nlohmann::json& off = field("nested_offset");
  if (!off.is_number()) throw fail(fmt::format("nested_offset {} is not a number", off.dump()));
  s.offset = float(off.get<double>());  // an f32 value printed as a double: exact
  const std::vector<float> map8 = f32_values(*weights_, name + ".nested_quant_map");
  s.standard_nested_map = std::memcmp(map8.data(), ops::kDynamicMapSigned.data(), 256 * 4) == 0;
  return s;
}

std::optional<bool> Nf4ModelReader::double_quant_as_stored() const {
  if (quantized_.empty()) return std::nullopt;
  for (const std::string& name : quantized_)
    if (!state(name).layout().nested) return false;
  return true;
}

void Nf4ModelReader::read_blocks(const std::string& name, int64_t b0, int64_t b1, void* flat) const {
  const ops::Nf4Layout l = state(name).layout();
  const ops::Nf4Layout::Range r = l.range(b0, b1);
  auto* out = static_cast<uint8_t*>(flat);
  auto view = [&](size_t begin, size_t end, DType dtype) {
    return Tensor::view(out + begin, dtype, {int64_t((end - begin) / dtype_size(dtype))});
  };
  ops::Nf4Tensor q;
  q.nested = l.nested;
  q.packed = view(r.packed_begin, r.packed_end, DType::U8);
  q.absmax = view(r.absmax_begin, r.absmax_end, l.nested ? DType::U8 : DType::F32);
  if (l.nested) {
    q.nested_absmax = view(r.nested_absmax_begin, r.nested_absmax_end, DType::F32);
    q.offset = view(l.offset_offset, l.offset_offset + 4, DType::F32);
  }
  read_chunk(name, b0, b1, q);
}

void Nf4ModelReader::read_chunk(const std::string& name, int64_t b0, int64_t b1, const ops::Nf4Tensor& out) const {
  const Nf4State s = state(name);
  int64_t n = 1;
  for (int64_t d : s.shape) n *= d;
  const int64_t blocks = ceil_div(n, ops::kNf4BlockSize);
  SHARDLM_CHECK(0 <= b0 && b0 < b1 && b1 <= blocks, "{}: blocks [{}, {}) outside [0, {})", name, b0, b1, blocks);
  const int64_t e0 = b0 * ops::kNf4BlockSize, e1 = std::min(n, b1 * ops::kNf4BlockSize);
  const int64_t g0 = b0 / ops::kNf4NestedBlockSize, g1 = ceil_div(b1, ops::kNf4NestedBlockSize);
  auto check = [&](const Tensor& t, DType dtype, int64_t count, const char* what) {
    SHARDLM_CHECK(t.device == Device::CPU && t.dtype == dtype && t.numel() == count,
                  "{}: read_chunk of blocks [{}, {}) needs {} {} [{}] on the CPU, got {}", name, b0, b1, what,
                  dtype_name(dtype), count, t.describe());
  };
  if (out.nested) {
    if (!s.layout().nested)
      throw weight_error(*weights_, name,
                         s.nested ? "has a nested_quant_map other than bitsandbytes' standard one, so it cannot be "
                                    "kept double-quantized as stored"
                                  : "is not double-quantized in the file, so it cannot be read into a "
                                    "double-quantized state without re-quantizing");
    SHARDLM_CHECK(b0 % ops::kNf4NestedBlockSize == 0 && (b1 % ops::kNf4NestedBlockSize == 0 || b1 == blocks),
                  "{}: blocks [{}, {}) of a double-quantized weight must be whole groups of {}", name, b0, b1,
                  ops::kNf4NestedBlockSize);
    check(out.nested_absmax, DType::F32, g1 - g0, "nested_absmax");
    check(out.offset, DType::F32, 1, "offset");
  }
  check(out.packed, DType::U8, (e1 - e0 + 1) / 2, "packed");
  check(out.absmax, out.nested ? DType::U8 : DType::F32, b1 - b0, "absmax");

  // The packed codes: e0 is even (a block boundary), so they are bytes [e0 / 2, ceil(e1 / 2)) of
  // the stored weight, whatever its storage dtype.
  const std::span<const uint8_t> packed = weights_->file_holding(name).bytes(name);
  std::memcpy(out.packed.data, packed.data() + e0 / 2, size_t(out.packed.numel()));
  if (!s.nested || out.nested) {  // the absmax values (or their codes and groups) as stored
    weights_->read_range(name + ".absmax", uint64_t(b0), uint64_t(b1 - b0), out.absmax.data);
    if (out.nested) {
      weights_->read_range(name + ".nested_absmax", uint64_t(g0), uint64_t(g1 - g0), out.nested_absmax.data);
      *out.offset.f32() = s.offset;
    }
    return;
  }
  // A double-quantized state read plain: the f32 absmax from the stored map, as bitsandbytes
  // computes it (code[q] * nested_absmax, then + offset, two f32 roundings).
  const std::vector<float> map8 = f32_values(*weights_, name + ".nested_quant_map");
  std::vector<float> nested(size_t(g1 - g0));
  weights_->read_range(name + ".nested_absmax", uint64_t(g0), nested.size(), nested.data());
  std::vector<uint8_t> q(size_t(b1 - b0));
  weights_->read_range(name + ".absmax", uint64_t(b0), q.size(), q.data());
  float* absmax = out.absmax.f32();
  for (int64_t b = b0; b < b1; ++b) {
    const float scaled = map8[q[size_t(b - b0)]] * nested[size_t(b / ops::kNf4NestedBlockSize - g0)];
    absmax[b - b0] = scaled + s.offset;
  }
}

void Nf4ModelReader::dequantize_range(const std::string& name, int64_t begin, int64_t end, float* out) const {
  int64_t n = 1;
  for (int64_t d : state(name).shape) n *= d;
  SHARDLM_CHECK(0 <= begin && begin <= end && end <= n, "{}: elements [{}, {}) outside [0, {})", name, begin, end, n);
  if (begin == end) return;  // nothing to read (and `out` may be null)
  // In pieces of whole blocks, read plain (f32 absmax) into a bounded staging buffer.
  constexpr int64_t kPieceBlocks = 16384;
  const int64_t first = begin / ops::kNf4BlockSize, last = ceil_div(end, ops::kNf4BlockSize);
  for (int64_t b0 = first; b0 < last; b0 += kPieceBlocks) {
    const int64_t b1 = std::min(last, b0 + kPieceBlocks);
    const int64_t e0 = b0 * ops::kNf4BlockSize, e1 = std::min(n, b1 * ops::kNf4BlockSize), m = e1 - e0;
    const ops::Nf4Layout l = ops::Nf4Layout::of(m, false);
    Buffer staging(l.total_bytes + size_t(m) * 4, MemCategory::Workspace, false);
    const ops::Nf4Tensor q = ops::nf4_view(staging.data(), l, {m}, DType::F32);
    read_chunk(name, b0, b1, q);
    const Tensor values = Tensor::view(static_cast<char*>(staging.data()) + l.total_bytes, DType::F32, {m});
    ops::nf4_dequantize(values, q.packed, q.absmax);
    const int64_t lo = std::max(begin, e0), hi = std::min(end, e1);
    std::memcpy(out + (lo - begin), values.f32() + (lo - e0), size_t(hi - lo) * 4);
  }
}

Nf4Weight Nf4ModelReader::read(const std::string& name) const {
  Nf4Weight w;
  w.name = name;
  w.state = state(name);
  w.layout = w.state.layout();
  w.buffer = Buffer(w.layout.total_bytes, MemCategory::Parameters, true);
  read_blocks(name, 0, w.layout.blocks, w.buffer.data());
  w.q = ops::nf4_view(w.buffer.data(), w.layout, w.state.shape, w.state.dtype);
  return w;
}

OwnedTensor Nf4ModelReader::dequantize_f32(const std::string& name) const {
  if (is_quantized(name)) {
    const std::vector<int64_t> shape = state(name).shape;
    OwnedTensor out(DType::F32, shape.data(), int(shape.size()), MemCategory::Parameters, false);
    dequantize_range(name, 0, out.t.numel(), out.t.f32());
    return out;
  }
  const io::TensorInfo& info = weights_->info(name);
  if (!info.dtype || !is_float(*info.dtype))
    throw weight_error(*weights_, name, fmt::format("is {}, not a float tensor", info.dtype_name));
  if (info.shape.size() > size_t(kMaxDims))
    throw weight_error(*weights_, name, fmt::format("has rank {} (at most {})", info.shape.size(), kMaxDims));
  std::vector<int64_t> shape = info.shape;
  if (shape.empty()) shape = {1};
  OwnedTensor out(DType::F32, shape.data(), int(shape.size()), MemCategory::Parameters, false);
  std::vector<uint8_t> raw(info.nbytes());
  weights_->read_range(name, 0, uint64_t(info.numel()), raw.data());
  ops::cast(out.t, Tensor::view(raw.data(), *info.dtype, shape.data(), int(shape.size())));
  return out;
}

std::map<std::string, OwnedTensor> load_dequantized_f32(const std::string& dir) {
  const Nf4ModelReader reader(dir);
  std::map<std::string, OwnedTensor> out;
  for (const std::string& name : reader.names()) out.emplace(name, reader.dequantize_f32(name));
  return out;
}

void nf4_round_in_place(const Tensor& w, bool double_quant) {
  SHARDLM_CHECK(w.dtype == DType::F32 && w.device == Device::CPU && w.is_contiguous(),
                "NF4 rounding takes a contiguous f32 CPU tensor, not {}", w.describe());
  const ops::Nf4Layout layout = ops::Nf4Layout::of(w.numel(), double_quant);
  const Buffer buf(layout.total_bytes, MemCategory::Workspace, false);
  const ops::Nf4Tensor q =
      ops::nf4_view(buf.data(), layout, std::vector<int64_t>(w.shape.begin(), w.shape.begin() + w.ndim), DType::F32);
  const Tensor flat = w.reshape({w.numel()});
  ops::nf4_quantize(q, flat);
  ops::nf4_dequantize(flat, q);
}

}  // namespace shardlm::model
