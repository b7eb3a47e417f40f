// Fuzz target: a Hugging Face tokenizer.json (byte-level BPE: model, vocab, merges, added tokens,
// pre-tokenizer), loaded and used to encode and decode.
#include "data/bpe_tokenizer.h"
#include "fuzz_common.h"
#include "fuzz_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  const std::string path = fuzz::scratch().write("tokenizer.json", fuzz::as_text(data, size));
  SHARDLM_FUZZ_EXPECT_ERRORS({ fuzz::exercise_tokenizer(*data::load_hf_tokenizer_json(path)); });
  return 0;
}
