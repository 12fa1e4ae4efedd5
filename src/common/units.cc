#include "common/units.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

namespace strata {

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < kKiB) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  if (value >= 100.0) return fmt::format("{:.0f} {}", value, kNames[unit]);
  if (value >= 10.0) return fmt::format("{:.1f} {}", value, kNames[unit]);
  return fmt::format("{:.2f} {}", value, kNames[unit]);
}

namespace {

// A non-negative number ("5", "1.5", "5e8") and the lower-cased suffix after it, spaces removed.
struct NumberText {
  double value = 0;
  std::string suffix;
};

std::optional<NumberText> split_number(std::string_view text) {
  std::string s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.pop_back();
  std::size_t start = 0;
  while (start < s.size() && std::isspace(static_cast<unsigned char>(s[start])))
    ++start;
  s = s.substr(start);
  if (s.empty() || s[0] == '-' || s[0] == '+') return std::nullopt;

  // Split the number from the suffix. An 'e' followed by a digit belongs to the number.
  std::size_t pos = 0;
  while (pos < s.size()) {
    char c = s[pos];
    bool exponent = (c == 'e' || c == 'E') && pos + 1 < s.size() &&
                    (std::isdigit(static_cast<unsigned char>(s[pos + 1])) || s[pos + 1] == '+');
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.' || exponent ||
        ((c == '+') && pos > 0 && (s[pos - 1] == 'e' || s[pos - 1] == 'E'))) {
      ++pos;
    } else {
      break;
    }
  }
  if (pos == 0) return std::nullopt;
  std::string number = s.substr(0, pos);
  NumberText out;
  for (std::size_t i = pos; i < s.size(); ++i) {
    if (!std::isspace(static_cast<unsigned char>(s[i]))) {
      out.suffix += static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
    }
  }
  char* end = nullptr;
  out.value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(out.value) || out.value < 0) {
    return std::nullopt;
  }
  return out;
}

// value * multiplier as a whole uint64, or nullopt when it is fractional or too large.
std::optional<std::uint64_t> whole(double value, double multiplier) {
  double product = value * multiplier;
  if (product >= 18446744073709551615.0 || product != std::floor(product)) return std::nullopt;
  return static_cast<std::uint64_t>(product);
}

}  // namespace

std::optional<std::uint64_t> parse_bytes(std::string_view text) {
  std::optional<NumberText> n = split_number(text);
  if (!n) return std::nullopt;
  const std::string& suffix = n->suffix;
  double multiplier = 1.0;
  if (suffix.empty() || suffix == "b") {
    multiplier = 1.0;
  } else if (suffix == "k" || suffix == "kib") {
    multiplier = static_cast<double>(kKiB);
  } else if (suffix == "m" || suffix == "mib") {
    multiplier = static_cast<double>(kMiB);
  } else if (suffix == "g" || suffix == "gib") {
    multiplier = static_cast<double>(kGiB);
  } else if (suffix == "t" || suffix == "tib") {
    multiplier = static_cast<double>(kTiB);
  } else if (suffix == "kb") {
    multiplier = 1e3;
  } else if (suffix == "mb") {
    multiplier = 1e6;
  } else if (suffix == "gb") {
    multiplier = 1e9;
  } else if (suffix == "tb") {
    multiplier = 1e12;
  } else {
    return std::nullopt;
  }
  return whole(n->value, multiplier);
}

std::optional<std::uint64_t> parse_count(std::string_view text) {
  std::optional<NumberText> n = split_number(text);
  if (!n) return std::nullopt;
  const std::string& suffix = n->suffix;
  double multiplier = 1.0;
  if (suffix.empty()) {
    multiplier = 1.0;
  } else if (suffix == "k") {
    multiplier = 1e3;
  } else if (suffix == "m") {
    multiplier = 1e6;
  } else if (suffix == "b" || suffix == "g") {
    multiplier = 1e9;
  } else if (suffix == "t") {
    multiplier = 1e12;
  } else {
    return std::nullopt;
  }
  return whole(n->value, multiplier);
}

}  // namespace strata
