#include "io/yaml_config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

namespace shardlm {

namespace detail {

// Our own copy of the YAML tree: yaml-cpp nodes are reference-like handles, awkward to move
// between parents, and we need per-node bookkeeping (was it read, where was it written).
struct ConfigNode {
  enum class Kind { Null, Scalar, Sequence, Map } kind = Kind::Null;
  std::string scalar;
  std::vector<std::unique_ptr<ConfigNode>> items;                            // Sequence
  std::vector<std::pair<std::string, std::unique_ptr<ConfigNode>>> entries;  // Map, in file order
  bool command_line = false;
  int64_t line = -1;       // 1-based line of the key (or list item) in the file
  std::string origin_key;  // the key it was written under, when alias() moved it
  std::string file;        // the file it was written in, when not the tree's (set_from: a DeepSpeed JSON)
  bool used = false;       // a reader consumed it

  ConfigNode* entry(const std::string& name) {
    for (auto& [k, v] : entries)
      if (k == name) return v.get();
    return nullptr;
  }
};

struct ConfigState {
  std::string file;
  std::unique_ptr<ConfigNode> root;
  std::vector<std::string> requested;  // every key a reader asked for, in order
  std::set<std::string> requested_set;

  void record(const std::string& key) {
    if (requested_set.insert(key).second) requested.push_back(key);
  }
  const std::string& file_of(const ConfigNode& n) const { return n.file.empty() ? file : n.file; }
  std::string source(const ConfigNode& n) const {
    if (n.command_line) return "command line";
    return n.line > 0 ? fmt::format("{}:{}", file_of(n), n.line) : file_of(n);
  }
  Error error(const ConfigNode& n, const std::string& key, std::string message) const {
    ErrorContext ctx;
    ctx.file = n.command_line ? "command line" : file_of(n);
    if (!n.command_line) ctx.line = n.line;
    ctx.key = key;
    return Error(std::move(message), std::move(ctx));
  }
};

}  // namespace detail

int edit_distance(const std::string& a, const std::string& b) {
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = int(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diag = row[0];
    row[0] = int(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

namespace {

// An ErrorContext naming only a file (designated initializers would warn about the rest).
ErrorContext file_context(std::string file) {
  ErrorContext ctx;
  ctx.file = std::move(file);
  return ctx;
}

using detail::ConfigNode;
using detail::ConfigState;
using Kind = ConfigNode::Kind;

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  if (key.empty()) return parts;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (parts.back().empty()) throw Error(fmt::format("invalid config key '{}': empty component", key));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

std::string join_key(const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; }

std::optional<size_t> parse_index(const std::string& s) {
  size_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::string describe(const ConfigNode& n) {
  switch (n.kind) {
    case Kind::Null: return "null";
    case Kind::Scalar: return fmt::format("'{}'", n.scalar);
    case Kind::Sequence: return "a list";
    case Kind::Map: return "a map";
  }
  return "?";
}

// yaml-cpp keeps an alias as a reference to the node its anchor names, but the tree built here
// copies that node at every use, so aliases of aliases ("billion laughs": nine lines of
// `b: [*a, *a, *a, ...]`) expand exponentially; issue 30's ran 51 s into std::bad_alloc. No
// configuration holds anywhere near this many values, so the copy stops there.
constexpr size_t kMaxConfigValues = 100000;

std::unique_ptr<ConfigNode> from_yaml(const YAML::Node& y, int64_t line, bool command_line, const ConfigState& st,
                                      const std::string& key, size_t& values) {
  auto n = std::make_unique<ConfigNode>();
  n->line = line;
  n->command_line = command_line;
  if (++values > kMaxConfigValues)
    throw st.error(*n, key,
                   fmt::format("the YAML holds more than {} values (aliases that repeat aliases?); refused",
                               kMaxConfigValues));
  auto line_of = [&](const YAML::Mark& m) { return m.is_null() ? line : int64_t(m.line) + 1; };
  switch (y.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null: n->kind = Kind::Null; break;
    case YAML::NodeType::Scalar:
      n->kind = Kind::Scalar;
      n->scalar = y.Scalar();
      break;
    case YAML::NodeType::Sequence:
      n->kind = Kind::Sequence;
      for (size_t i = 0; i < y.size(); ++i)
        n->items.push_back(
            from_yaml(y[i], line_of(y[i].Mark()), command_line, st, join_key(key, std::to_string(i)), values));
      break;
    case YAML::NodeType::Map:
      n->kind = Kind::Map;
      for (auto it = y.begin(); it != y.end(); ++it) {
        const int64_t key_line = line_of(it->first.Mark());
        ConfigNode where;
        where.command_line = command_line;
        where.line = key_line;
        if (!it->first.IsScalar()) throw st.error(where, key, "map keys must be plain names");
        const std::string name = it->first.Scalar();
        const std::string child_key = join_key(key, name);
        // yaml-cpp keeps both copies of a repeated key; which one wins would be an accident.
        if (const ConfigNode* first = n->entry(name))
          throw st.error(where, child_key, fmt::format("duplicate key (first set at {})", st.source(*first)));
        n->entries.emplace_back(name, from_yaml(it->second, key_line, command_line, st, child_key, values));
      }
      break;
  }
  return n;
}

// yaml-cpp scans a whole flow collection before its parser's depth guard (2000 levels) stops it: a
// JSON file (DeepSpeed's) nested a million deep took 9 s and 300 MB to be refused. No configuration
// nests a tenth of this, so the text is measured first: brackets and braces outside quotes and
// comments, counted as they open and close.
constexpr int kMaxYamlDepth = 128;

YAML::Node load_yaml(const std::string& text) {
  int depth = 0, line = 0;
  char quote = 0;
  bool comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      comment = false;
      if (quote == '\'') quote = 0;  // a flow scalar may span lines, but a stray ' must not end the count
      continue;
    }
    if (comment) continue;
    if (quote) {
      if (c == '\\' && quote == '"') ++i;
      else if (c == quote) quote = 0;
      continue;
    }
    const char before = i == 0 ? ' ' : text[i - 1];
    const bool token_start =
        std::isspace(static_cast<unsigned char>(before)) || (before != '\0' && std::strchr("[{,:", before));
    if (c == '#' && token_start) comment = true;
    else if ((c == '"' || c == '\'') && token_start) quote = c;
    else if (c == '[' || c == '{') {
      if (++depth > kMaxYamlDepth) {
        YAML::Mark mark;
        mark.line = line;
        throw YAML::ParserException(mark, fmt::format("nested deeper than {} levels (refused)", kMaxYamlDepth));
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return YAML::Load(text);
}

// ---- typed conversion of scalars ---------------------------------------------------------------

bool parse_double(std::string_view s, double& out) {
  if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf" || s == "+.Inf" || s == "+.INF") {
    out = std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == "-.inf" || s == "-.Inf" || s == "-.INF") {
    out = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && !std::isnan(out);
}

template <class T>
T to_value(const ConfigState& st, const ConfigNode& n, const std::string& key) {
  if constexpr (detail::ConfigVector<T>::value) {
    using E = typename detail::ConfigVector<T>::element;
    if (n.kind != Kind::Sequence) throw st.error(n, key, fmt::format("expected a list, got {}", describe(n)));
    T out;
    for (size_t i = 0; i < n.items.size(); ++i) {
      n.items[i]->used = true;
      out.push_back(to_value<E>(st, *n.items[i], fmt::format("{}[{}]", key, i)));
    }
    return out;
  } else {
    const char* expected = std::is_same_v<T, bool>          ? "true or false"
                           : std::is_same_v<T, std::string> ? "a string"
                           : std::is_same_v<T, uint64_t>    ? "a non-negative integer"
                           : std::is_integral_v<T>          ? "an integer"
                                                            : "a number";
    if (n.kind != Kind::Scalar) throw st.error(n, key, fmt::format("expected {}, got {}", expected, describe(n)));
    const std::string& s = n.scalar;
    auto bad = [&] { return st.error(n, key, fmt::format("expected {}, got '{}'", expected, s)); };
    if constexpr (std::is_same_v<T, std::string>) {
      return s;
    } else if constexpr (std::is_same_v<T, bool>) {
      // Only YAML 1.2's booleans: yes/no/on/off are too easy to write by accident.
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
      throw bad();
    } else if constexpr (std::is_integral_v<T>) {
      std::string_view v = s;
      if (!v.empty() && v[0] == '+') v.remove_prefix(1);
      T out{};
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
      if (ec == std::errc() && p == v.data() + v.size()) return out;
      // 1e6 and 4096.0 are integers written as floats; 2.5 is not.
      double d = 0;
      if (!parse_double(s, d) || !std::isfinite(d) || d != std::floor(d)) throw bad();
      if (d < double(std::numeric_limits<T>::min()) || d >= std::ldexp(1.0, std::numeric_limits<T>::digits))
        throw st.error(n, key,
                       fmt::format("integer {} out of range [{}, {}]", s, std::numeric_limits<T>::min(),
                                   std::numeric_limits<T>::max()));
      return T(d);
    } else {
      // A value past T's range (1e400, or 1e39 for a float) is refused here rather than read as an
      // infinity; .inf itself is a value (the readers of config fields refuse it, naming the rule
      // of the key: train/config_fields.h).
      double d = 0;
      if (!parse_double(s, d))
        throw std::isinf(std::strtod(s.c_str(), nullptr)) ? st.error(n, key, fmt::format("number {} is out of range", s))
                                                          : bad();
      if (std::isfinite(d) && std::fabs(d) > double(std::numeric_limits<T>::max()))
        throw st.error(n, key, fmt::format("number {} is out of range (at most {})", s, std::numeric_limits<T>::max()));
      return T(d);
    }
  }
}

std::string last_component(const std::string& key) {
  const size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

// The requested key nearest to `unknown`: a few edits away, or the same name at another level.
std::optional<std::string> suggest(const std::string& unknown, const std::vector<std::string>& known) {
  std::optional<std::string> best;
  int best_score = std::numeric_limits<int>::max();
  for (const std::string& k : known) {
    // The allowance scales with the name, not the dotted path: "optimizer.betas" is not a
    // typo of "optimizer.eps", but "gradient_accumulation_step" is one of "..._steps".
    const int d = edit_distance(unknown, k);
    const int name_length = int(last_component(k).size());
    const bool close = d <= std::max(2, name_length / 3) && d < name_length;
    const bool moved = last_component(unknown) == last_component(k);
    if (!close && !moved) continue;
    const int score = close ? d : 1000 + d;  // prefer spelling fixes to relocations
    if (score < best_score) {
      best_score = score;
      best = k;
    }
  }
  return best;
}

struct Unread {
  std::string key;
  const ConfigNode* node;
};

void collect_unread(const ConfigNode& n, const std::string& key, std::vector<Unread>& out) {
  const std::string shown = n.origin_key.empty() ? key : n.origin_key;
  switch (n.kind) {
    case Kind::Null:
    case Kind::Scalar:
      if (!n.used) out.push_back({shown, &n});
      break;
    case Kind::Map:
      if (n.entries.empty() && !n.used && !shown.empty()) out.push_back({shown, &n});
      for (const auto& [name, child] : n.entries) collect_unread(*child, join_key(shown, name), out);
      break;
    case Kind::Sequence: {
      const bool has_leaf = n.items.empty() || std::any_of(n.items.begin(), n.items.end(), [](const auto& i) {
                              return i->kind == Kind::Scalar || i->kind == Kind::Null;
                            });
      if (!n.used && has_leaf) {
        out.push_back({shown, &n});  // a list of values nobody read: report the list once
      } else {
        for (size_t i = 0; i < n.items.size(); ++i)
          if (n.items[i]->kind == Kind::Map || n.items[i]->kind == Kind::Sequence)
            collect_unread(*n.items[i], join_key(shown, std::to_string(i)), out);
      }
      break;
    }
  }
}

void mark_used(ConfigNode& n) {
  n.used = true;
  for (auto& item : n.items) mark_used(*item);
  for (auto& [name, child] : n.entries) mark_used(*child);
}

// Resolves a dotted key. Returns null when absent (a null value on the way counts as an empty
// map); throws when the path runs through a scalar or a list with a non-index. `shown` gets
// the key as the user wrote it (aliased values keep their original name).
ConfigNode* resolve(const ConfigState& st, const std::string& key, std::string* shown = nullptr) {
  ConfigNode* n = st.root.get();
  std::string path;
  for (const std::string& part : split_key(key)) {
    ConfigNode* next = nullptr;
    if (n->kind == Kind::Map) {
      next = n->entry(part);
    } else if (n->kind == Kind::Sequence) {
      auto index = parse_index(part);
      if (!index) throw st.error(*n, path, fmt::format("is a list; cannot look up '{}' in it", part));
      if (*index < n->items.size()) next = n->items[*index].get();
    } else if (n->kind == Kind::Scalar) {
      throw st.error(*n, path, fmt::format("expected a map containing '{}', got {}", part, describe(*n)));
    }
    if (!next) return nullptr;
    n = next;
    path = n->origin_key.empty() ? join_key(path, part) : n->origin_key;
  }
  if (shown) *shown = path;
  return n;
}

// The slot holding `key` in its parent map, creating missing parent maps; for setting values.
std::unique_ptr<ConfigNode>& slot_for(ConfigState& st, const std::string& key, const ConfigNode& like) {
  const std::vector<std::string> parts = split_key(key);
  if (parts.empty()) throw Error("cannot replace the whole configuration");
  ConfigNode* n = st.root.get();
  std::string path;
  for (size_t i = 0;; ++i) {
    const std::string& part = parts[i];
    const bool last = i + 1 == parts.size();
    if (n->kind == Kind::Null) n->kind = Kind::Map;  // `key:` with no value becomes a map
    std::unique_ptr<ConfigNode>* child = nullptr;
    if (n->kind == Kind::Map) {
      for (auto& [k, v] : n->entries)
        if (k == part) child = &v;
      if (!child) {
        auto fresh = std::make_unique<ConfigNode>();
        fresh->kind = last ? Kind::Null : Kind::Map;
        fresh->command_line = like.command_line;
        fresh->line = like.line;
        n->entries.emplace_back(part, std::move(fresh));
        child = &n->entries.back().second;
      }
    } else if (n->kind == Kind::Sequence) {
      auto index = parse_index(part);
      if (!index || *index >= n->items.size())
        throw st.error(*n, path, fmt::format("is a list of {} items; cannot set item '{}'", n->items.size(), part));
      child = &n->items[*index];
    } else {
      throw st.error(*n, path, fmt::format("cannot set '{}' inside {}: not a map", key, describe(*n)));
    }
    if (last) return *child;
    n = child->get();
    path = join_key(path, part);
  }
}

}  // namespace

// ---- ConfigTree --------------------------------------------------------------------------------

ConfigTree::ConfigTree() : state_(std::make_shared<ConfigState>()) {
  state_->root = std::make_unique<ConfigNode>();
  state_->root->kind = Kind::Map;
}

ConfigTree::ConfigTree(std::shared_ptr<ConfigState> state, std::string prefix)
    : state_(std::move(state)), prefix_(std::move(prefix)) {}

ConfigTree ConfigTree::parse(const std::string& yaml_text, const std::string& name) {
  ConfigTree tree;
  ConfigState& st = *tree.state_;
  st.file = name;
  YAML::Node doc;
  try {
    doc = load_yaml(yaml_text);
  } catch (const YAML::Exception& e) {
    ErrorContext ctx;
    ctx.file = name;
    if (!e.mark.is_null()) ctx.line = int64_t(e.mark.line) + 1;
    throw Error(fmt::format("invalid YAML: {}", e.msg), std::move(ctx));
  }
  if (doc.IsNull()) return tree;  // an empty file (or only comments) is an empty config
  size_t values = 0;
  st.root = from_yaml(doc, doc.Mark().is_null() ? 1 : int64_t(doc.Mark().line) + 1, false, st, "", values);
  if (st.root->kind != Kind::Map) {
    ErrorContext ctx;
    ctx.file = name;
    ctx.line = st.root->line;
    throw Error(fmt::format("the top level must be a map of keys, got {}", describe(*st.root)), std::move(ctx));
  }
  return tree;
}

ConfigTree ConfigTree::load(const std::string& path) {
  // A directory opens as an empty stream on Linux; it must not read as an empty config.
  if (std::filesystem::is_directory(path)) throw Error("is a directory, not a config file", file_context(path));
  std::ifstream in(path);
  if (!in) throw Error("cannot open config file", file_context(path));
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

std::string ConfigTree::full_key(const std::string& key) const {
  if (prefix_.empty()) return key;
  return key.empty() ? prefix_ : prefix_ + "." + key;
}

const std::string& ConfigTree::file() const { return state_->file; }

void ConfigTree::apply_override(const std::string& assignment) {
  ConfigNode where;
  where.command_line = true;
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos)
    throw Error(fmt::format("malformed override '{}': expected key=value", assignment),
                file_context("command line"));
  auto trim = [](std::string s) {
    const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  const std::string key = trim(assignment.substr(0, eq));
  const std::string text = assignment.substr(eq + 1);
  if (key.empty())
    throw Error(fmt::format("malformed override '{}': empty key", assignment), file_context("command line"));
  const std::string full = full_key(key);
  split_key(full);  // reject "a..b" before touching the tree
  YAML::Node value;
  try {
    value = load_yaml(text);
  } catch (const YAML::Exception& e) {
    throw state_->error(where, full, fmt::format("invalid value '{}': {}", text, e.msg));
  }
  size_t values = 0;
  slot_for(*state_, full, where) = from_yaml(value, -1, true, *state_, full, values);
}

void ConfigTree::apply_overrides(const std::vector<std::string>& assignments) {
  for (const std::string& a : assignments) apply_override(a);
}

bool ConfigTree::has(const std::string& key) const {
  const std::string full = full_key(key);
  state_->record(full);
  const ConfigNode* n = resolve(*state_, full);
  return n && n->kind != Kind::Null;
}

template <ConfigValue T>
std::optional<T> ConfigTree::get_optional(const std::string& key) const {
  const std::string full = full_key(key);
  state_->record(full);
  std::string shown;
  ConfigNode* n = resolve(*state_, full, &shown);
  if (!n) return std::nullopt;
  n->used = true;
  if (n->kind == Kind::Null) return std::nullopt;
  return to_value<T>(*state_, *n, shown);
}

#define SHARDLM_CONFIG_TYPE(T)                                                                   \
  template std::optional<T> ConfigTree::get_optional<T>(const std::string&) const;               \
  template std::optional<std::vector<T>> ConfigTree::get_optional<std::vector<T>>(const std::string&) const;
SHARDLM_CONFIG_TYPE(bool)
SHARDLM_CONFIG_TYPE(int)
SHARDLM_CONFIG_TYPE(int64_t)
SHARDLM_CONFIG_TYPE(uint64_t)
SHARDLM_CONFIG_TYPE(float)
SHARDLM_CONFIG_TYPE(double)
SHARDLM_CONFIG_TYPE(std::string)
#undef SHARDLM_CONFIG_TYPE

void ConfigTree::throw_missing(const std::string& key) const {
  const std::string full = full_key(key);
  std::string shown;
  if (const ConfigNode* n = resolve(*state_, full, &shown))  // present but null
    throw state_->error(*n, shown, "required key has no value");
  ErrorContext ctx;
  ctx.file = state_->file;
  ctx.key = full;
  throw Error("missing required key", std::move(ctx));
}

ConfigTree ConfigTree::section(const std::string& key) const {
  const std::string full = full_key(key);
  std::string shown;
  if (const ConfigNode* n = resolve(*state_, full, &shown); n && n->kind != Kind::Map && n->kind != Kind::Null)
    throw state_->error(*n, shown, fmt::format("expected a map, got {}", describe(*n)));
  return ConfigTree(state_, full);
}

std::vector<ConfigTree> ConfigTree::sections(const std::string& key) const {
  const std::string full = full_key(key);
  state_->record(full);
  std::string shown;
  ConfigNode* n = resolve(*state_, full, &shown);
  std::vector<ConfigTree> out;
  if (!n || n->kind == Kind::Null) return out;
  if (n->kind != Kind::Sequence) throw state_->error(*n, shown, fmt::format("expected a list of maps, got {}", describe(*n)));
  n->used = true;
  for (size_t i = 0; i < n->items.size(); ++i) {
    const ConfigNode& item = *n->items[i];
    if (item.kind != Kind::Map)
      throw state_->error(item, fmt::format("{}[{}]", shown, i), fmt::format("expected a map, got {}", describe(item)));
    out.push_back(ConfigTree(state_, join_key(full, std::to_string(i))));
  }
  return out;
}

std::vector<std::string> ConfigTree::keys(const std::string& key) const {
  std::string shown;
  const ConfigNode* n = resolve(*state_, full_key(key), &shown);
  std::vector<std::string> out;
  if (!n || n->kind == Kind::Null) return out;
  if (n->kind != Kind::Map) throw state_->error(*n, shown, fmt::format("expected a map, got {}", describe(*n)));
  for (const auto& [name, child] : n->entries) out.push_back(name);
  return out;
}

void ConfigTree::alias(const std::string& from_key, const std::string& to_key) {
  ConfigState& st = *state_;
  const std::string from = full_key(from_key), to = full_key(to_key);
  std::string from_shown, to_shown;
  // A key under a list names nothing to move (`data` written as a list of sources: its items
  // are read, with their own aliases, by whoever reads the list).
  if (const size_t dot = from.rfind('.'); dot != std::string::npos)
    if (const ConfigNode* up = resolve(st, from.substr(0, dot)); up && up->kind == Kind::Sequence) return;
  ConfigNode* src = resolve(st, from, &from_shown);
  if (!src) return;
  ConfigNode* dst = resolve(st, to, &to_shown);
  if (dst && src->command_line == dst->command_line)
    throw st.error(*src, from_shown,
                   fmt::format("is another name for '{}', which is also set at {}; set only one", to_shown,
                               st.source(*dst)));
  if (dst && dst->command_line) {
    // The command line overrides the file: the file's spelling is consumed and dropped.
    mark_used(*src);
    return;
  }
  // Detach the value from its parent map. It keeps its place and name for messages, and the
  // parent is marked read so that emptying it does not make it look like an unused key.
  const size_t dot = from.rfind('.');
  const std::string parent_key = dot == std::string::npos ? "" : from.substr(0, dot);
  ConfigNode* parent = resolve(st, parent_key);
  if (!parent || parent->kind != Kind::Map)
    throw st.error(*src, from_shown, fmt::format("cannot alias '{}': only keys in maps can be aliased", from_shown));
  auto it = std::find_if(parent->entries.begin(), parent->entries.end(),
                         [&](const auto& e) { return e.second.get() == src; });
  std::unique_ptr<ConfigNode> moved = std::move(it->second);
  parent->entries.erase(it);
  parent->used = true;
  if (moved->origin_key.empty()) moved->origin_key = from_shown;
  std::unique_ptr<ConfigNode>& slot = slot_for(st, to, *moved);
  slot = std::move(moved);
}

void ConfigTree::reject_unknown_keys() const {
  const ConfigState& st = *state_;
  std::string shown;
  const ConfigNode* n = resolve(st, prefix_, &shown);
  if (!n) return;
  std::vector<Unread> unread;
  collect_unread(*n, shown, unread);
  if (unread.empty()) return;
  // File order first (by line; the walk already orders keys on one line), then the command line.
  auto first = std::min_element(unread.begin(), unread.end(), [](const Unread& a, const Unread& b) {
    if (a.node->command_line != b.node->command_line) return !a.node->command_line;
    return a.node->line < b.node->line;
  });
  std::string message = "unknown key";
  if (auto s = suggest(first->key, st.requested)) message += fmt::format("; did you mean '{}'?", *s);
  throw st.error(*first->node, first->key, message);
}

void ConfigTree::set_from(const std::string& key, const std::string& value, const ConfigTree& from,
                          const std::string& from_key) {
  std::string shown;
  const ConfigNode* src = resolve(*from.state_, from.full_key(from_key), &shown);
  if (!src) throw Error(fmt::format("set_from: '{}' is not set", from.full_key(from_key)));
  const std::string full = full_key(key);
  YAML::Node y;
  try {
    y = load_yaml(value);
  } catch (const YAML::Exception& e) {
    throw from.state_->error(*src, shown, fmt::format("invalid value '{}': {}", value, e.msg));
  }
  size_t values = 0;
  std::unique_ptr<ConfigNode> n = from_yaml(y, src->line, src->command_line, *state_, full, values);
  // Every node of the value (a list's items too) is placed where `from_key` was written.
  const std::string file = from.state_->file_of(*src);
  const auto place = [&](auto&& self, ConfigNode& m) -> void {
    m.file = file;
    m.line = src->line;
    for (auto& item : m.items) self(self, *item);
    for (auto& [name, child] : m.entries) self(self, *child);
  };
  place(place, *n);
  n->origin_key = shown;
  std::unique_ptr<ConfigNode>& slot = slot_for(*state_, full, *n);
  slot = std::move(n);
}

std::vector<std::string> ConfigTree::unread_keys() const {
  std::string shown;
  const ConfigNode* n = resolve(*state_, prefix_, &shown);
  std::vector<std::string> out;
  if (!n) return out;
  std::vector<Unread> unread;
  collect_unread(*n, shown, unread);
  for (const Unread& u : unread) out.push_back(u.key);
  return out;
}

void ConfigTree::mark_read(const std::string& key) {
  if (ConfigNode* n = resolve(*state_, full_key(key))) mark_used(*n);
}

std::string ConfigTree::source_of(const std::string& key) const {
  const ConfigNode* n = resolve(*state_, full_key(key));
  return n ? state_->source(*n) : "default";
}

Error ConfigTree::error_at(const std::string& key, std::string message) const {
  const std::string full = full_key(key);
  std::string shown;
  if (const ConfigNode* n = resolve(*state_, full, &shown)) return state_->error(*n, shown, std::move(message));
  ErrorContext ctx;
  ctx.file = state_->file;
  ctx.key = full;
  return Error(std::move(message), std::move(ctx));
}

}  // namespace shardlm
