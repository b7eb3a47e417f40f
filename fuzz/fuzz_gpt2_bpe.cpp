// Fuzz target: a GPT-2 tokenizer's vocab.json and merges.txt. Input layout: vocab.json, a NUL
// byte, merges.txt.
#include "data/bpe_tokenizer.h"
#include "fuzz_common.h"
#include "fuzz_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), 2);
  const std::string vocab = fuzz::scratch().write("vocab.json", parts[0]);
  const std::string merges = fuzz::scratch().write("merges.txt", parts[1]);
  SHARDLM_FUZZ_EXPECT_ERRORS({ fuzz::exercise_tokenizer(*data::load_gpt2_bpe(vocab, merges)); });
  return 0;
}
