// Fuzz target: a DeepSpeed JSON (`deepspeed_config: ds.json`), translated into the training
// config's keys and read with a YAML that names it, as `shardlm train` reads the pair.
#include <string>

#include "fuzz_common.h"
#include "train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  const std::string json = fuzz::scratch().write("ds.json", fuzz::as_text(data, size));
  static const std::string yaml = fuzz::scratch().write(
      "run.yaml", "model: m\noutput_dir: out\ndata: {train: builtin:addition}\ndeepspeed_config: " + json + "\n");
  SHARDLM_FUZZ_EXPECT_ERRORS({ (void)train::load_train_config(yaml, {}); });
  return 0;
}
