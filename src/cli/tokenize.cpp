// `shardlm tokenize`: show the token ids (and pieces) a model's tokenizer gives a text.
// Owner: the SentencePiece tokenizer work.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>

#include "cli/commands.h"
#include "core/error.h"
#include "data/tokenizer.h"

namespace shardlm::cli {

namespace {

// Pieces can hold newlines, tabs and raw bytes; escape them so each prints on one line.
std::string escape_piece(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\\': out += "\\\\"; break;
      default:
        if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
        else out.push_back(char(c));  // UTF-8 passes through ("▁the", "Ġthe")
    }
  }
  return out;
}

std::string read_text(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open text file", {.file = path});
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

void register_tokenize(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("tokenize", "Show the token ids a model's tokenizer gives a text");
  struct Opts {
    std::string model, tokenizer, text, file;
    bool pieces = false, bos = false, eos = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::Option* model = cmd->add_option("--model", o->model, "Model directory (its tokenizer is chosen as for training)");
  CLI::Option* tokf = cmd->add_option("--tokenizer", o->tokenizer,
                                      "A tokenizer file: tokenizer.json, tokenizer.model, or vocab.json beside merges.txt");
  model->excludes(tokf);
  tokf->excludes(model);
  CLI::Option* text = cmd->add_option("--text", o->text, "The text to tokenize");
  CLI::Option* file = cmd->add_option("--file", o->file, "Tokenize this file's bytes ('-' reads standard input)");
  text->excludes(file);
  file->excludes(text);
  cmd->add_flag("--pieces", o->pieces, "Print one 'id<TAB>piece' line per token (pieces escaped: \\n, \\t, \\xNN)");
  cmd->add_flag("--bos", o->bos, "Start with the BOS token");
  cmd->add_flag("--eos", o->eos, "End with the EOS token");
  cmd->footer(
      "Prints the ids on one line, space-separated, and then 'N tokens' on standard error.\n"
      "\n"
      "Examples:\n"
      "  shardlm tokenize --model models/llama2-7b --text \"I believe the meaning of life is\" --bos\n"
      "  shardlm tokenize --tokenizer tokenizer.model --text \"Hello\\nworld\" --pieces\n"
      "  shardlm tokenize --model runs/demo --file prompt.txt");
  cmd->callback([o, model, tokf, text, file] {
    if (model->count() == 0 && tokf->count() == 0)
      throw Error("tokenize needs --model DIR or --tokenizer FILE");
    if (text->count() == 0 && file->count() == 0)
      throw Error("tokenize needs --text TEXT or --file FILE");
    const auto tok = model->count() ? data::load_tokenizer(o->model) : data::load_tokenizer_file(o->tokenizer);
    const std::string input = file->count() ? read_text(o->file) : o->text;
    const std::vector<int32_t> ids = tok->encode_with(input, o->bos, o->eos);
    std::string out;
    if (o->pieces) {
      for (int32_t id : ids) out += fmt::format("{}\t{}\n", id, escape_piece(tok->piece(id)));
    } else {
      for (size_t i = 0; i < ids.size(); ++i) out += fmt::format("{}{}", i ? " " : "", ids[i]);
      out += '\n';
    }
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
    std::fprintf(stderr, "%zu tokens\n", ids.size());
  });
}

}  // namespace shardlm::cli
