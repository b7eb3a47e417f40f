// Fuzz target: Alpaca and chat records (a JSON array or JSONL), read and rendered into training
// examples. The first input byte picks the options (kind, chat format, bad-row policy, truncation);
// the rest is the file.
#include <string>
#include <vector>

#include "data/instruct.h"
#include "data/tokenizer.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  if (size == 0) return 0;
  const uint8_t pick = data[0];
  const std::string path = fuzz::scratch().write("data.jsonl", fuzz::as_text(data + 1, size - 1));
  static const data::ByteTokenizer tok;
  data::InstructOptions opt;
  opt.train_on_input = pick & 1;
  opt.chat_format = (pick & 2) ? "llama2" : "auto";
  opt.on_bad_row = (pick & 4) ? data::BadRowPolicy::Skip : data::BadRowPolicy::Fail;
  opt.max_seq_len = (pick & 8) ? 16 : 0;
  if (pick & 16) opt.columns.instruction = "question";
  SHARDLM_FUZZ_EXPECT_ERRORS({
    const std::string kind = (pick & 32) ? data::detect_json_kind(path, opt.columns) : ((pick & 64) ? "chat" : "alpaca");
    data::LoadReport report;
    std::vector<int64_t> ordinals;
    const std::vector<data::Example> examples = data::load_instruct_file(path, kind, tok, opt, report, &ordinals);
    (void)report.summary();
    if (!examples.empty()) (void)data::render_masked(tok, examples.front());
  });
  return 0;
}
