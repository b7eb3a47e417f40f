// bench_tokenize: encoding speed of shardlm's tokenizers on the Alpaca demo records.
// Owner: the SentencePiece tokenizer work.
//
//   build/bench/bench_tokenize --sentencepiece FILE --alpaca FILE [--tiktoken FILE]
//                              [--gpt2 VOCAB MERGES] [--reps N]
//
// Encodes every non-empty field (instruction, input, output) of every record, N times (default
// 5), and prints one JSON line per tokenizer: records/s, MB/s (input UTF-8 bytes) and tokens/s,
// from the best of the N passes. bench/bench_tokenize_py.py prints the same for python
// sentencepiece on the same texts. Tokenizers are loaded through load_tokenizer_file, the path
// training takes (GPT-2's pair of files through load_gpt2_bpe, as its names may differ from
// vocab.json/merges.txt); each is optional, so the program runs with whichever files are given.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/tokenizer.h"

using namespace shardlm;

namespace {

struct Corpus {
  size_t records = 0, bytes = 0;
  std::vector<std::string> texts;
};

Corpus load_alpaca(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open", {.file = path});
  const nlohmann::json recs = nlohmann::json::parse(in);
  Corpus c;
  c.records = recs.size();
  for (const auto& r : recs)
    for (const char* f : {"instruction", "input", "output"}) {
      std::string t = r.value(f, std::string());
      if (t.empty()) continue;
      c.bytes += t.size();
      c.texts.push_back(std::move(t));
    }
  return c;
}

void bench(const std::string& label, const data::Tokenizer& tok, const Corpus& c, int reps) {
  size_t tokens = 0;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    size_t n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const std::string& t : c.texts) n += tok.encode(t).size();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    tokens = n;
  }
  std::printf("%s\n", fmt::format(R"({{"impl": "shardlm", "tokenizer": "{}", "kind": "{}", "records": {}, )"
                                  R"("texts": {}, "bytes": {}, "tokens": {}, "reps": {}, "best_s": {:.4f}, )"
                                  R"("records_per_s": {:.1f}, "mb_per_s": {:.2f}, "tokens_per_s": {:.0f}}})",
                                  label, tok.name(), c.records, c.texts.size(), c.bytes, tokens, reps, best,
                                  double(c.records) / best, double(c.bytes) / 1e6 / best, double(tokens) / best)
                          .c_str());
  std::fflush(stdout);
}

int usage() {
  std::fprintf(stderr,
               "usage: bench_tokenize --sentencepiece FILE --alpaca FILE [--tiktoken FILE] [--gpt2 VOCAB MERGES] "
               "[--reps N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sp, alpaca, tiktoken, gpt2_vocab, gpt2_merges;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has1 = i + 1 < argc;
    if (a == "--sentencepiece" && has1) sp = argv[++i];
    else if (a == "--alpaca" && has1) alpaca = argv[++i];
    else if (a == "--tiktoken" && has1) tiktoken = argv[++i];
    else if (a == "--gpt2" && i + 2 < argc) {
      gpt2_vocab = argv[++i];
      gpt2_merges = argv[++i];
    } else if (a == "--reps" && has1) reps = std::max(1, std::atoi(argv[++i]));
    else return usage();
  }
  if (alpaca.empty() || (sp.empty() && tiktoken.empty() && gpt2_vocab.empty())) return usage();
  try {
    const Corpus c = load_alpaca(alpaca);
    if (!sp.empty()) bench("sentencepiece", *data::load_tokenizer_file(sp), c, reps);
    if (!tiktoken.empty()) bench("tiktoken", *data::load_tokenizer_file(tiktoken), c, reps);
    if (!gpt2_vocab.empty()) bench("gpt2", *data::load_gpt2_bpe(gpt2_vocab, gpt2_merges), c, reps);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_tokenize: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
