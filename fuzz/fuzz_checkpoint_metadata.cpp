// Fuzz target: a checkpoint's metadata.json (format, model, units, tensors, files, byte counts,
// checksum lists) opened with CheckpointReader, then a few elements of every tensor read back as
// resume and `shardlm convert` read them.
//
// The shard files come from a real checkpoint named by $SHARDLM_FUZZ_CHECKPOINT (scripts/fuzz.sh
// trains one), linked beside the fuzzed metadata, so mutations of a valid metadata.json reach
// the size, range and checksum checks. Without it only the metadata parser is exercised.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "fuzz_common.h"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const fs::path dir = shardlm::fuzz::scratch().dir();
  const char* real = std::getenv("SHARDLM_FUZZ_CHECKPOINT");
  if (real != nullptr && fs::is_directory(real)) {
    for (const auto& entry : fs::directory_iterator(real))
      if (entry.path().filename() != shardlm::ckpt::kMetadataName)
        fs::create_symlink(fs::absolute(entry.path()), dir / entry.path().filename());
  }
  if (!fs::exists(dir / shardlm::ckpt::kCompleteName)) shardlm::fuzz::scratch().write(shardlm::ckpt::kCompleteName, "");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  fuzz::scratch().write(ckpt::kMetadataName, fuzz::as_text(data, size));
  SHARDLM_FUZZ_EXPECT_ERRORS({
    ckpt::CheckpointReader reader(fuzz::scratch().dir().string());
    std::vector<float> buf(8);
    for (const ckpt::StoredTensor& t : reader.tensors()) {
      const int64_t count = std::clamp<int64_t>(t.numel(), 0, 8);
      SHARDLM_FUZZ_EXPECT_ERRORS({ reader.read(t.name, ckpt::Field::Master, 0, count, buf.data()); });
    }
  });
  return 0;
}
