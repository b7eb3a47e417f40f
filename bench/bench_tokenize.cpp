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
//
// With --detokenize, it measures streaming detokenization instead (issue 32): the cost per token of
// turning a completion's tokens into text as they arrive, at completion lengths 10 and 1000 (the
// Alpaca outputs, joined, as the completion of a 32-token prompt), for data::StreamDecoder
// ("incremental", what generate and serve do) and for decoding prompt and completion whole after
// every token ("full", what they did before), one JSON line per tokenizer, method and length.
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
#include "data/stream_decoder.h"
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

// Streams `n` tokens after a 32-token prompt, the best of `reps` runs: microseconds per token.
void bench_detokenize(const std::string& label, const data::Tokenizer& tok, const Corpus& c, int reps) {
  std::string all;
  for (const std::string& t : c.texts) {
    all += t;
    all += "\n";
    if (all.size() > 200000) break;
  }
  const std::vector<int32_t> ids = tok.encode_with(all, true, false);
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 32);
  for (const size_t n : {size_t(10), size_t(1000)}) {
    const std::vector<int32_t> completion(ids.begin() + 32, ids.begin() + 32 + std::ptrdiff_t(n));
    for (const bool incremental : {false, true}) {
      double best = 1e30;
      size_t bytes = 0;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        std::string text;
        if (incremental) {
          data::StreamDecoder d(tok, prompt);
          for (int32_t id : completion) text += d.push(id);
          text += d.pending();
        } else {
          const size_t prompt_bytes = tok.decode(prompt).size();
          std::vector<int32_t> seq = prompt;
          for (int32_t id : completion) {
            seq.push_back(id);
            const std::string whole = tok.decode(seq);
            text = whole.substr(std::min(prompt_bytes, whole.size()));
          }
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        bytes = text.size();
      }
      std::printf("%s\n", fmt::format(R"({{"bench": "detokenize", "tokenizer": "{}", "method": "{}", )"
                                      R"("completion_tokens": {}, "text_bytes": {}, "reps": {}, "us_per_token": {:.3f}}})",
                                      label, incremental ? "incremental" : "full", n, bytes, reps, best / double(n) * 1e6)
                              .c_str());
      std::fflush(stdout);
    }
  }
}

int usage() {
  std::fprintf(stderr,
               "usage: bench_tokenize --sentencepiece FILE --alpaca FILE [--tiktoken FILE] [--gpt2 VOCAB MERGES] "
               "[--reps N] [--detokenize]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sp, alpaca, tiktoken, gpt2_vocab, gpt2_merges;
  int reps = 5;
  bool detokenize = false;
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
    else if (a == "--detokenize") detokenize = true;
    else return usage();
  }
  if (alpaca.empty() || (sp.empty() && tiktoken.empty() && gpt2_vocab.empty())) return usage();
  try {
    const Corpus c = load_alpaca(alpaca);
    const auto run = detokenize ? bench_detokenize : bench;
    if (!sp.empty()) run("sentencepiece", *data::load_tokenizer_file(sp), c, reps);
    if (!tiktoken.empty()) run("tiktoken", *data::load_tokenizer_file(tiktoken), c, reps);
    if (!gpt2_vocab.empty()) run("gpt2", *data::load_gpt2_bpe(gpt2_vocab, gpt2_merges), c, reps);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_tokenize: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
