#include "data/stream_decoder.h"

#include <algorithm>

namespace shardlm::data {

size_t settled_utf8_length(std::string_view text) {
  size_t n = text.size();
  // An unfinished sequence at the end: a lead byte within the last 3 whose length reaches past n.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (len > back) n -= back;
    break;
  }
  static constexpr std::string_view replacement = "\xEF\xBF\xBD";
  while (n >= 3 && text.substr(n - 3, 3) == replacement) n -= 3;
  return n;
}

size_t utf8_chars(std::string_view text) {
  size_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

namespace {

size_t common_prefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tok, const std::vector<int32_t>& context) : tok_(tok) {
  if (context.empty()) return;
  // The anchor: the last few tokens of the context, as many as it takes (4, 8, ..., all) for their
  // text to hold a whole character; the stream's text is measured from there. Where they start
  // inside a character, or their first piece loses a leading space, both decodes push() compares
  // start the same way, so it cancels. (A context that ends inside a character, a prompt of token
  // ids cut there, keeps its unfinished end in the anchor's text: push() takes the stream's text
  // after what the two share.)
  size_t k = std::min<size_t>(4, context.size());
  std::string text;
  for (;;) {
    text = tok_.decode(std::vector<int32_t>(context.end() - std::ptrdiff_t(k), context.end()));
    if (settled_utf8_length(text) > 0 || k == context.size()) break;
    k = std::min(2 * k, context.size());
  }
  window_.assign(context.end() - std::ptrdiff_t(k), context.end());
  settled_tokens_ = window_.size();
  anchor_text_ = text;
  window_text_ = std::move(text);
}

std::string StreamDecoder::push(int32_t id) {
  window_.push_back(id);
  window_text_ = tok_.decode(window_);
  // The stream's text follows the anchor's: all of it, unless the anchor ended inside a character
  // that this token finished (then after the text the two share).
  const size_t base = window_text_.compare(0, anchor_text_.size(), anchor_text_) == 0
                          ? anchor_text_.size()
                          : common_prefix(window_text_, anchor_text_);
  const std::string_view rest = std::string_view(window_text_).substr(base);
  const size_t settled = settled_utf8_length(rest);
  std::string out;
  if (settled > returned_) {
    out.assign(rest.substr(returned_, settled - returned_));
    returned_ = settled;
  }
  if (settled < rest.size()) {
    pending_.assign(rest.substr(std::max(returned_, settled)));
    return out;
  }
  // Whole characters: the anchor moves up to the tokens since the last settled point, unless they
  // decode to nothing (control tokens, a lone "▁" whose space a decode from it would drop), which
  // would lose the first piece's space in the next decode.
  std::vector<int32_t> since(window_.begin() + std::ptrdiff_t(settled_tokens_), window_.end());
  std::string since_text = tok_.decode(since);
  if (!since_text.empty()) {
    window_ = std::move(since);
    anchor_text_ = std::move(since_text);
    window_text_ = anchor_text_;
  } else {
    anchor_text_ = window_text_;
  }
  settled_tokens_ = window_.size();
  returned_ = 0;
  pending_.clear();
  return out;
}

std::string StreamDecoder::peek(int32_t id) const {
  std::vector<int32_t> w = window_;
  w.push_back(id);
  const std::string t = tok_.decode(w);
  return t.substr(common_prefix(t, window_text_));
}

}  // namespace shardlm::data
