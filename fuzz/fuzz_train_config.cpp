// Fuzz target: a YAML training config and its key=value overrides, read as `shardlm train` reads
// them. Input layout: the YAML text, a NUL byte, then one override per line.
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), 2);
  const std::string path = fuzz::scratch().write("run.yaml", parts[0]);
  std::vector<std::string> overrides;
  std::string_view rest = parts[1];
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    overrides.emplace_back(rest.substr(0, nl));
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
  }
  SHARDLM_FUZZ_EXPECT_ERRORS({ (void)train::load_train_config(path, overrides); });
  return 0;
}
