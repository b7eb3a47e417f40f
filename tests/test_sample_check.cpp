// validate's stop-token check of the first examples (train/sample_check.h): a rendering whose loss
// has no end-of-answer token is caught, naming the file and the example's line; examples cut by
// seq_len are excused only while another one ends. The end-to-end checks (chat format, truncation
// warning) are in tests/scripts/validate_samples_cli.sh.
#include <gtest/gtest.h>

#include "data/instruct.h"
#include "data/tokenizer.h"
#include "ops/ops.h"
#include "train/sample_check.h"

using namespace shardlm;

namespace {

constexpr int32_t kIgnore = ops::kIgnoreIndex;

// "<s>Q: hi A: ok" + (with_eos ? "</s>" : ""), the loss on the answer (and EOS), as alpaca_example
// masks it; without EOS it is what a template that forgets to label EOS renders.
data::LoadedSample sample(int64_t line, bool with_eos, bool truncated = false) {
  const data::ByteTokenizer tok;
  std::vector<int32_t> seq = tok.encode_with("Q: hi A: ok", true, with_eos);
  const size_t prompt = 1 + std::string("Q: hi A:").size();
  data::Example e;
  e.ids.assign(seq.begin(), seq.end() - 1);
  for (size_t i = 1; i < seq.size(); ++i) e.targets.push_back(i >= prompt ? seq[i] : kIgnore);
  return {line, e, truncated};
}

const std::vector<int32_t> kStops = {data::ByteTokenizer::kEos};

// check_stop_labels' error on `samples` (seq_len 8), or "" when there is none.
std::string error_of(const std::vector<data::LoadedSample>& samples) {
  try {
    train::check_stop_labels("d.jsonl", samples, kStops, data::ByteTokenizer(), 8);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(SampleCheck, ExamplesThatTrainEosPass) {
  const data::ByteTokenizer tok;
  EXPECT_EQ(train::check_stop_labels("d.jsonl", {sample(1, true), sample(2, true)}, kStops, tok, 64), 2);
  // One example cut by seq_len is excused while the others end.
  EXPECT_EQ(train::check_stop_labels("d.jsonl", {sample(1, true), sample(2, false, true)}, kStops, tok, 64), 1);
}

TEST(SampleCheck, AnExampleWithoutEosInItsLossFailsNamingItsLine) {
  const std::string what = error_of({sample(1, true), sample(3, false)});
  EXPECT_EQ(what.rfind("d.jsonl:3: this example's loss has none of the tokens generation stops on (</s> (2))", 0), 0u)
      << what;
  EXPECT_NE(what.find("«<s>Q: hi A:» ok"), std::string::npos) << what;
  // The EOS is in the sequence but masked: still no stop token trained.
  data::LoadedSample masked = sample(5, true);
  masked.example.targets.back() = kIgnore;
  EXPECT_EQ(error_of({masked}).rfind("d.jsonl:5: this example's loss has none", 0), 0u) << error_of({masked});
}

TEST(SampleCheck, EveryExampleCutBeforeItsEndFails) {
  const std::string what = error_of({sample(2, false, true), sample(4, false, true)});
  EXPECT_EQ(what.rfind("d.jsonl:2: none of the first 2 examples (lines 2 to 4) has a token generation stops on", 0), 0u)
      << what;
  EXPECT_NE(what.find("seq_len 8 cuts 2 of them"), std::string::npos) << what;
  const std::string one = error_of({sample(7, false, true)});
  EXPECT_EQ(one.rfind("d.jsonl:7: the only example loading kept (line 7) has no token generation stops on", 0), 0u)
      << one;
}
