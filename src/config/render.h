// How configuration values look in JSON text: shared by the effective-config writer and by the
// loader's notes ("auto -> 0.001"), so a value is shown the same way everywhere.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/schema.h"

namespace strata::config {

std::string json_quote(std::string_view text);
std::string render(bool value);
std::string render(std::int64_t value);
std::string render(std::uint64_t value);
std::string render(double value);
std::string render(const std::string& value);
std::string render(const std::vector<std::string>& paths);  // null, "a" or ["a", "b"]
std::string render(const std::array<double, 2>& pair);

template <typename E>
std::string render_choice(E value, const EnumNames<E>& names) {
  for (const auto& [v, name] : names) {
    if (v == value) return json_quote(name);
  }
  return "null";
}

// Levenshtein distance, for "did you mean" suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The largest edit distance at which a key of `length` characters gets a "did you mean".
std::size_t suggestion_distance_max(std::size_t length);

}  // namespace strata::config

namespace strata::config {

// The value of one key path of `config` as the effective configuration prints it ("" when the
// path is not a key Strata acts on).
std::string render_path(const Config& config, const std::string& path);

}  // namespace strata::config
