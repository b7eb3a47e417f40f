// Configurations read through a table of fields.
//
// A config struct (TrainConfig, shard::ShardingConfig) is read from a ConfigTree by walking a table
// with one entry per YAML key (train_config_fields(), sharding_config_fields()):
//
//   key       the dotted key, from the top of the file: "data.eval_fraction"
//   aliases   other keys that mean the same (accelerate's fsdp_config names, Hugging Face
//             Trainer's, a key's older name); ConfigTree::alias moves them onto the key first
//   member    what the value sets
//   default   the member's initializer in the struct: an absent (or null) key leaves it as it is,
//             so code that builds a config directly and a config file agree on every default
//   check     what the value must satisfy, as a message naming the rule when it does not
//   doc       one line; docs/training.md has the full entry (a test checks it names every key)
//
// Reading a key is what records it as known to the tree, so the same table decides which keys of
// a file are unknown (ConfigTree::reject_unknown_keys: an error naming file, line and key, with
// the nearest known key). Enumerations are parsed into their C++ enum as they are read; a value
// outside the enum is an error listing the accepted ones ("expected fail or skip, got 'ignore'").
//
// A field usually reads one value of its member's type and checks it:
//   F::field("seq_len", &TrainConfig::seq_len, "tokens per row", positive)
// Values given as text with a parser of their own (dtypes, sizes, FSDP's names):
//   F::parsed("save_dtype", &TrainConfig::save_dtype, float_dtype, "how the trained weights are written")
// Values with several forms (true/false or a number; a scalar or a map) are read by a function
// of their own (F::custom). Rules between keys (offload needs device: cuda) are checked after the
// whole table has been read, by the reader that owns the table.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <concepts>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/enum_names.h"
#include "io/yaml_config.h"

namespace shardlm::train {

// Enumerations are read by name (core/enum_names.h); a config enum compares equal to its spelling.
using shardlm::operator==;

// ---- the table ------------------------------------------------------------------------------------

template <class Config>
struct ConfigField {
  std::string key;
  std::vector<std::string> aliases;
  std::string doc;
  // Reads `key` (the field's key; nested() passes it with the section's prefix) if present, checks
  // the value and sets the member. Errors name the value's file, line and key. `c` already holds
  // the fields above this one in the table, for the few values whose meaning depends on them.
  std::function<void(const ConfigTree& tree, const std::string& key, Config& c)> read;

  // Another key accepted for this one: `F::field(...).alias("save_steps")`.
  ConfigField alias(std::string other) && {
    aliases.push_back(std::move(other));
    return std::move(*this);
  }
};

// The check of a field that accepts any value of its type.
struct NoCheck {
  template <class T>
  std::string operator()(const T&) const {
    return {};
  }
};

// Checks used by several fields: each returns "" when the value is fine, else the message.
inline constexpr auto positive = [](const auto& v) -> std::string {
  return v > 0 ? std::string() : fmt::format("must be positive, got {}", v);
};
// 1 <= v <= most: a count that sizes buffers or loops (rows, tokens, micro-batches). Past any real
// run's value it is refused by name here, not later as "cannot create std::vector larger than
// max_size()" or an allocation of petabytes (issue 30).
inline auto positive_at_most(int64_t most) {
  return [most](const auto& v) -> std::string {
    if (std::string message = positive(v); !message.empty()) return message;
    return v <= most ? std::string() : fmt::format("must be at most {}, got {}", most, v);
  };
}
// v >= 0, else `message` (which says what 0 means for the key).
inline auto non_negative(std::string message) {
  return [message = std::move(message)](const auto& v) -> std::string { return v >= 0 ? std::string() : message; };
}

namespace detail {
template <class T>
struct Optional {
  using value = T;
};
template <class T>
struct Optional<std::optional<T>> {
  using value = T;
};

// Errors in a key inside a section name the section first when the section itself is not a map
// (`data: x.txt` is reported at `data`, not at `data.type`).
inline void check_parent_section(const ConfigTree& t, const std::string& key) {
  if (const size_t dot = key.rfind('.'); dot != std::string::npos) (void)t.section(key.substr(0, dot));
}

// The value at `key` as T: one of ConfigTree's types, or an enum by its spelling.
template <class T>
std::optional<T> read_value(const ConfigTree& t, const std::string& key) {
  if constexpr (NamedEnum<T>) {
    const std::optional<std::string> s = t.get_optional<std::string>(key);
    if (!s) return std::nullopt;
    if (std::optional<T> v = parse_enum<T>(*s)) return v;
    throw t.error_at(key, fmt::format("expected {}, got '{}'", enum_choices<T>(), *s));
  } else {
    return t.get_optional<T>(key);
  }
}

// "" when v (or each of its numbers) is finite. An infinity is no value any key means: an lr of
// .inf trained a model of NaN and exited 0 (issue 30).
template <class T>
std::string finite(const T& v) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isfinite(v) ? std::string() : fmt::format("expected a finite number, got {}", v);
  } else if constexpr (requires(const T& c) {
                         requires std::is_floating_point_v<typename T::value_type>;
                         c.begin();
                       }) {
    for (const auto& x : v)
      if (std::string message = finite(x); !message.empty()) return message;
    return {};
  } else {
    return {};
  }
}

// The key's own rule first (its message says what the key needs), then, unless `any_number`,
// finiteness for every number. A setter's value goes to a struct whose own validation names the
// rule for it (lora.alpha: "must be a positive number, got inf"), so setters pass any_number.
template <class T, class Check>
void check_value(const ConfigTree& t, const std::string& key, const T& v, const Check& check,
                 bool any_number = false) {
  if (std::string message = check(v); !message.empty()) throw t.error_at(key, std::move(message));
  if (any_number) return;
  if (std::string message = finite(v); !message.empty()) throw t.error_at(key, std::move(message));
}
}  // namespace detail

// Builders of table entries for one config struct: `using F = ConfigFields<TrainConfig>;`.
template <class Config>
struct ConfigFields {
  using Field = ConfigField<Config>;

  // A value of the member's type (std::optional<T>: a T, unset when absent), checked by `check`.
  template <class M, class Check = NoCheck>
  static Field field(std::string key, M Config::*member, std::string doc, Check check = {}) {
    using T = typename detail::Optional<M>::value;
    return {std::move(key), {}, std::move(doc), [member, check](const ConfigTree& t, const std::string& k, Config& c) {
              detail::check_parent_section(t, k);
              if (std::optional<T> v = detail::read_value<T>(t, k)) {
                detail::check_value(t, k, *v, check);
                c.*member = std::move(*v);
              }
            }};
  }

  // A value that must be given ("missing required key" otherwise).
  template <class M, class Check = NoCheck>
  static Field required(std::string key, M Config::*member, std::string doc, Check check = {}) {
    return {std::move(key), {}, std::move(doc), [member, check](const ConfigTree& t, const std::string& k, Config& c) {
              detail::check_parent_section(t, k);
              M v = t.require<M>(k);
              detail::check_value(t, k, v, check);
              c.*member = std::move(v);
            }};
  }

  // A string turned into the member's value by `parse`, which throws Error with the reason (the
  // message is then placed at the key).
  template <class M, class Parse, class Check = NoCheck>
  static Field parsed(std::string key, M Config::*member, Parse parse, std::string doc, Check check = {}) {
    return parsed_set(
        std::move(key), parse, [member](const ConfigTree&, const std::string&, Config& c, M v) { c.*member = std::move(v); },
        std::move(doc), check);
  }

  // The same, with the value handed to set(tree, key, config, value), for a key whose value lives
  // elsewhere or must agree with another key (compute_dtype and mixed_precision).
  template <class Parse, class Set, class Check = NoCheck>
  static Field parsed_set(std::string key, Parse parse, Set set, std::string doc, Check check = {}) {
    return {std::move(key), {}, std::move(doc),
            [parse, set, check](const ConfigTree& t, const std::string& k, Config& c) {
              detail::check_parent_section(t, k);
              const std::optional<std::string> s = t.get_optional<std::string>(k);
              if (!s) return;
              decltype(parse(*s)) v;
              try {
                v = parse(*s);
              } catch (const Error& e) {
                throw t.error_at(k, e.message());
              }
              detail::check_value(t, k, v, check);
              set(t, k, c, std::move(v));
            }};
  }

  // A value of type T handed to `set(config, value)`, for a key that sets several members or
  // one in another form (betas -> beta1 and beta2; no_sync -> !reduce_every_microbatch).
  template <class T, class Set, class Check = NoCheck>
  static Field setter(std::string key, Set set, std::string doc, Check check = {}) {
    return {std::move(key), {}, std::move(doc), [set, check](const ConfigTree& t, const std::string& k, Config& c) {
              detail::check_parent_section(t, k);
              if (std::optional<T> v = detail::read_value<T>(t, k)) {
                detail::check_value(t, k, *v, check, /*any_number=*/true);
                set(c, std::move(*v));
              }
            }};
  }

  // A key accepted, type-checked and ignored: it describes something shardlm decides itself
  // (accelerate's launch settings) or already does (fsdp_sync_module_states).
  template <class T, class Check = NoCheck>
  static Field ignored(std::string key, std::string doc, Check check = {}) {
    return {std::move(key), {}, std::move(doc), [check](const ConfigTree& t, const std::string& k, Config&) {
              detail::check_parent_section(t, k);
              if (std::optional<T> v = detail::read_value<T>(t, k)) detail::check_value(t, k, *v, check);
            }};
  }

  // A value read by its own function `read(tree, key, config)`, for values with several forms.
  template <class Read>
  static Field custom(std::string key, Read read, std::string doc) {
    return {std::move(key), {}, std::move(doc), std::move(read)};
  }
};

// The fields of a member struct as fields of the outer one, their keys under `prefix` ("data" ->
// "data.type"; "" keeps them at the top level).
template <class Outer, class Inner>
std::vector<ConfigField<Outer>> nested(const std::string& prefix, Inner Outer::*member,
                                       const std::vector<ConfigField<Inner>>& fields) {
  auto under = [&](const std::string& key) { return prefix.empty() ? key : prefix + "." + key; };
  std::vector<ConfigField<Outer>> out;
  for (const ConfigField<Inner>& f : fields) {
    ConfigField<Outer> g{under(f.key), {}, f.doc,
                         [member, read = f.read](const ConfigTree& t, const std::string& k, Outer& c) {
                           read(t, k, c.*member);
                         }};
    for (const std::string& a : f.aliases) g.aliases.push_back(under(a));
    out.push_back(std::move(g));
  }
  return out;
}

// Reads every field of `table` into `c`: aliases first (so a value written under any name is
// found under the key), then the fields in table order. Unknown keys are left for the caller's
// reject_unknown_keys(), after its rules between keys.
template <class Config>
void read_fields(const std::vector<ConfigField<Config>>& table, ConfigTree& tree, Config& c) {
  for (const ConfigField<Config>& f : table)
    for (const std::string& a : f.aliases) tree.alias(a, f.key);
  for (const ConfigField<Config>& f : table) f.read(tree, f.key, c);
}

}  // namespace shardlm::train
