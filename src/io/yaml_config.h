// A strict reader of YAML run configurations (`shardlm train --config run.yaml lr=3e-4 ...`).
//
// Strict because a typo in a config must not silently train with a default: every key a
// command reads is recorded, and reject_unknown_keys() then fails on the first key of the file
// nobody read, with a suggestion:
//   "run.yaml:7: key 'gradient_accumulation_step': unknown key; did you mean 'gradient_accumulation_steps'?"
// Type errors name the place the value was written:
//   "run.yaml:3: key 'micro_batch_size': expected an integer, got 'eight'"
//   "command line: key 'lr': expected a number, got 'fast'"
//
// Keys are dotted paths: "optimizer.lr" is `lr` inside the map `optimizer`, "datasets.0.path"
// is `path` in the first item of the list `datasets`. A YAML null (`key:` or `key: ~`) reads
// as "not set". Enumerations are read as strings and checked by the caller, which can report
// problems at the value's place with error_at().
//
// Usage:
//   ConfigTree cfg = ConfigTree::load(path);
//   cfg.apply_overrides(args);                       // "a.b=value", value in YAML syntax
//   cfg.alias("fsdp_config.fsdp_sharding_strategy", "sharding_strategy");
//   int64_t mbs = cfg.get<int64_t>("micro_batch_size", 1);
//   double lr = cfg.require<double>("optimizer.lr");
//   auto betas = cfg.get<std::vector<double>>("optimizer.betas", {0.9, 0.999});
//   ConfigTree data = cfg.section("data");           // data.get<std::string>("path", "")
//   cfg.reject_unknown_keys();
//
// A ConfigTree is a handle: copies and sections share one tree and one record of reads.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace shardlm {

namespace detail {
struct ConfigState;
template <class T>
struct ConfigVector : std::false_type {};
template <class T>
struct ConfigVector<std::vector<T>> : std::true_type {
  using element = T;
};
}  // namespace detail

// The types a config value can be read as.
template <class T>
concept ConfigScalar = std::same_as<T, bool> || std::same_as<T, int> || std::same_as<T, int64_t> ||
                       std::same_as<T, uint64_t> || std::same_as<T, float> || std::same_as<T, double> ||
                       std::same_as<T, std::string>;
template <class T>
concept ConfigValue =
    ConfigScalar<T> || (detail::ConfigVector<T>::value && ConfigScalar<typename detail::ConfigVector<T>::element>);

class ConfigTree {
 public:
  ConfigTree();  // an empty configuration, as from an empty file

  // Parse errors and a top level that is not a map throw Error with file and line.
  static ConfigTree load(const std::string& path);
  // `name` stands in for the file name in messages.
  static ConfigTree parse(const std::string& yaml_text, const std::string& name = "<string>");

  // "a.b.c=value": sets the key, creating it (and its parent maps) when absent. The value is
  // YAML: "3e-4", "FULL_SHARD", "[0.9, 0.95]", "{lr: 1e-3}". Malformed input throws.
  void apply_override(const std::string& assignment);
  void apply_overrides(const std::vector<std::string>& assignments);

  // Readers. Each records the key as known to this program (for reject_unknown_keys).
  bool has(const std::string& key) const;  // present and not null
  template <ConfigValue T>
  std::optional<T> get_optional(const std::string& key) const;
  template <ConfigValue T>
  T get(const std::string& key, T default_value) const {
    std::optional<T> v = get_optional<T>(key);
    return v ? std::move(*v) : std::move(default_value);
  }
  std::string get(const std::string& key, const char* default_value) const {
    return get<std::string>(key, std::string(default_value));
  }
  template <ConfigValue T>
  T require(const std::string& key) const {
    std::optional<T> v = get_optional<T>(key);
    if (!v) throw_missing(key);
    return std::move(*v);
  }

  // A view of the map at `key` (empty when absent); its keys are relative to it.
  ConfigTree section(const std::string& key) const;
  // Views of the maps in the list at `key` ("datasets.0", "datasets.1", ...); empty when absent.
  std::vector<ConfigTree> sections(const std::string& key) const;
  // The keys of the map at `key` ("" = this section), in file order. Does not mark them read.
  std::vector<std::string> keys(const std::string& key = "") const;

  // Lets `from_key` be written for `to_key` (e.g. accelerate's fsdp_config.fsdp_sharding_strategy
  // for sharding_strategy): moves the value, which keeps its original place for messages. Both
  // set: an Error, unless exactly one comes from the command line, which then wins.
  void alias(const std::string& from_key, const std::string& to_key);

  // Sets `key` to the scalar `value` as if it had been written where `from_key` of the tree `from`
  // was (its file, line and name in messages): how another file's settings (a DeepSpeed JSON)
  // become this tree's keys, so that errors in them name the file the user wrote.
  void set_from(const std::string& key, const std::string& value, const ConfigTree& from, const std::string& from_key);
  // The keys of this section no reader asked for, in file order (what reject_unknown_keys would
  // report first); mark_read(key) then marks a key and everything under it as read.
  std::vector<std::string> unread_keys() const;
  void mark_read(const std::string& key);

  // Throws for the first key (in file order, then command line) of this section that no reader
  // asked for, suggesting the nearest key that was asked for.
  void reject_unknown_keys() const;

  // "FILE:LINE", "command line", or "default" when the key is absent.
  std::string source_of(const std::string& key) const;
  // An Error located at the key's value (file, line and key as the user wrote it).
  Error error_at(const std::string& key, std::string message) const;
  // The loaded file ("" for ConfigTree()), and this view's key prefix ("" at the top).
  const std::string& file() const;
  const std::string& prefix() const { return prefix_; }

 private:
  ConfigTree(std::shared_ptr<detail::ConfigState> state, std::string prefix);
  std::string full_key(const std::string& key) const;
  [[noreturn]] void throw_missing(const std::string& key) const;

  std::shared_ptr<detail::ConfigState> state_;
  std::string prefix_;
};

// Levenshtein distance (insertions, deletions, substitutions), for "did you mean" suggestions.
int edit_distance(const std::string& a, const std::string& b);

}  // namespace shardlm
