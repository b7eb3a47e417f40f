// Fuzz target: a safetensors file (header JSON, offsets, dtypes, shapes, data) opened and read
// through io::SafetensorsFile, as every model and checkpoint load does.
#include <algorithm>
#include <vector>

#include "fuzz_common.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  const std::string path = fuzz::scratch().write("model.safetensors", fuzz::as_text(data, size));
  SHARDLM_FUZZ_EXPECT_ERRORS({
    io::SafetensorsFile file(path);
    (void)file.names();
    (void)file.metadata();
    std::vector<uint8_t> buf;
    for (const io::TensorInfo& t : file.tensors()) {
      (void)file.info(t.name).shape_str();
      (void)file.bytes(t.name);
      // The first and last few elements: read_range is what sharded loads use.
      const int64_t n = t.numel();
      const uint64_t count = uint64_t(std::min<int64_t>(n, 4));
      buf.resize(count * t.element_size() + 1);
      if (count > 0) {
        file.read_range(t.name, 0, count, buf.data());
        file.read_range(t.name, uint64_t(n) - count, count, buf.data());
      }
      SHARDLM_FUZZ_EXPECT_ERRORS({
        const Tensor view = file.tensor(t.name);
        (void)view.numel();
      });
    }
  });
  return 0;
}
