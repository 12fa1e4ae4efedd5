#include "config/report.h"

#include <fmt/format.h>

#include <algorithm>

namespace strata::config {

const char* to_string(KeyUse use) {
  switch (use) {
    case KeyUse::kUsed:
      return "used";
    case KeyUse::kNoEffect:
      return "no effect";
    case KeyUse::kRefused:
      return "refused";
    case KeyUse::kInvalid:
      return "error";
  }
  return "?";
}

std::string format_notes(const Loaded& loaded) {
  std::string out;
  for (const Note& note : loaded.notes) {
    out += fmt::format("strata: {}: {}: {}\n",
                       note.severity == Severity::kWarning ? "warning" : "note", note.path,
                       note.message);
  }
  return out;
}

std::string format_autos(const Loaded& loaded) {
  if (loaded.autos.empty()) return "";
  std::size_t width = 0;
  for (const AutoChoice& a : loaded.autos)
    width = std::max(width, a.path.size() + 3 + a.value.size());
  std::string out =
      "strata: warning: the config leaves these to \"auto\"; Strata chose (docs/config.md, "
      "\"auto\"):\n";
  for (const AutoChoice& a : loaded.autos) {
    const std::string assignment = a.path + " = " + a.value;
    out += fmt::format("strata:   {:<{}}  {}\n", assignment, width, a.reason);
  }
  return out;
}

std::string format_key_report(const Loaded& loaded, const std::string& file, std::size_t rows_max) {
  std::size_t width = 3;
  for (std::size_t i = 0; i < loaded.keys.size() && i < rows_max; ++i)
    width = std::max(width, loaded.keys[i].path.size());
  width = std::min<std::size_t>(width, 60);
  std::string out = fmt::format("strata: what Strata does with each key of {}:\n", file);
  out += fmt::format("  {:<{}}  {:<9}  {}\n", "KEY", width, "STRATA", "DETAIL");
  std::size_t counts[4] = {0, 0, 0, 0};
  for (std::size_t i = 0; i < loaded.keys.size(); ++i) {
    const KeyReport& key = loaded.keys[i];
    ++counts[static_cast<int>(key.use)];
    if (i >= rows_max) continue;
    std::string detail = key.detail;
    if (key.origin.rfind("--", 0) == 0)
      detail += (detail.empty() ? "" : "; ") + ("from " + key.origin);
    out += fmt::format("  {:<{}}  {:<9}  {}\n", key.path, width, to_string(key.use), detail);
  }
  if (loaded.keys.size() > rows_max) {
    out += fmt::format("  ... and {} more keys (not listed)\n", loaded.keys.size() - rows_max);
  }
  out += fmt::format("strata: {} keys: {} used, {} with no effect, {} refused, {} errors\n",
                     loaded.keys.size(), counts[0], counts[1], counts[2], counts[3]);
  return out;
}

}  // namespace strata::config
