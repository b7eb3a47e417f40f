// Fuzz target: a model directory's config.json read as a ModelConfig (Llama, Mistral, Qwen2;
// rope scaling, quantization_config), then used as training and the estimator use it.
#include "fuzz_common.h"
#include "model/config.h"
#include "model/hf_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  fuzz::scratch().write("config.json", fuzz::as_text(data, size));
  SHARDLM_FUZZ_EXPECT_ERRORS({
    const ModelConfig cfg = load_hf_config(fuzz::scratch().dir().string());
    (void)parameter_count(cfg);
    (void)to_hf_json(cfg).dump();
  });
  return 0;
}
