#include "config/reader.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>

#include "common/units.h"

namespace strata::config {

std::string Reader::child_path(const char* key) const {
  const std::string& parent = frames_.back().path;
  return parent.empty() ? std::string(key) : parent + "." + key;
}

const Json::Value* Reader::take(const char* key, bool used) {
  Frame& frame = frames_.back();
  frame.known.insert(key);
  if (used) frame.used.push_back(key);
  if (!frame.object->isMember(key)) return nullptr;
  return &(*frame.object)[key];
}

void Reader::fail(const Json::Value& value, const char* key, const std::string& message) {
  std::string path = child_path(key);
  errors_->push_back(source_.locate(value, path) + ": " + path + ": " + message);
}

bool Reader::is_auto(const Json::Value& value, const char* key, const std::string& resolved) {
  if (!value.isString() || value.asString() != "auto") return false;
  notes_->push_back({child_path(key), "\"auto\" resolved to Strata's default " + resolved});
  return true;
}

std::string Reader::describe(const Json::Value& value) {
  switch (value.type()) {
    case Json::nullValue:
      return "null";
    case Json::booleanValue:
      return value.asBool() ? "true" : "false";
    case Json::stringValue:
      return "the string " + json_quote(value.asString());
    case Json::arrayValue:
      return "a list";
    case Json::objectValue:
      return "a section {...}";
    case Json::intValue:
    case Json::uintValue:
    case Json::realValue: {
      std::string text = value.toStyledString();
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
        text.pop_back();
      }
      return text;
    }
  }
  return "a value";
}

bool Reader::equals_ignore_case(const std::string& a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

bool Reader::whole_number(const Json::Value& value, long double* out) {
  if (value.isInt64()) {
    *out = static_cast<long double>(value.asInt64());
    return true;
  }
  if (value.isUInt64()) {
    *out = static_cast<long double>(value.asUInt64());
    return true;
  }
  if (value.isDouble()) {
    double d = value.asDouble();
    if (!std::isfinite(d) || d != std::floor(d)) return false;
    *out = static_cast<long double>(d);
    return true;
  }
  return false;
}

void Reader::boolean(const char* key, bool& out) {
  const Json::Value* value = take(key);
  if (value == nullptr || is_auto(*value, key, render(out))) return;
  if (!value->isBool()) {
    fail(*value, key, "expected true or false, got " + describe(*value));
    return;
  }
  out = value->asBool();
}

void Reader::optional_boolean(const char* key, std::optional<bool>& out) {
  const Json::Value* value = take(key);
  if (value == nullptr || value->isNull()) return;
  if (is_auto(*value, key, "(decided by the stage)")) return;
  if (!value->isBool()) {
    fail(*value, key, "expected true or false, got " + describe(*value));
    return;
  }
  out = value->asBool();
}

void Reader::integer(const char* key, std::int64_t& out, std::int64_t lo, std::int64_t hi) {
  const Json::Value* value = take(key);
  if (value == nullptr || is_auto(*value, key, render(out))) return;
  long double number = 0;
  if (!value->isNumeric() || value->isBool() || !whole_number(*value, &number)) {
    fail(*value, key, "expected a whole number, got " + describe(*value));
    return;
  }
  if (number < static_cast<long double>(lo) || number > static_cast<long double>(hi)) {
    std::string range =
        hi == kIntMax ? fmt::format("at least {}", lo) : fmt::format("from {} to {}", lo, hi);
    fail(*value, key, fmt::format("{} is out of range; valid: {}", describe(*value), range));
    return;
  }
  out = static_cast<std::int64_t>(number);
}

void Reader::count(const char* key, std::uint64_t& out, std::uint64_t lo, std::uint64_t hi,
                   std::uint64_t multiple) {
  const Json::Value* value = take(key);
  if (value == nullptr || is_auto(*value, key, render(out))) return;
  long double number = 0;
  if (!value->isNumeric() || value->isBool() || !whole_number(*value, &number)) {
    fail(*value, key, "expected a whole number, got " + describe(*value));
    return;
  }
  if (number < static_cast<long double>(lo) || number > static_cast<long double>(hi)) {
    std::string range =
        hi >= kCountMax ? fmt::format("at least {}", lo) : fmt::format("from {} to {}", lo, hi);
    fail(*value, key, fmt::format("{} is out of range; valid: {}", describe(*value), range));
    return;
  }
  auto whole = static_cast<std::uint64_t>(number);
  if (whole % multiple != 0) {
    fail(*value, key,
         fmt::format("{} is not a multiple of {}; valid: a multiple of {} such as {}", whole,
                     multiple, multiple, align_up(whole, multiple)));
    return;
  }
  out = whole;
}

void Reader::bytes(const char* key, std::uint64_t& out) {
  const Json::Value* value = take(key);
  if (value == nullptr || is_auto(*value, key, render(out))) return;
  if (value->isString()) {
    std::optional<std::uint64_t> parsed = parse_bytes(value->asString());
    if (!parsed) {
      fail(*value, key,
           describe(*value) +
               " is not a byte count; valid: a whole number of bytes or a number "
               "with a unit such as \"24GiB\", \"512MiB\", \"2TB\"");
      return;
    }
    out = *parsed;
    return;
  }
  long double number = 0;
  if (!value->isNumeric() || value->isBool() || !whole_number(*value, &number) || number < 0 ||
      number > 1.8e19L) {
    fail(*value, key,
         "expected a byte count (a whole number ≥ 0 or a string such as \"24GiB\"), got " +
             describe(*value));
    return;
  }
  out = static_cast<std::uint64_t>(number);
}

void Reader::real(const char* key, double& out, double lo, double hi, bool lo_open) {
  const Json::Value* value = take(key);
  if (value == nullptr || is_auto(*value, key, render(out))) return;
  if (!value->isNumeric() || value->isBool()) {
    fail(*value, key, "expected a number, got " + describe(*value));
    return;
  }
  double number = value->asDouble();
  bool below = lo_open ? !(number > lo) : !(number >= lo);
  if (below || number > hi || !std::isfinite(number)) {
    std::string range;
    if (hi >= kHuge) {
      range = lo_open ? fmt::format("greater than {}", lo) : fmt::format("at least {}", lo);
    } else {
      range = fmt::format("from {} ({}) to {} (inclusive)", lo, lo_open ? "exclusive" : "inclusive",
                          hi);
    }
    fail(*value, key, fmt::format("{} is out of range; valid: {}", describe(*value), range));
    return;
  }
  out = number;
}

void Reader::text(const char* key, std::string& out) {
  const Json::Value* value = take(key);
  if (value == nullptr || value->isNull()) return;
  if (!value->isString()) {
    fail(*value, key, "expected a string, got " + describe(*value));
    return;
  }
  out = value->asString();
}

void Reader::paths(const char* key, std::vector<std::string>& out) {
  const Json::Value* value = take(key);
  if (value == nullptr || value->isNull()) return;
  std::vector<std::string> result;
  if (value->isString()) {
    result.push_back(value->asString());
  } else if (value->isArray()) {
    for (const Json::Value& item : *value) {
      if (!item.isString()) {
        fail(*value, key,
             "expected a path or a list of paths, but the list holds " + describe(item));
        return;
      }
      result.push_back(item.asString());
    }
  } else {
    fail(*value, key, "expected a path or a list of paths, got " + describe(*value));
    return;
  }
  for (const std::string& p : result) {
    if (p.empty()) {
      fail(*value, key, "an empty path; give a directory on the NVMe drive");
      return;
    }
  }
  out = std::move(result);
}

void Reader::pair(const char* key, std::array<double, 2>& out, double lo, double hi) {
  const Json::Value* value = take(key);
  if (value == nullptr || is_auto(*value, key, render(out))) return;
  if (!value->isArray() || value->size() != 2 || !(*value)[0].isNumeric() ||
      !(*value)[1].isNumeric() || (*value)[0].isBool() || (*value)[1].isBool()) {
    fail(*value, key,
         "expected a list of two numbers such as [0.9, 0.999], got " + describe(*value));
    return;
  }
  std::array<double, 2> result = {(*value)[0].asDouble(), (*value)[1].asDouble()};
  for (double d : result) {
    if (!(d >= lo && d < hi)) {
      fail(*value, key, fmt::format("{} is out of range; each must be in [{}, {})", d, lo, hi));
      return;
    }
  }
  out = result;
}

void Reader::batch(const char* key, std::uint64_t& out) {
  const Json::Value* value = take(key);
  if (value == nullptr || value->isNull()) return;
  if (value->isString() && value->asString() == "auto") {
    notes_->push_back({child_path(key), "\"auto\": derived from the other batch sizes"});
    out = 0;
    return;
  }
  long double number = 0;
  if (!value->isNumeric() || value->isBool() || !whole_number(*value, &number) || number < 0 ||
      number > static_cast<long double>(kCountMax)) {
    fail(*value, key,
         "expected a whole number ≥ 1 (or 0 / \"auto\" to derive it), got " + describe(*value));
    return;
  }
  out = static_cast<std::uint64_t>(number);
}

void Reader::ignored(const char* key) {
  const Json::Value* value = take(key, /*used=*/false);
  if (value == nullptr) return;
  notes_->push_back({child_path(key), "a DeepSpeed key Strata accepts but does not use"});
}

void Reader::renamed(const char* old_key, const char* new_key) {
  (void)new_key;
  frames_.back().known.insert(old_key);  // mapped before the fields were read
}

void Reader::report_unknown_keys() {
  const Frame& frame = frames_.back();
  for (const std::string& key : frame.object->getMemberNames()) {
    if (frame.known.count(key) != 0) continue;
    std::string path = frame.path.empty() ? key : frame.path + "." + key;
    std::string best;
    std::size_t best_distance = std::string::npos;
    for (const std::string& candidate : frame.known) {
      std::size_t d = edit_distance(key, candidate);
      if (d < best_distance) {
        best_distance = d;
        best = candidate;
      }
    }
    std::string hint;
    if (!best.empty() && best_distance <= suggestion_distance_max(key.size())) {
      hint = "did you mean '" + best + "'?";
    } else {
      std::string valid;
      for (const std::string& k : frame.used)
        valid += (valid.empty() ? "" : ", ") + k;
      hint = "valid keys " +
             (frame.path.empty() ? std::string("at the top level") : "in '" + frame.path + "'") +
             ": " + valid;
    }
    errors_->push_back(source_.locate((*frame.object)[key], path) + ": " + path +
                       ": unknown key; " + hint);
  }
}

}  // namespace strata::config
