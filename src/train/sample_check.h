// The checks that catch a broken fine-tune before it runs (`shardlm validate`, docs/data.md): the
// first examples of every instruction data file, as training loaded them (RunData::loads, the same
// rendering, tokenization and masking), against what `generate` and `serve` will do with the
// trained model. Owner: the trainer.
//   - The chat format training renders conversations in is the one `generate --chat` and `serve`
//     resolve for the model (its tokenizer_config.json chat_template, which the trained model's
//     directory copies, else the tokenizer's special tokens).
//   - Each example's loss covers a token generation stops on (EOS, config.json's and
//     generation_config.json's eos_token_id, the chat format's end-of-turn token): a model that
//     never sees one in its loss does not learn to stop.
//   - seq_len truncates at most a few percent of the examples (else a warning with the share).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/instruct.h"
#include "train/run_setup.h"

namespace shardlm::train {

// Above this share of truncated examples a file gets a warning.
inline constexpr double kTruncationWarnShare = 0.02;

struct SampleCheck {
  std::vector<std::string> lines;     // what was checked, one line each
  std::vector<std::string> warnings;  // one line each
  std::string sample;                 // the first training example as training sees it (data::render_masked)
};

// The checks above on the data `in` holds (loaded by load_inputs from `c`). An Error names the
// config key (data.chat_format) or the data file and the line of the example at fault.
SampleCheck check_samples(const TrainConfig& c, const RunInputs& in);

// The stop-token check of one file: every example of `samples` that seq_len did not cut must have
// one of `stop_ids` among its trained targets, and at least one example must; else an Error naming
// `path` and the line of the example at fault. Returns how many examples have one.
int64_t check_stop_labels(const std::string& path, const std::vector<data::LoadedSample>& samples,
                          const std::vector<int32_t>& stop_ids, const data::Tokenizer& tok, int64_t seq_len);

}  // namespace shardlm::train
