// Unit tests of src/io: atomic file replacement, the safetensors reader and writers, model
// directories (single file and shards + index), size parsing, and interop with an independent
// Python implementation (tests/torch_ref/safetensors_check.py).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "testing.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "io/atomic_file.h"
#include "io/model_files.h"
#include "io/safetensors.h"

using namespace shardlm;
using shardlm::testing::error_of;
using namespace shardlm::io;
using shardlm::testing::TempDir;
namespace fs = std::filesystem;

namespace {



// Passes when `msg` is one line containing every one of `parts`.
::testing::AssertionResult one_line_naming(const std::string& msg, std::initializer_list<std::string> parts) {
  if (msg.find('\n') != std::string::npos) return ::testing::AssertionFailure() << "multi-line: " << msg;
  for (const std::string& p : parts)
    if (msg.find(p) == std::string::npos) return ::testing::AssertionFailure() << "'" << p << "' not in: " << msg;
  return ::testing::AssertionSuccess();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A hand-made safetensors file: length prefix, `header` verbatim, then `data`.
std::string raw_file(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

// Tensors with their own storage, for writing.
struct TensorSet {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<std::pair<std::string, Tensor>> tensors;

  template <class T>
  void add(const std::string& name, DType dtype, std::initializer_list<int64_t> shape, const std::vector<T>& values) {
    std::vector<uint8_t>& buf = storage.emplace_back(values.size() * sizeof(T) + 1);  // +1: never null
    if (!values.empty()) std::memcpy(buf.data(), values.data(), values.size() * sizeof(T));  // data() may be null
    Tensor t = Tensor::view(buf.data(), dtype, shape);
    EXPECT_EQ(size_t(t.numel()), values.size()) << name;
    tensors.emplace_back(name, t);
  }
  void add_f32(const std::string& name, std::initializer_list<int64_t> shape, const std::vector<float>& v) {
    add(name, DType::F32, shape, v);
  }
};

std::vector<bf16_t> to_bf16(const std::vector<float>& v) {
  std::vector<bf16_t> out;
  for (float f : v) out.push_back(f32_to_bf16(f));
  return out;
}
std::vector<f16_t> to_f16(const std::vector<float>& v) {
  std::vector<f16_t> out;
  for (float f : v) out.push_back(f32_to_f16(f));
  return out;
}
std::vector<float> iota_f32(int64_t n, float scale = 1.0f, float shift = 0.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(i) * scale + shift;
  return v;
}

// Byte-exact comparison of what `file` holds under `name` with what `t` points at.
::testing::AssertionResult same_bytes(const SafetensorsFile& file, const std::string& name, const Tensor& want) {
  const TensorInfo& ti = file.info(name);
  if (!ti.dtype || *ti.dtype != want.dtype) return ::testing::AssertionFailure() << name << ": dtype " << ti.dtype_name;
  std::vector<int64_t> shape(want.shape.begin(), want.shape.begin() + want.ndim);
  if (ti.shape != shape) return ::testing::AssertionFailure() << name << ": shape " << ti.shape_str();
  const Tensor got = file.tensor(name);
  if (!same_shape(got, want) || got.dtype != want.dtype) return ::testing::AssertionFailure() << name << ": view";
  if (got.nbytes() && std::memcmp(got.data, want.data, got.nbytes()) != 0)
    return ::testing::AssertionFailure() << name << ": bytes differ";
  return ::testing::AssertionSuccess();
}

// The tensors both this test and safetensors_check.py build (see shared_reference() there).
TensorSet shared_reference() {
  TensorSet s;
  s.add_f32("a.f32", {2, 3}, iota_f32(6, 0.5f, -1.0f));
  s.add("b.bf16", DType::BF16, {5}, to_bf16({1.0f, -2.5f, 0.15625f, std::ldexp(1.0f, 127), -0.0f}));
  s.add("c.f16", DType::F16, {2, 2}, to_f16({0.5f, -1.25f, 65504.0f, std::ldexp(1.0f, -14)}));
  s.add("d.i32", DType::I32, {5},
        std::vector<int32_t>{-3, 0, 7, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()});
  s.add_f32("e.scalar", {}, {42.0f});
  s.add_f32("f.empty", {0, 3}, {});
  s.add_f32("g.rank4", {2, 1, 2, 3}, iota_f32(12));
  return s;
}
const std::map<std::string, std::string> kSharedMetadata = {{"format", "pt"}, {"producer", "shardlm-test"}};

uint64_t header_length(const std::string& path) {
  const std::string b = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  return n;
}

}  // namespace

// ---- atomic files ------------------------------------------------------------------------------

TEST(AtomicFile, WritesAndReplaces) {
  TempDir d;
  write_text_atomic(d / "a.txt", "first");
  EXPECT_EQ(read_bytes(d / "a.txt"), "first");
  write_file_atomic(d / "a.txt", [&](int fd) { write_all(fd, "second", 6, d / "a.txt"); });
  EXPECT_EQ(read_bytes(d / "a.txt"), "second");
  EXPECT_EQ(d.list(), std::vector<std::string>{"a.txt"});
}

TEST(AtomicFile, FailingWriterKeepsOldFileAndLeavesNoTemp) {
  TempDir d;
  write_text_atomic(d / "a.txt", "old");
  EXPECT_THROW(write_file_atomic(d / "a.txt",
                                 [&](int fd) {
                                   write_all(fd, "partial", 7, d / "a.txt");
                                   throw std::runtime_error("writer failed");
                                 }),
               std::runtime_error);
  EXPECT_EQ(read_bytes(d / "a.txt"), "old");
  EXPECT_EQ(d.list(), std::vector<std::string>{"a.txt"});
  {
    AtomicFile f(d / "b.txt");
    f.write("x", 1);
    EXPECT_TRUE(fs::exists(f.temp_path()));
  }  // destroyed without commit
  EXPECT_EQ(d.list(), std::vector<std::string>{"a.txt"});
}

TEST(AtomicFile, UnwritableDirectoryNamesPathAndErrno) {
  TempDir d;
  const std::string path = d / "no_such_dir/a.txt";
  const std::string msg = error_of([&] { write_text_atomic(path, "x"); });
  EXPECT_TRUE(one_line_naming(msg, {path, std::strerror(ENOENT)}));
  write_text_atomic(d / "file", "x");  // a regular file used as a directory
  EXPECT_TRUE(one_line_naming(error_of([&] { write_text_atomic(d / "file/a.txt", "x"); }), {d / "file/a.txt"}));
}

// ---- safetensors round trips -------------------------------------------------------------------

TEST(Safetensors, RoundTripsEveryDtypeAndRank) {
  TempDir d;
  TensorSet s = shared_reference();
  // An odd-sized bf16 tensor ahead of f32 ones: the writer must still keep the f32 data aligned.
  s.add("h.odd_bf16", DType::BF16, {3}, to_bf16({1.0f, 2.0f, 3.0f}));
  s.add_f32("i.after_odd", {1, 3}, {7.0f, 8.0f, 9.0f});
  const std::string path = d / "t.safetensors";
  write_safetensors(path, s.tensors, kSharedMetadata);

  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata(), kSharedMetadata);
  EXPECT_EQ(f.names().size(), s.tensors.size());
  EXPECT_EQ(f.file_size(), fs::file_size(path));
  EXPECT_EQ(f.data_offset() % 8, 0u);
  for (const auto& [name, t] : s.tensors) {
    ASSERT_TRUE(f.has(name)) << name;
    EXPECT_TRUE(same_bytes(f, name, t));
    EXPECT_EQ(f.info(name).begin % f.info(name).element_size(), 0u) << name;
  }
  const Tensor scalar = f.tensor("e.scalar");
  EXPECT_EQ(scalar.ndim, 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.f32()[0], 42.0f);
  const Tensor empty = f.tensor("f.empty");
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.shape_str(), "[0, 3]");
  EXPECT_EQ(f.tensor("g.rank4").shape_str(), "[2, 1, 2, 3]");

  // Moving keeps the mapping, so views taken before the move stay valid.
  const Tensor a = f.tensor("a.f32");
  SafetensorsFile moved = std::move(f);
  EXPECT_EQ(a.f32()[5], 1.5f);
  EXPECT_EQ(moved.tensor("a.f32").data, a.data);
}

TEST(Safetensors, HeaderIsPaddedToEightBytes) {
  TempDir d;
  for (int len = 1; len <= 9; ++len) {
    TensorSet s;
    s.add_f32(std::string(size_t(len), 'w'), {1}, {1.0f});
    const std::string path = d / fmt::format("p{}.safetensors", len);
    write_safetensors(path, s.tensors);
    const uint64_t n = header_length(path);
    EXPECT_EQ(n % 8, 0u) << "name length " << len;
    const std::string header = read_bytes(path).substr(8, n);
    EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}')) << header;  // only spaces after the JSON
    EXPECT_EQ(SafetensorsFile(path).tensor(std::string(size_t(len), 'w')).f32()[0], 1.0f);
  }
}

TEST(Safetensors, EmptyFileHasNoTensors) {
  TempDir d;
  write_safetensors(d / "e.safetensors", {});
  SafetensorsFile f(d / "e.safetensors");
  EXPECT_TRUE(f.names().empty());
  EXPECT_TRUE(f.metadata().empty());
}

TEST(Safetensors, ReadRangeCopiesSlices) {
  TempDir d;
  TensorSet s;
  s.add_f32("w", {4, 5}, iota_f32(20));
  s.add("h", DType::BF16, {7}, to_bf16(iota_f32(7, 2.0f)));
  write_safetensors(d / "r.safetensors", s.tensors);
  SafetensorsFile f(d / "r.safetensors");

  std::vector<float> got(6, -1.0f);
  f.read_range("w", 7, 6, got.data());
  EXPECT_EQ(got, iota_f32(6, 1.0f, 7.0f));
  f.read_range("w", 20, 0, got.data());  // empty range at the end is fine
  std::vector<bf16_t> h(3);
  f.read_range("h", 4, 3, h.data());
  EXPECT_EQ(bf16_to_f32(h[0]), 8.0f);
  EXPECT_EQ(bf16_to_f32(h[2]), 12.0f);

  const std::string path = d / "r.safetensors";
  EXPECT_TRUE(one_line_naming(error_of([&] { f.read_range("w", 15, 6, got.data()); }), {path, "tensor 'w'", "20"}));
  EXPECT_TRUE(one_line_naming(error_of([&] { f.read_range("w", 21, 0, got.data()); }), {path, "tensor 'w'"}));
  EXPECT_TRUE(one_line_naming(error_of([&] { f.read_range("nope", 0, 1, got.data()); }), {path, "tensor 'nope'"}));
  EXPECT_TRUE(one_line_naming(error_of([&] { (void)f.info("nope"); }), {path, "tensor 'nope'"}));
  EXPECT_TRUE(one_line_naming(error_of([&] { (void)f.tensor("nope"); }), {path, "tensor 'nope'"}));
}

TEST(Safetensors, ListsForeignDtypesAndHighRanksButRefusesViews) {
  TempDir d;
  const std::string path = d / "foreign.safetensors";
  const int64_t i64[3] = {1, -2, int64_t(1) << 40};
  const float f5[2] = {1.0f, 2.0f};
  std::string data(reinterpret_cast<const char*>(i64), 24);
  data += std::string(reinterpret_cast<const char*>(f5), 8);
  write_bytes(path, raw_file(R"({"ids":{"dtype":"I64","shape":[3],"data_offsets":[0,24]},)"
                             R"("r5":{"dtype":"F32","shape":[1,1,1,1,2],"data_offsets":[24,32]}})",
                             data));
  SafetensorsFile f(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"ids", "r5"}));
  EXPECT_EQ(f.info("ids").dtype_name, "I64");
  EXPECT_FALSE(f.info("ids").dtype.has_value());
  EXPECT_TRUE(one_line_naming(error_of([&] { (void)f.tensor("ids"); }), {path, "tensor 'ids'", "I64"}));
  EXPECT_TRUE(one_line_naming(error_of([&] { (void)f.tensor("r5"); }), {path, "tensor 'r5'", "rank 5"}));
  int64_t got[2];
  f.read_range("ids", 1, 2, got);
  EXPECT_EQ(got[0], -2);
  EXPECT_EQ(got[1], int64_t(1) << 40);
  EXPECT_EQ(f.bytes("r5").size(), 8u);
}

TEST(Safetensors, UnalignedDataIsRefusedByTensorButReadByReadRange) {
  TempDir d;
  const std::string path = d / "unaligned.safetensors";
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  while ((8 + header.size()) % 4 == 0) header += ' ';  // data starts off a 4-byte boundary
  const float w[2] = {3.0f, 4.0f};
  write_bytes(path, raw_file(header, std::string(reinterpret_cast<const char*>(w), 8)));
  SafetensorsFile f(path);
  EXPECT_TRUE(one_line_naming(error_of([&] { (void)f.tensor("w"); }), {path, "tensor 'w'", "aligned"}));
  float got[2];
  f.read_range("w", 0, 2, got);
  EXPECT_EQ(got[1], 4.0f);
}

TEST(Safetensors, StreamingWriterTakesChunksInAnyTensorOrder) {
  TempDir d;
  const std::string path = d / "s.safetensors";
  const std::vector<float> a = iota_f32(10);
  const std::vector<bf16_t> b = to_bf16(iota_f32(5, -1.0f));
  const std::vector<int32_t> c = {4, 5, 6};
  SafetensorsWriter w(path,
                      {{"b", DType::BF16, {5}}, {"a", DType::F32, {2, 5}}, {"z", "F32", {0}}, {"c", "I32", {3}}},
                      {{"format", "pt"}});
  w.write("a", a.data(), 12);
  w.write("c", c.data(), 12);
  w.write("a", a.data() + 3, 28);
  w.write("b", b.data(), 10);
  EXPECT_FALSE(fs::exists(path));  // nothing at the final path before finish()
  w.finish();
  EXPECT_EQ(fs::file_size(path), w.file_size());

  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(std::vector<float>(f.tensor("a").f32(), f.tensor("a").f32() + 10), a);
  EXPECT_EQ(bf16_to_f32(f.tensor("b").ptr<bf16_t>()[4]), -4.0f);
  EXPECT_EQ(f.tensor("c").i32()[2], 6);
  EXPECT_EQ(f.tensor("z").numel(), 0);
  EXPECT_EQ(d.list(), std::vector<std::string>{"s.safetensors"});
}

TEST(Safetensors, FailedStreamingWriteLeavesNoFileAndKeepsTheOldOne) {
  TempDir d;
  const std::string path = d / "m.safetensors";
  const std::vector<float> x = iota_f32(8);
  // A writer abandoned mid-way (an exception between chunks) leaves nothing behind.
  try {
    SafetensorsWriter w(path, {{"x", DType::F32, {8}}});
    w.write("x", x.data(), 16);
    throw std::runtime_error("converter died");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(d.list().empty());

  // With a previous file at the path, every failure keeps it intact.
  TensorSet old;
  old.add_f32("x", {2}, {1.0f, 2.0f});
  write_safetensors(path, old.tensors);
  const std::string before = read_bytes(path);
  {
    SafetensorsWriter w(path, {{"x", DType::F32, {8}}, {"y", DType::I32, {1}}});
    w.write("x", x.data(), 32);
    EXPECT_TRUE(one_line_naming(error_of([&] { w.write("q", x.data(), 4); }), {path, "tensor 'q'", "not planned"}));
    EXPECT_TRUE(one_line_naming(error_of([&] { w.write("x", x.data(), 4); }), {path, "tensor 'x'", "exceed"}));
    EXPECT_TRUE(one_line_naming(error_of([&] { w.finish(); }), {path, "tensor 'y'", "0 of its 4 bytes"}));
  }
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(d.list(), std::vector<std::string>{"m.safetensors"});

  // Bad plans and bad tensors are refused before anything replaces the file.
  EXPECT_TRUE(one_line_naming(error_of([&] { SafetensorsWriter w(path, {{"x", "F32", {1}}, {"x", "F32", {1}}}); }),
                              {path, "tensor 'x'", "twice"}));
  EXPECT_TRUE(one_line_naming(error_of([&] { SafetensorsWriter w(path, {{"x", "Q8", {1}}}); }),
                              {path, "tensor 'x'", "Q8"}));
  Tensor strided = old.tensors[0].second.reshape({2, 1});
  strided.stride[0] = 2;
  EXPECT_TRUE(one_line_naming(error_of([&] { write_safetensors(path, {{"s", strided}}); }),
                              {path, "tensor 's'", "non-contiguous"}));
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(d.list(), std::vector<std::string>{"m.safetensors"});
}

// ---- safetensors corruption: one test per way a file can be broken -----------------------------

namespace {
// Writes `bytes` as <test dir>/bad.safetensors and returns the message of opening it.
std::string open_error(const TempDir& d, const std::string& bytes) {
  const std::string path = d / "bad.safetensors";
  write_bytes(path, bytes);
  return error_of([&] { SafetensorsFile f(path); });
}
const std::string kFour(4, '\0'), kEight(8, '\0'), kTwelve(12, '\0');
}  // namespace

TEST(SafetensorsCorrupt, EmptyFile) {
  TempDir d;
  EXPECT_TRUE(one_line_naming(open_error(d, ""), {d / "bad.safetensors", "0 bytes", "too short"}));
}

TEST(SafetensorsCorrupt, FiveByteFile) {
  TempDir d;
  EXPECT_TRUE(one_line_naming(open_error(d, "abcde"), {d / "bad.safetensors", "5 bytes", "too short"}));
}

TEST(SafetensorsCorrupt, MissingFile) {
  TempDir d;
  EXPECT_TRUE(one_line_naming(error_of([&] { SafetensorsFile f(d / "none.safetensors"); }),
                              {d / "none.safetensors", "cannot open"}));
}

TEST(SafetensorsCorrupt, HeaderLengthBeyondFile) {
  TempDir d;
  uint64_t n = 1000;
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  EXPECT_TRUE(one_line_naming(open_error(d, bytes + "{}  "), {d / "bad.safetensors", "header length 1000"}));
  n = uint64_t(1) << 40;  // absurd, refused before anything is read
  bytes.assign(reinterpret_cast<const char*>(&n), 8);
  EXPECT_TRUE(one_line_naming(open_error(d, bytes + "{}  "), {d / "bad.safetensors", "absurd"}));
}

TEST(SafetensorsCorrupt, InvalidJson) {
  TempDir d;
  EXPECT_TRUE(one_line_naming(open_error(d, raw_file("{\"w\": [1,\n", "")), {d / "bad.safetensors", "not valid JSON"}));
  EXPECT_TRUE(one_line_naming(open_error(d, raw_file("[1, 2]  ", "")), {d / "bad.safetensors", "must be an object"}));
}

TEST(SafetensorsCorrupt, BadMetadata) {
  TempDir d;
  EXPECT_TRUE(one_line_naming(open_error(d, raw_file(R"({"__metadata__":{"format":1}})", "")),
                              {d / "bad.safetensors", "__metadata__", "format"}));
  EXPECT_TRUE(one_line_naming(open_error(d, raw_file(R"({"__metadata__":[]})", "")),
                              {d / "bad.safetensors", "__metadata__"}));
}

TEST(SafetensorsCorrupt, UnknownDtype) {
  TempDir d;
  EXPECT_TRUE(one_line_naming(
      open_error(d, raw_file(R"({"w.weight":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}})", kFour)),
      {d / "bad.safetensors", "tensor 'w.weight'", "unknown dtype 'F17'"}));
}

TEST(SafetensorsCorrupt, BadShapeOrOffsetsFields) {
  TempDir d;
  const std::string path = d / "bad.safetensors";
  EXPECT_TRUE(one_line_naming(
      open_error(d, raw_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", kFour)),
      {path, "tensor 'w'", "shape"}));
  EXPECT_TRUE(one_line_naming(open_error(d, raw_file(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", kFour)),
                              {path, "tensor 'w'", "shape"}));
  EXPECT_TRUE(one_line_naming(
      open_error(d, raw_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", kFour)),
      {path, "tensor 'w'", "data_offsets"}));
  EXPECT_TRUE(one_line_naming(
      open_error(d, raw_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", kFour)),
      {path, "tensor 'w'", "begin after end"}));
}

TEST(SafetensorsCorrupt, ShapeTimesDtypeDiffersFromByteRange) {
  TempDir d;
  EXPECT_TRUE(one_line_naming(
      open_error(d, raw_file(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", kTwelve)),
      {d / "bad.safetensors", "tensor 'w'", "[2, 2]", "needs 16"}));
}

TEST(SafetensorsCorrupt, OffsetsOutsideData) {
  TempDir d;
  EXPECT_TRUE(one_line_naming(
      open_error(d, raw_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", kEight)),
      {d / "bad.safetensors", "tensor 'w'", "[0, 16)", "8 bytes"}));
}

TEST(SafetensorsCorrupt, OverlappingTensors) {
  TempDir d;
  EXPECT_TRUE(one_line_naming(open_error(d, raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                                     kTwelve)),
                              {d / "bad.safetensors", "tensor 'b'", "overlap", "'a'"}));
}

TEST(SafetensorsCorrupt, GapBetweenTensors) {
  TempDir d;
  EXPECT_TRUE(one_line_naming(open_error(d, raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                                     kTwelve)),
                              {d / "bad.safetensors", "tensor 'b'", "gap", "[4, 8)"}));
}

TEST(SafetensorsCorrupt, TrailingBytes) {
  TempDir d;
  EXPECT_TRUE(one_line_naming(
      open_error(d, raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", kEight)),
      {d / "bad.safetensors", "4 bytes after the last tensor"}));
}

TEST(SafetensorsCorrupt, TruncatedFile) {
  TempDir d;
  const std::string path = d / "cut.safetensors";
  TensorSet s;
  s.add_f32("x", {4}, iota_f32(4));
  s.add_f32("y", {4}, iota_f32(4));
  write_safetensors(path, s.tensors);
  fs::resize_file(path, fs::file_size(path) - 3);
  EXPECT_TRUE(one_line_naming(error_of([&] { SafetensorsFile f(path); }), {path, "tensor 'y'", "truncated"}));
}

// ---- model directories -------------------------------------------------------------------------

namespace {
TensorSet small_model() {
  TensorSet s;
  s.add_f32("model.embed_tokens.weight", {4, 8}, iota_f32(32));  // 128 bytes
  s.add("model.layers.0.mlp.up_proj.weight", DType::BF16, {8, 4}, to_bf16(iota_f32(32, 0.25f)));  // 64 bytes
  s.add_f32("model.layers.0.input_layernorm.weight", {8}, iota_f32(8, 1.0f, 1.0f));  // 32 bytes
  s.add_f32("model.norm.weight", {8}, iota_f32(8, -1.0f));  // 32 bytes
  s.add_f32("lm_head.weight", {4, 8}, iota_f32(32, 2.0f));  // 128 bytes
  return s;
}
void expect_loads(const ModelWeights& w, const TensorSet& s) {
  EXPECT_EQ(w.names().size(), s.tensors.size());
  for (const auto& [name, t] : s.tensors) {
    ASSERT_TRUE(w.has(name)) << name;
    EXPECT_TRUE(same_bytes(w.file_holding(name), name, t));
    EXPECT_EQ(w.info(name).nbytes(), t.nbytes());
  }
}
}  // namespace

TEST(ModelWeights, SingleFileWhenEverythingFits) {
  TempDir d;
  const TensorSet s = small_model();
  write_model_weights(d.path().string(), s.tensors, parse_size("5GB"));
  EXPECT_EQ(d.list(), std::vector<std::string>{"model.safetensors"});
  ModelWeights w(d.path().string());
  EXPECT_FALSE(w.sharded());
  expect_loads(w, s);
  EXPECT_EQ(w.files()[0].metadata().at("format"), "pt");  // transformers refuses files without it
  EXPECT_EQ(w.file_of("lm_head.weight"), d / "model.safetensors");
  std::vector<float> row(8);
  w.read_range("lm_head.weight", 8, 8, row.data());
  EXPECT_EQ(row[0], 16.0f);
  EXPECT_TRUE(one_line_naming(error_of([&] { (void)w.tensor("nope"); }), {d.path().string(), "tensor 'nope'"}));
}

TEST(ModelWeights, ShardedWriteAndReadBack) {
  TempDir d;
  const TensorSet s = small_model();
  // 128 | 64+32+32 | 128 with a 130-byte limit: three shards, greedy in order as transformers does.
  write_model_weights(d.path().string(), s.tensors, 130);
  EXPECT_EQ(d.list(), (std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                                "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  const nlohmann::json index = nlohmann::json::parse(read_bytes(d / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 384);
  EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["model.norm.weight"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["lm_head.weight"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(read_bytes(d / "model.safetensors.index.json").back(), '\n');

  ModelWeights w(d.path().string());
  EXPECT_TRUE(w.sharded());
  EXPECT_EQ(w.files().size(), 3u);
  expect_loads(w, s);
  EXPECT_EQ(w.file_of("model.norm.weight"), d / "model-00002-of-00003.safetensors");
  // A tensor bigger than the limit gets a shard of its own.
  write_model_weights(d.path().string(), s.tensors, 1);
  EXPECT_EQ(ModelWeights(d.path().string()).files().size(), 5u);
}

TEST(ModelWeights, ResavingRemovesStaleFiles) {
  TempDir d;
  const TensorSet s = small_model();
  write_text_atomic(d / "config.json", "{}");  // not a weights file: never touched
  write_model_weights(d.path().string(), s.tensors, 1);  // 5 shards
  write_model_weights(d.path().string(), s.tensors, 130);  // 3 shards: the 5-shard files must go
  EXPECT_EQ(d.list().size(), 5u);
  expect_loads(ModelWeights(d.path().string()), s);
  write_model_weights(d.path().string(), s.tensors, 1000);  // single file: index and shards must go
  EXPECT_EQ(d.list(), (std::vector<std::string>{"config.json", "model.safetensors"}));
  write_model_weights(d.path().string(), s.tensors, 130);  // sharded again: the single file must go
  EXPECT_EQ(d.list().size(), 5u);
  EXPECT_FALSE(fs::exists(d / "model.safetensors"));
  expect_loads(ModelWeights(d.path().string()), s);
}

TEST(ModelWeights, MissingDirectoryOrFiles) {
  TempDir d;
  EXPECT_TRUE(one_line_naming(error_of([&] { ModelWeights w(d.path().string()); }),
                              {d.path().string(), "model.safetensors", "model.safetensors.index.json"}));
  EXPECT_TRUE(one_line_naming(error_of([&] { ModelWeights w(d / "nope"); }), {d / "nope", "does not exist"}));
}

TEST(ModelWeights, IndexNamingMissingShardFile) {
  TempDir d;
  write_model_weights(d.path().string(), small_model().tensors, 130);
  fs::remove(d / "model-00003-of-00003.safetensors");
  EXPECT_TRUE(one_line_naming(error_of([&] { ModelWeights w(d.path().string()); }),
                              {d / "model.safetensors.index.json", "tensor 'lm_head.weight'",
                               "model-00003-of-00003.safetensors", "does not exist"}));
}

TEST(ModelWeights, IndexNamingTensorNotInItsShard) {
  TempDir d;
  write_model_weights(d.path().string(), small_model().tensors, 130);
  nlohmann::json index = nlohmann::json::parse(read_bytes(d / "model.safetensors.index.json"));
  index["weight_map"]["model.norm.weight"] = "model-00001-of-00003.safetensors";
  write_text_atomic(d / "model.safetensors.index.json", index.dump(2));
  EXPECT_TRUE(one_line_naming(error_of([&] { ModelWeights w(d.path().string()); }),
                              {d / "model.safetensors.index.json", "tensor 'model.norm.weight'",
                               "model-00001-of-00003.safetensors", "does not hold it"}));
}

TEST(ModelWeights, TensorStoredInTwoShards) {
  TempDir d;
  const TensorSet s = small_model();
  write_model_weights(d.path().string(), s.tensors, 130);
  // Overwrite shard 1 with a file that also holds a tensor of shard 3.
  write_safetensors(d / "model-00001-of-00003.safetensors", {s.tensors[0], s.tensors[4]});
  EXPECT_TRUE(one_line_naming(error_of([&] { ModelWeights w(d.path().string()); }),
                              {d / "model.safetensors.index.json", "tensor 'lm_head.weight'", "two shard files"}));
}

TEST(ModelWeights, CorruptShardIsNamed) {
  TempDir d;
  write_model_weights(d.path().string(), small_model().tensors, 130);
  const std::string shard = d / "model-00002-of-00003.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 1);
  EXPECT_TRUE(one_line_naming(error_of([&] { ModelWeights w(d.path().string()); }), {shard, "truncated"}));
}

TEST(ModelWeights, ParseSize) {
  EXPECT_EQ(parse_size("5GB"), 5'000'000'000u);
  EXPECT_EQ(parse_size("500MB"), 500'000'000u);
  EXPECT_EQ(parse_size("2GiB"), uint64_t(2) << 30);
  EXPECT_EQ(parse_size("1000"), 1000u);
  EXPECT_EQ(parse_size(" 10 kb "), 10'000u);
  EXPECT_EQ(parse_size("1.5GB"), 1'500'000'000u);
  EXPECT_EQ(parse_size("64KiB"), 65536u);
  EXPECT_EQ(parse_size("3B"), 3u);
  for (const char* bad : {"", "GB", "5XB", "-5GB", "1.5", "0.3B", "99999999999TB", "5 G B", "1.2.3MB"})
    EXPECT_TRUE(one_line_naming(error_of([&] { (void)parse_size(bad); }), {"invalid size", bad})) << bad;
}

// ---- interop with an independent implementation ------------------------------------------------

TEST(SafetensorsInterop, PythonReadsOursAndWeReadPythons) {
  const fs::path script = fs::path(__FILE__).parent_path() / "torch_ref" / "safetensors_check.py";
  ASSERT_TRUE(fs::exists("/usr/bin/python3")) << "/usr/bin/python3 not installed (scripts/install-deps.sh --test installs it)";
  ASSERT_TRUE(fs::exists(script)) << script;
  TempDir d;
  const TensorSet s = shared_reference();
  write_safetensors(d / "cpp.safetensors", s.tensors, kSharedMetadata);

  // One Python run both verifies our file and writes its own (torch takes a while to import).
  const std::string log = d / "python.log";
  const std::string cmd = fmt::format("/usr/bin/python3 '{}' check '{}' '{}' > '{}' 2>&1", script.string(),
                                      d / "cpp.safetensors", d / "py.safetensors", log);
  const int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << cmd << "\n" << read_bytes(log);

  SafetensorsFile f(d / "py.safetensors");
  EXPECT_EQ(f.metadata(), kSharedMetadata);
  for (const auto& [name, t] : s.tensors) EXPECT_TRUE(same_bytes(f, name, t));
  EXPECT_EQ(f.info("h.i64").dtype_name, "I64");
  int64_t ids[3];
  f.read_range("h.i64", 0, 3, ids);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], -2);
  EXPECT_EQ(ids[2], int64_t(1) << 40);
}
