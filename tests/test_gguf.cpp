// Unit tests of src/io/gguf: ggml's Q8_0 quantizer on blocks whose answer is known by hand, and the
// GGUF writer's byte layout and refusals. Whole exported files are read back by an independent
// reader in tests/scripts/gguf_export_cli.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "io/gguf.h"
#include "testing.h"

using namespace shardlm;
using namespace shardlm::io;
using shardlm::testing::TempDir;
namespace fs = std::filesystem;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

template <class T>
T at(const std::string& s, size_t pos) {
  T v;
  std::memcpy(&v, s.data() + pos, sizeof(T));
  return v;
}

TEST(Gguf, Q8_0KnownBlocks) {
  // Block 0: max |x| = 127 -> d = 1 exactly; x = k + 0.5 rounds away from zero (roundf).
  // Block 1: all zero -> d = 0, codes 0. Block 2: max |x| = 2.54 -> d = 0.02 (as f16), -2.54 -> -127.
  std::vector<float> x(96, 0.0f);
  for (int j = 0; j < 32; ++j) x[size_t(j)] = float(j) - 15.5f;  // -15.5 .. 15.5
  x[31] = 127.0f;
  for (int j = 0; j < 32; ++j) x[size_t(64 + j)] = 0.0f;
  x[64] = -2.54f;
  x[65] = 1.0f;
  std::vector<uint8_t> q(3 * kQ8_0BlockBytes);
  quantize_q8_0(x.data(), 96, q.data());
  auto scale = [&](int b) { return f16_to_f32(f16_t{at<uint16_t>(std::string(q.begin(), q.end()), size_t(b) * 34)}); };
  auto code = [&](int b, int j) { return int(int8_t(q[size_t(b) * 34 + 2 + size_t(j)])); };
  EXPECT_EQ(scale(0), 1.0f);
  EXPECT_EQ(code(0, 0), -16);  // -15.5 -> -16
  EXPECT_EQ(code(0, 15), -1);  // -0.5 -> -1
  EXPECT_EQ(code(0, 16), 1);   // 0.5 -> 1
  EXPECT_EQ(code(0, 31), 127);
  EXPECT_EQ(scale(1), 0.0f);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(code(1, j), 0);
  EXPECT_EQ(scale(2), f16_to_f32(f32_to_f16(2.54f / 127.0f)));
  EXPECT_EQ(code(2, 0), -127);
  EXPECT_EQ(code(2, 1), int(std::roundf(1.0f * (127.0f / 2.54f))));  // 50
  EXPECT_EQ(ggml_nbytes(GgmlType::Q8_0, 96), 102u);

  x[70] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(quantize_q8_0(x.data(), 96, q.data()), Error);
  EXPECT_THROW(quantize_q8_0(x.data(), 40, q.data()), Error);  // not whole blocks
}

TEST(Gguf, WriterLayout) {
  TempDir dir;
  const std::string path = dir / "m.gguf";
  GgufMetadata kv;
  kv.add_string("general.architecture", "llama");
  kv.add_u32("llama.block_count", 2);
  EXPECT_THROW(kv.add_u32("llama.block_count", 3), Error);  // a key twice
  const std::vector<float> a = {1, 2, 3}, b(64, 0.5f);
  GgufWriter w(path, kv, {{"a.weight", {3}, GgmlType::F32}, {"b.weight", {2, 32}, GgmlType::F32}});
  EXPECT_THROW(w.write("b.weight", b.data(), 4), Error);  // out of order
  w.write("a.weight", a.data(), 12);
  EXPECT_THROW(w.write("b.weight", b.data(), 257 * 4), Error);  // more than it holds
  w.write("b.weight", b.data(), 128);
  w.write("b.weight", b.data() + 32, 128);
  w.finish();
  const std::string s = read_all(path);
  ASSERT_EQ(s.size(), w.file_size());
  EXPECT_EQ(s.substr(0, 4), "GGUF");
  EXPECT_EQ(at<uint32_t>(s, 4), 3u);
  EXPECT_EQ(at<uint64_t>(s, 8), 2u);   // tensors
  EXPECT_EQ(at<uint64_t>(s, 16), 3u);  // key-values: the two and general.alignment
  EXPECT_EQ(w.data_offset() % 32, 0u);
  // a at the data section's start, b at the next multiple of 32 after a's 12 bytes.
  EXPECT_EQ(at<float>(s, w.data_offset() + 8), 3.0f);
  EXPECT_EQ(at<float>(s, w.data_offset() + 32), 0.5f);
  EXPECT_EQ(s.size(), w.data_offset() + 32 + 256);
  // b's dims in ggml order: {32, 2}, just before its type and offset.
  const size_t b_info = s.find("b.weight") + 8;
  EXPECT_EQ(at<uint32_t>(s, b_info), 2u);
  EXPECT_EQ(at<uint64_t>(s, b_info + 4), 32u);
  EXPECT_EQ(at<uint64_t>(s, b_info + 12), 2u);
  EXPECT_EQ(at<uint32_t>(s, b_info + 20), uint32_t(GgmlType::F32));
  EXPECT_EQ(at<uint64_t>(s, b_info + 24), 32u);
}

TEST(Gguf, WriterRefusesAndLeavesNothing) {
  TempDir dir;
  const std::string path = dir / "m.gguf";
  {
    GgufWriter w(path, GgufMetadata{}, {{"a.weight", {4}, GgmlType::F32}});
    const float a[2] = {1, 2};
    w.write("a.weight", a, 8);
    EXPECT_THROW(w.finish(), Error);  // half written
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(dir.list().empty());  // no temporary file left either
  EXPECT_THROW(GgufWriter(path, GgufMetadata{}, {{"q.weight", {2, 48}, GgmlType::Q8_0}}), Error);  // rows of 48
  EXPECT_THROW(GgufWriter(path, GgufMetadata{}, {{std::string(65, 'x'), {1}, GgmlType::F32}}), Error);
  EXPECT_TRUE(dir.list().empty());
}

}  // namespace
