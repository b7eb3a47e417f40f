// Enumerations read and written by name (configuration values): specialize EnumNames for an enum
// and enum_name / parse_enum / enum_choices work for it. Specializations live beside their enum,
// in namespace shardlm.
#pragma once

#include <cstddef>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace shardlm {

// Specialize for an enum read from a config: `values` pairs each enumerator with its spelling.
//   template <> struct EnumNames<ProgressMode> {
//     static constexpr std::pair<ProgressMode, const char*> values[] = {{ProgressMode::Auto, "auto"}, ...};
//   };
template <class E>
struct EnumNames;

template <class E>
concept NamedEnum = std::is_enum_v<E> && requires { EnumNames<E>::values; };

template <NamedEnum E>
std::string_view enum_name(E e) {
  for (const auto& [value, name] : EnumNames<E>::values)
    if (value == e) return name;
  return "?";
}

template <NamedEnum E>
std::optional<E> parse_enum(std::string_view s) {
  for (const auto& [value, name] : EnumNames<E>::values)
    if (s == name) return value;
  return std::nullopt;
}

// "a, b or c": the accepted spellings, for messages.
template <NamedEnum E>
std::string enum_choices() {
  std::string out;
  const size_t n = std::size(EnumNames<E>::values);
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out += i + 1 == n ? " or " : ", ";
    out += EnumNames<E>::values[i].second;
  }
  return out;
}

// A config enum compares equal to its spelling, so `c.data.on_bad_row == "skip"` still reads as it
// did when these values were kept as strings. (For enums of other namespaces, bring it into theirs
// with a using-declaration so that argument-dependent lookup finds it.)
template <NamedEnum E>
bool operator==(E e, std::string_view name) {
  return enum_name(e) == name;
}

}  // namespace shardlm
