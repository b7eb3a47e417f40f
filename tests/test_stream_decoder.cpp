// data::StreamDecoder (incremental detokenization) on the real tokenizers in ../shared/data: Llama 2's
// SentencePiece (leading "▁", byte fallback), Llama 3's tiktoken and GPT-2's byte-level BPE, and the
// byte-level fallback. For every split of multibyte text (CJK, emoji, accents) into a prompt and a
// stream, the pieces streamed add up exactly to what decoding prompt and stream together gives
// after the prompt's own text; after every token, the text so far (pieces and pending) is that of
// the tokens so far, and a piece never ends inside a character.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "data/bpe_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/stream_decoder.h"
#include "data/tokenizer.h"
#include "infer/requests.h"

namespace fs = std::filesystem;
using namespace shardlm;

namespace {

// SHARDLM_SOURCE_DIR (tests/CMakeLists.txt): under ccache's base_dir, __FILE__ is a relative path.
const fs::path kData = fs::path(SHARDLM_SOURCE_DIR).parent_path() / "shared" / "data";

struct Named {
  std::string name;
  std::unique_ptr<data::Tokenizer> tok;
};

const std::vector<Named>& tokenizers() {
  static const std::vector<Named> all = [] {
    std::vector<Named> v;
    v.push_back({"byte-level", std::make_unique<data::ByteTokenizer>()});
    v.push_back({"llama2 sentencepiece", data::load_sentencepiece((kData / "llama2_tokenizer.model").string())});
    v.push_back({"llama3 tiktoken", data::load_tiktoken((kData / "llama3_tokenizer.model").string())});
    v.push_back({"gpt2 bpe", data::load_gpt2_bpe((kData / "gpt2_vocab.json").string(),
                                                 (kData / "gpt2_merges.txt").string())});
    return v;
  }();
  return all;
}

const std::vector<std::string> kTexts = {
    "Hello, world! 日本語のテキストです。 Emoji: 🦙🚀 and café — naïve.\n  Two spaces,\ttab.",
    "中文测试：你好，世界！😀👍🏽 한국어 Ελληνικά ﷽ 𝄞",
    " leading space,  double  spaces and a trailing one ",
    "\n\nnewlines\n first, then 🏳️‍🌈 (a flag of several code points) and ẞ",
};

// What the stream after `prompt` should be: the text of prompt + stream after the text the two share
// with the prompt's own (all of it but the prompt's text when that is a prefix, as it is unless the
// prompt ends inside a character).
std::string expected_after(const data::Tokenizer& tok, const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& all) {
  const std::string p = tok.decode(prompt), a = tok.decode(all);
  size_t i = 0;
  while (i < p.size() && i < a.size() && p[i] == a[i]) ++i;
  return a.substr(i);
}

bool ends_inside_character(const std::string& s) { return data::settled_utf8_length(s) < s.size(); }

}  // namespace

TEST(StreamDecoder, EverySplitOfMultibyteTextEqualsTheFullDecode) {
  ASSERT_TRUE(fs::exists(kData / "llama2_tokenizer.model")) << "shared test data not found at " << kData;
  for (const Named& t : tokenizers()) {
    for (const std::string& text : kTexts) {
      const std::vector<int32_t> ids = t.tok->encode_with(text, true, false);
      ASSERT_EQ(t.tok->decode(ids), text) << t.name;  // these texts round-trip
      for (size_t k = 0; k <= ids.size(); ++k) {
        const std::vector<int32_t> prompt(ids.begin(), ids.begin() + std::ptrdiff_t(k));
        data::StreamDecoder d(*t.tok, prompt);
        std::string streamed;
        for (size_t j = k; j < ids.size(); ++j) {
          const std::string piece = d.push(ids[j]);
          EXPECT_FALSE(ends_inside_character(piece)) << t.name << " split " << k << " token " << j;
          streamed += piece;
        }
        EXPECT_EQ(streamed + d.pending(), expected_after(*t.tok, prompt, ids)) << t.name << ": split at " << k;
        EXPECT_EQ(d.pending(), "") << t.name << ": whole text, nothing left pending";
      }
    }
  }
}

TEST(StreamDecoder, TextSoFarAfterEveryToken) {
  for (const Named& t : tokenizers())
    for (const std::string& text : kTexts) {
      const std::vector<int32_t> ids = t.tok->encode_with(text, true, false);
      for (size_t k : {size_t(0), size_t(1), size_t(3)}) {
        const std::vector<int32_t> prompt(ids.begin(), ids.begin() + std::ptrdiff_t(k));
        data::StreamDecoder d(*t.tok, prompt);
        std::string streamed;
        for (size_t j = k; j < ids.size(); ++j) {
          // peek names the token by the text it adds, unfinished bytes included.
          const std::string before = streamed + d.pending();
          const std::string peeked = d.peek(ids[j]);
          streamed += d.push(ids[j]);
          const std::vector<int32_t> so_far(ids.begin(), ids.begin() + std::ptrdiff_t(j + 1));
          EXPECT_EQ(streamed + d.pending(), expected_after(*t.tok, prompt, so_far)) << t.name << " token " << j;
          if (!ends_inside_character(before) && !ends_inside_character(streamed + d.pending())) {
            EXPECT_EQ(before + peeked, streamed + d.pending()) << t.name << " token " << j;
          }
        }
      }
    }
}

// Token sequences no text encodes to (random ids: byte pieces out of order, special tokens, a lone
// "▁"): the stream still equals the full decode for every split.
TEST(StreamDecoder, RandomTokensEverySplit) {
  std::mt19937 rng(7);
  for (const Named& t : tokenizers()) {
    const int64_t V = t.tok->vocab_size();
    for (int rep = 0; rep < 6; ++rep) {
      std::vector<int32_t> ids;
      for (int i = 0; i < 40; ++i) {
        // Half from the first 300 ids (SentencePiece's byte pieces and specials, single bytes) for
        // unfinished characters, half from anywhere.
        const int64_t hi = i % 2 ? V : std::min<int64_t>(V, 300);
        ids.push_back(int32_t(std::uniform_int_distribution<int64_t>(0, hi - 1)(rng)));
      }
      for (size_t k = 0; k <= ids.size(); ++k) {
        const std::vector<int32_t> prompt(ids.begin(), ids.begin() + std::ptrdiff_t(k));
        data::StreamDecoder d(*t.tok, prompt);
        std::string streamed;
        for (size_t j = k; j < ids.size(); ++j) streamed += d.push(ids[j]);
        EXPECT_EQ(streamed + d.pending(), expected_after(*t.tok, prompt, ids)) << t.name << " rep " << rep << " split " << k;
      }
    }
  }
}

// A prompt that ends in tokens that decode to nothing (EOS, with --stop-token-ids none): the anchor
// reaches back to text, so the first word keeps the space SentencePiece would drop at the start of
// a decode; so do the stream's own such tokens.
TEST(StreamDecoder, TokensThatDecodeToNothingKeepTheNextSpace) {
  const data::Tokenizer& sp = *tokenizers()[1].tok;
  std::vector<int32_t> prompt = sp.encode_with("Hello", true, false);
  for (int i = 0; i < 6; ++i) prompt.push_back(sp.eos_id());
  std::vector<int32_t> stream = sp.encode("big");  // "▁big"
  for (int i = 0; i < 6; ++i) stream.push_back(sp.eos_id());
  for (int32_t id : sp.encode("world")) stream.push_back(id);  // "▁world"
  data::StreamDecoder d(sp, prompt);
  std::string text;
  for (int32_t id : stream) text += d.push(id);
  EXPECT_EQ(text + d.pending(), " big world");
}

// CompletionText (the server's and generate's) streams through the decoder: the pieces it hands out,
// with a stop string, add up to the text; a stop string split over tokens is found.
TEST(StreamDecoder, CompletionTextStopStringOverTokens) {
  const data::Tokenizer& sp = *tokenizers()[1].tok;
  const std::vector<int32_t> prompt = sp.encode_with("Q:", true, false);
  const std::vector<int32_t> answer = sp.encode("日本語のテキスト END 🦙 more");
  infer::CompletionText t(sp, prompt, {"キスト E"});
  std::string streamed;
  bool stopped = false;
  size_t used = 0;
  for (int32_t id : answer) {
    ++used;
    stopped = t.push(id);
    streamed += t.take_delta(false);
    if (stopped) break;
  }
  streamed += t.take_delta(true);
  EXPECT_TRUE(stopped);
  EXPECT_LT(used, answer.size());
  EXPECT_EQ(t.text(), " 日本語のテ");
  EXPECT_EQ(streamed, t.text());
}
