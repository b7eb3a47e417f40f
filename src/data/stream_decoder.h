// Incremental detokenization: the text of a growing token sequence, handed out as tokens arrive,
// at a cost per token that does not grow with the sequence.
//
// Decoding only the new token on its own is wrong (SentencePiece drops the space of a leading "▁"
// piece, a character may take several byte tokens), and decoding the whole sequence after every
// token costs O(length) per token. A StreamDecoder decodes a short window of the last tokens
// instead: the window starts at an anchor, a token before which the text is settled (whole
// characters); a new token's text is decode(window) minus decode(window before it), both decoded
// from the same anchor, so a rule that applies to the first piece of a decode (SentencePiece's
// leading space) applies to both and cancels. Once the window's text ends in whole characters the
// anchor moves up to the last settled point, so the window holds the tokens since then: one or a
// few (more only while the tokens so far end in an unfinished UTF-8 sequence, a byte-level BPE
// token or SentencePiece byte-fallback piece that the next completes).
//
// What it relies on of Tokenizer::decode (checked for the byte-level, BPE, tiktoken and
// SentencePiece tokenizers by tests/test_stream_decoder.cpp, every split of real text): decoding is
// local, i.e. decode(a + b) is decode(a) followed by what b adds after a, apart from the first
// piece's leading space and unfinished characters at the end of a.
//
// Holds the tokenizer by reference (it must outlive the decoder); one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace shardlm::data {

// The length of `text` without an unfinished character at its end: a UTF-8 lead byte missing some
// of its continuation bytes, or U+FFFD (what SentencePiece writes for byte-fallback pieces it
// cannot finish yet), which the next token may complete or replace.
size_t settled_utf8_length(std::string_view text);

// The number of characters (code points) in UTF-8 `text`: bytes that are not continuation bytes.
size_t utf8_chars(std::string_view text);

class StreamDecoder {
 public:
  // `context`: the tokens the stream continues (a prompt); the text they decode to is not part of
  // the stream. Only its last few tokens are decoded (the anchor).
  explicit StreamDecoder(const Tokenizer& tok, const std::vector<int32_t>& context = {});

  // Adds a token and returns the text that is settled now and was not returned before (possibly
  // empty: a token that starts a character). The pieces returned add up to the text the stream's
  // tokens decode to after the context, less pending().
  std::string push(int32_t id);
  // The text of the tokens pushed that is not settled yet (an unfinished character at the end);
  // it may still change, and is what is left when the stream ends.
  const std::string& pending() const { return pending_; }
  // The text `id` would add if it were pushed now, unfinished bytes included (naming a token and
  // its alternatives in logprobs); costs a decode of the window.
  std::string peek(int32_t id) const;

 private:
  const Tokenizer& tok_;
  std::vector<int32_t> window_;  // the tokens from the anchor on
  size_t settled_tokens_ = 0;    // window_[0, settled_tokens_) decode to anchor_text_, whole characters
  std::string anchor_text_;      // decode(window_[0, settled_tokens_))
  std::string window_text_;      // decode(window_)
  size_t returned_ = 0;          // bytes of window_text_ after anchor_text_ already returned by push
  std::string pending_;
};

}  // namespace shardlm::data
