// What the tokenizer targets do with a tokenizer that loaded: what training and generation do.
#pragma once

#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace shardlm::fuzz {

inline void exercise_tokenizer(const data::Tokenizer& tok) {
  // Text with merges, whitespace runs, digits, bytes outside ASCII and a marker-like string.
  static const char* kTexts[] = {"Hello world!  It's 2026-11-23.\n\tnew\r\nline",
                                 "na\xc3\xafve caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x99\x82",
                                 "<|eot_id|><s>[INST] x [/INST]", ""};
  for (const char* text : kTexts) {
    const std::vector<int32_t> ids = tok.encode_with(text, true, true);
    (void)tok.decode(ids);
    for (int32_t id : ids) (void)tok.piece(id);
  }
  (void)tok.special_token("<|eot_id|>");
  (void)tok.special_token("</s>");
  const int64_t v = tok.vocab_size();
  for (int64_t id : {int64_t(0), v / 2, v - 1})
    if (id >= 0 && id < v) (void)tok.decode({int32_t(id)});
}

}  // namespace shardlm::fuzz
