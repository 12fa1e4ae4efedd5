#include "config/render.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace strata::config {

std::string json_quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string render(bool value) {
  return value ? "true" : "false";
}
std::string render(std::int64_t value) {
  return std::to_string(value);
}
std::string render(std::uint64_t value) {
  return std::to_string(value);
}

std::string render(double value) {
  if (!std::isfinite(value)) return "null";
  // Shortest text that reads back as the same double; whole numbers keep a ".0" so they read
  // back as reals, not integers.
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

std::string render(const std::string& value) {
  return json_quote(value);
}

std::string render(const std::vector<std::string>& paths) {
  if (paths.empty()) return "null";
  if (paths.size() == 1) return json_quote(paths[0]);
  std::string out = "[";
  for (std::size_t i = 0; i < paths.size(); ++i) {
    out += (i == 0 ? "" : ", ") + json_quote(paths[i]);
  }
  return out + "]";
}

std::string render(const std::array<double, 2>& pair) {
  return fmt::format("[{}, {}]", render(pair[0]), render(pair[1]));
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Optimal string alignment: insertions, deletions, substitutions and swaps of neighbours
  // ("stgae" is one edit from "stage").
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i)
    d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j)
    d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::size_t suggestion_distance_max(std::size_t length) {
  if (length <= 5) return 1;
  if (length <= 10) return 2;
  return 3;
}

}  // namespace strata::config
