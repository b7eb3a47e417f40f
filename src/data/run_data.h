// The data of a training run as its `data:` section describes it (docs/data.md): the files, their
// type, the held-out split, and evaluation batches formed the same way for any world size.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "data/dataset.h"
#include "data/instruct.h"
#include "model/llama.h"
#include "ops/ops.h"

namespace shardlm::data {

// data.type. Auto: builtin:addition by name, .bin/.tokens are token files, .json/.jsonl are
// alpaca or chat by their first record, the rest is text.
enum class DataType { Auto, Text, Tokens, Alpaca, Chat, Preference, BuiltinAddition };
// data.chat_format. Auto: the family of the model's chat_template (tokenizer_config.json), else
// llama3 when the tokenizer has <|start_header_id|>, chatml when it has <|im_start|>, else llama2
// (resolve_chat_format decides, once the tokenizer is known).
enum class ChatTemplate { Auto, Llama3, Llama2, ChatML, Mistral };

struct DataSource;

struct DataConfig {
  DataType type = DataType::Auto;
  std::string train;            // the training file, or "builtin:addition"
  int token_bytes = 2;          // tokens: 2 (uint16) or 4 (uint32) per id
  std::string eval;             // a separate evaluation file (optional)
  double eval_fraction = 0.05;  // else hold out this fraction (text/tokens: the tail; records: by hash)
  // alpaca / chat
  AlpacaColumns columns;        // field names of instruction, input, output
  bool train_on_input = false;  // keep the prompt (and chat non-assistant turns) in the loss
  ChatTemplate chat_format = ChatTemplate::Auto;
  // Not a config key: the model directory's tokenizer_config.json chat_template ("" if none), set
  // by whoever loads the run (read_chat_template), for chat_format auto.
  std::string chat_template;
  std::optional<bool> packing;  // unset: true for alpaca/chat, false otherwise
  BadRowPolicy on_bad_row = BadRowPolicy::Fail;
  // Not a config key: `shardlm eval --data FILE` evaluates the whole of `train` (no training
  // split, no held-out fraction); `eval` is not read.
  bool evaluate_whole_file = false;
  // builtin:addition
  int digits = 2;
  int64_t train_examples = 20000;
  int64_t eval_examples = 500;
  // `data:` written as a list: a mixture of these sources (then the fields above are unused).
  std::vector<DataSource> mixture;
};

// One source of a mixture (docs/data.md "Mixtures"): its own data section, and how much of it an
// epoch of the mixture holds: `weight` (the sources' weights are shares of an epoch as large as all
// the sources together) or `epochs` (passes over the source per epoch, fractions allowed);
// neither: one pass. A source's examples are drawn in shuffled passes of their own, continuing
// from epoch to epoch, so a down-weighted source still cycles through all of its examples.
struct DataSource {
  DataConfig data;
  double weight = 0;  // > 0 when given
  double epochs = 0;  // > 0 when given
};

// What a mixture's sampler needs of each source: its units (examples, or pairs) in the
// concatenated dataset, [begin, begin + size), and how many of them an epoch takes.
struct MixPart {
  std::string name;  // the source's file
  int64_t begin = 0, size = 0, per_epoch = 0;
};

// The training and evaluation data of a run, as `data:` describes it (docs/data.md).
struct RunData {
  std::unique_ptr<Dataset> train, eval;
  const AdditionTask* task = nullptr;  // the eval set when it is the built-in task
  std::string type;                          // resolved: text, tokens, alpaca, chat, preference, builtin:addition
  int64_t seq_len = 0;                       // row length
  bool packing = false;
  // Preference data: examples 2i and 2i+1 are pair i's chosen and rejected, always read together.
  bool pairs = false;
  std::vector<MixPart> mixture;  // a mixture's sources, in config order (empty: one source)
  std::vector<std::string> report;           // what loading found, one line each, for the log
  // alpaca / chat: what loading found in each file read (the training file, then the eval file)
  std::vector<std::pair<std::string, LoadReport>> loads;
};
// Whether the run's data is text to tokenize (text, alpaca, chat), as opposed to token files or
// the built-in task.
bool reads_text(const DataConfig& dc);
// Loads (tokenizes, renders, splits) the data of a run. Errors name the file and line at fault.
// Token files (pre-tokenized data) are checked against model_vocab_size, the model's vocab_size:
// the ids index its embedding, whatever tokenizer the directory has (none: the byte-level
// fallback, whose 259 ids say nothing about the data). The trainer refuses a tokenizer with more
// ids than the model before it calls this.
RunData load_run_data(const DataConfig& dc, int64_t seq_len, uint64_t seed, const Tokenizer& tok,
                      int64_t model_vocab_size);
// What one rank evaluated: the loss summed over its non-ignored targets, their number, and its rows.
struct EvalSums {
  double loss_sum = 0.0;
  int64_t tokens = 0;  // targets in the loss
  int64_t rows = 0;    // rows of at most T positions (a packed row holds several examples)
};
// Loss sums over the non-ignored targets of the first max_rows rows of `eval` (all of them when
// max_rows < 0), rows formed in the dataset's order (packed or padded as in training). Rank r of W
// evaluates rows [g B W + r B, + B) of each global batch g, so the ranks together cover what one
// process with batch B W would, and the rows evaluated do not depend on W; the caller sums over
// ranks. The trainer bounds it by eval_batches global batches (max_rows = eval_batches B W).
EvalSums eval_loss_sums(const std::function<ops::CrossEntropyResult(const model::Batch&)>& forward, const Dataset& eval,
                        bool packing, int64_t B, int64_t T, int64_t max_rows, int32_t pad, int rank, int world_size);

// A data enum compares equal to its spelling (core/enum_names.h).
using shardlm::operator==;

}  // namespace shardlm::data

namespace shardlm {
template <>
struct EnumNames<data::DataType> {
  static constexpr std::pair<data::DataType, const char*> values[] = {
      {data::DataType::Auto, "auto"},     {data::DataType::Text, "text"}, {data::DataType::Tokens, "tokens"},
      {data::DataType::Alpaca, "alpaca"}, {data::DataType::Chat, "chat"}, {data::DataType::Preference, "preference"},
      {data::DataType::BuiltinAddition, "builtin:addition"}};
};
template <>
struct EnumNames<data::ChatTemplate> {
  static constexpr std::pair<data::ChatTemplate, const char*> values[] = {
      {data::ChatTemplate::Auto, "auto"}, {data::ChatTemplate::Llama3, "llama3"}, {data::ChatTemplate::Llama2, "llama2"},
      {data::ChatTemplate::ChatML, "chatml"}, {data::ChatTemplate::Mistral, "mistral"}};
};
template <>
struct EnumNames<data::BadRowPolicy> {
  static constexpr std::pair<data::BadRowPolicy, const char*> values[] = {{data::BadRowPolicy::Fail, "fail"},
                                                                          {data::BadRowPolicy::Skip, "skip"}};
};
}  // namespace shardlm
