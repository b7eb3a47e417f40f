// Fuzz target: a tiktoken BPE file (Llama 3's tokenizer.model: "base64-token rank" lines), loaded
// and used to encode and decode.
#include "data/bpe_tokenizer.h"
#include "fuzz_common.h"
#include "fuzz_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  const std::string path = fuzz::scratch().write("tokenizer.model", fuzz::as_text(data, size));
  SHARDLM_FUZZ_EXPECT_ERRORS({ fuzz::exercise_tokenizer(*data::load_tiktoken(path)); });
  return 0;
}
