#include "config/reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "common/units.h"

namespace strata::config {
namespace {

bool is_null_or_auto(const Json::Value& value) {
  return value.isNull() || (value.isString() && value.asString() == "auto");
}

// JSON equality with numbers compared by value (5e8 equals 500000000).
bool same_value(const Json::Value& a, const Json::Value& b) {
  if (a.isNumeric() && b.isNumeric() && !a.isBool() && !b.isBool()) {
    return a.asDouble() == b.asDouble();
  }
  return a == b;
}

// True when the section (or value) turns a feature on: an "enabled": true anywhere inside.
bool enabled_inside(const Json::Value& value, int depth = 0) {
  if (depth > kConfigDepthMax || !value.isObject()) return false;
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (it.name() == "enabled" && it->isBool() && it->asBool()) return true;
    if (enabled_inside(*it, depth + 1)) return true;
  }
  return false;
}

// True when a value asks for something: not null, false, "auto" or an empty section, and for a
// section not switched off with "enabled": false (or "disable": true).
bool asks_for_something(const Json::Value& value) {
  if (is_null_or_auto(value)) return false;
  if (value.isBool()) return value.asBool();
  if (value.isObject()) {
    if (value.empty()) return false;
    if (value.isMember("enabled") && value["enabled"].isBool()) return value["enabled"].asBool();
    if (value.isMember("disable") && value["disable"].isBool()) return !value["disable"].asBool();
  }
  return true;
}

// Levenshtein distance with swaps of neighbours, giving up (returning limit + 1) as soon as the
// distance must exceed `limit`: suggestions cost O(length * limit), not O(length^2).
std::size_t distance_within(std::string_view a, std::string_view b, std::size_t limit) {
  const std::size_t la = a.size(), lb = b.size();
  if ((la > lb ? la - lb : lb - la) > limit) return limit + 1;
  if (la > 64 || lb > 64) return limit + 1;  // no key Strata knows is this long
  return edit_distance(a, b);
}

}  // namespace

std::string Reader::child_path(const char* key) const {
  const std::string& parent = frames_.back().path;
  return parent.empty() ? std::string(key) : parent + "." + key;
}

std::string Reader::given_path(const char* key) const {
  const Frame& frame = frames_.back();
  auto it = frame.origin.find(key);
  if (it == frame.origin.end()) return child_path(key);
  return frame.path.empty() ? it->second : frame.path + "." + it->second;
}

const Json::Value* Reader::take(const char* key, bool acts) {
  Frame& frame = frames_.back();
  if (frame.known.insert(key).second) frame.accepted.push_back(key);
  if (acts) frame.used.push_back(key);
  if (!frame.object->isMember(key)) return nullptr;
  return &(*frame.object)[key];
}

void Reader::record(const Json::Value& value, const std::string& path, KeyUse use,
                    const std::string& detail) {
  std::string origin = source_.locate(value, path);
  out_->keys.push_back({path, use, detail, std::move(origin)});
  const std::ptrdiff_t offset = source_.override_origin(path) != nullptr
                                    ? std::numeric_limits<std::ptrdiff_t>::max()
                                    : value.getOffsetStart();
  out_->key_offsets.push_back(offset);
}

void Reader::used(const Json::Value& value, const char* key, const std::string& detail) {
  const std::string given = given_path(key);
  const std::string as = given == child_path(key) ? "" : "read as " + child_path(key);
  std::string text = as;
  if (!detail.empty()) text += (text.empty() ? "" : "; ") + detail;
  record(value, given, KeyUse::kUsed, text);
}

void Reader::fail(const Json::Value& value, const char* key, const std::string& message) {
  const std::string path = child_path(key);
  out_->errors.push_back(source_.locate(value, path) + ": " + given_path(key) + ": " + message);
  out_->invalid.insert(path);
  record(value, given_path(key), KeyUse::kInvalid, message);
}

void Reader::refuse(const Json::Value& value, const char* key, const std::string& message) {
  const std::string path = child_path(key);
  out_->errors.push_back(source_.locate(value, path) + ": " + given_path(key) + ": " + message);
  out_->invalid.insert(path);
  record(value, given_path(key), KeyUse::kRefused, message);
}

bool Reader::is_auto(const Json::Value& value, const char* key) {
  if (!value.isString() || value.asString() != "auto") return false;
  out_->autos.insert(child_path(key));
  // The resolved value is filled in by the loader once every key is read (config.cc).
  record(value, given_path(key), KeyUse::kUsed, "\"auto\"");
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
    case Json::realValue: {
      // Whole numbers written as 5e8 are shown as the number they are.
      const double d = value.asDouble();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e21) {
        return fmt::format("{:.0f}", d);
      }
      [[fallthrough]];
    }
    case Json::intValue:
    case Json::uintValue: {
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
  if (value == nullptr || is_auto(*value, key)) return;
  if (!value->isBool()) {
    fail(*value, key, "expected true or false, got " + describe(*value));
    return;
  }
  out = value->asBool();
  used(*value, key, "");
}

void Reader::integer(const char* key, std::int64_t& out, std::int64_t lo, std::int64_t hi) {
  const Json::Value* value = take(key);
  if (value == nullptr || is_auto(*value, key)) return;
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
  used(*value, key, "");
}

void Reader::count(const char* key, std::uint64_t& out, std::uint64_t lo, std::uint64_t hi,
                   std::uint64_t multiple) {
  const Json::Value* value = take(key);
  if (value == nullptr || is_auto(*value, key)) return;
  long double number = 0;
  if (!value->isNumeric() || value->isBool() || !whole_number(*value, &number)) {
    fail(*value, key, "expected a whole number, got " + describe(*value));
    return;
  }
  if (number < static_cast<long double>(lo) || number > static_cast<long double>(hi)) {
    std::string range = hi == std::numeric_limits<std::uint64_t>::max()
                            ? fmt::format("at least {}", lo)
                            : fmt::format("from {} to {}", lo, hi);
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
  used(*value, key, "");
}

void Reader::bytes(const char* key, std::uint64_t& out) {
  const Json::Value* value = take(key);
  if (value == nullptr || is_auto(*value, key)) return;
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
    used(*value, key, "");
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
  used(*value, key, "");
}

void Reader::real(const char* key, double& out, double lo, double hi, bool lo_open) {
  const Json::Value* value = take(key);
  if (value == nullptr || is_auto(*value, key)) return;
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
  used(*value, key, "");
}

void Reader::text(const char* key, std::string& out) {
  const Json::Value* value = take(key);
  if (value == nullptr || value->isNull()) return;
  if (!value->isString()) {
    fail(*value, key, "expected a string, got " + describe(*value));
    return;
  }
  out = value->asString();
  used(*value, key, "");
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
  used(*value, key, "");
}

void Reader::pair(const char* key, std::array<double, 2>& out, double lo, double hi) {
  const Json::Value* value = take(key);
  if (value == nullptr || is_auto(*value, key)) return;
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
  used(*value, key, "");
}

void Reader::batch(const char* key, std::uint64_t& out, std::uint64_t hi) {
  const Json::Value* value = take(key);
  if (value == nullptr || value->isNull()) return;
  if (is_auto(*value, key)) {
    out = 0;
    return;
  }
  long double number = 0;
  if (!value->isNumeric() || value->isBool() || !whole_number(*value, &number) || number < 0) {
    fail(*value, key,
         "expected a whole number ≥ 1 (or 0 / \"auto\" to derive it), got " + describe(*value));
    return;
  }
  if (number > static_cast<long double>(hi)) {
    fail(*value, key,
         fmt::format("{} is out of range; valid: 1 to {} (or 0 / \"auto\" to derive it)",
                     describe(*value), hi));
    return;
  }
  out = static_cast<std::uint64_t>(number);
  used(*value, key, number == 0 ? "0: derived from the other batch sizes" : "");
}

bool Reader::check_value(const Json::Value& value, const char* key, const Check& check) {
  if (value.isNull()) return true;
  switch (check.kind) {
    case Check::Kind::kAny:
      return true;
    case Check::Kind::kBoolean:
      if (value.isBool()) return true;
      fail(value, key, "expected true or false, got " + describe(value));
      return false;
    case Check::Kind::kText:
      if (value.isString()) return true;
      fail(value, key, "expected a string, got " + describe(value));
      return false;
    case Check::Kind::kWhole: {
      long double number = 0;
      if (!value.isNumeric() || value.isBool() || !whole_number(value, &number)) {
        fail(value, key, "expected a whole number, got " + describe(value));
        return false;
      }
      if (number < check.lo || number > check.hi) {
        fail(value, key,
             fmt::format("{} is out of range; valid: from {} to {}", describe(value),
                         static_cast<long long>(check.lo), static_cast<long long>(check.hi)));
        return false;
      }
      return true;
    }
    case Check::Kind::kNumber: {
      if (!value.isNumeric() || value.isBool() || !std::isfinite(value.asDouble())) {
        fail(value, key, "expected a number, got " + describe(value));
        return false;
      }
      const double number = value.asDouble();
      if (number < check.lo || number > check.hi) {
        fail(value, key,
             check.hi >= kHuge
                 ? fmt::format("{} is out of range; valid: at least {}", describe(value), check.lo)
                 : fmt::format("{} is out of range; valid: from {} to {}", describe(value),
                               check.lo, check.hi));
        return false;
      }
      return true;
    }
  }
  return true;
}

void Reader::unused(const char* key, const Check& check, const Unused& unused) {
  const Json::Value* value = take(key, /*acts=*/false);
  if (value == nullptr) return;
  const std::string given = given_path(key);
  if (value->isString() && value->asString() == "auto") {
    record(*value, given, KeyUse::kNoEffect, std::string("\"auto\"; ") + unused.why);
    return;
  }
  if (!check_value(*value, key, check)) return;
  if (!unused.honoured.isNull() && same_value(*value, unused.honoured)) {
    record(*value, given, KeyUse::kUsed, std::string("Strata always does this: ") + unused.why);
    return;
  }
  const bool asks = unused.ds_default.isNull() ? asks_for_something(*value)
                                               : !same_value(*value, unused.ds_default);
  record(*value, given, KeyUse::kNoEffect, unused.why);
  if (asks) {
    out_->notes.push_back(
        {given, std::string("has no effect in Strata: ") + unused.why, Severity::kWarning});
  }
}

void Reader::refused(const char* key, const Check& check, const Refuse& refuse_rule) {
  const Json::Value* value = take(key, /*acts=*/false);
  if (value == nullptr) return;
  const std::string given = given_path(key);
  if (value->isString() && value->asString() == "auto") {
    record(*value, given, KeyUse::kNoEffect, "\"auto\": off");
    return;
  }
  if (!check_value(*value, key, check)) return;
  bool on = false;
  switch (refuse_rule.when) {
    case RefuseWhen::kTrue:
      on = value->isBool() && value->asBool();
      break;
    case RefuseWhen::kPresent:
      on = !value->isNull() && !(value->isBool() && !value->asBool()) &&
           !(value->isObject() && value->empty());
      break;
    case RefuseWhen::kEnabledInside:
      on = enabled_inside(*value);
      break;
    case RefuseWhen::kNotBenign:
      on = !value->isNull() && !same_value(*value, refuse_rule.benign);
      break;
  }
  if (!on) {
    record(*value, given, KeyUse::kNoEffect, "the feature is off");
    return;
  }
  std::string fix;
  switch (refuse_rule.when) {
    case RefuseWhen::kTrue:
      fix = "set it to false or remove it";
      break;
    case RefuseWhen::kEnabledInside:
      fix = "set its \"enabled\" switches to false or remove the section";
      break;
    case RefuseWhen::kNotBenign:
      fix = "set it to " +
            (refuse_rule.benign.isString() ? json_quote(refuse_rule.benign.asString())
                                           : describe(refuse_rule.benign)) +
            " or remove it";
      break;
    case RefuseWhen::kPresent:
      fix = "remove it";
      break;
  }
  this->refuse(*value, key,
               std::string("not supported by Strata: ") + refuse_rule.why + "; " + fix);
}

void Reader::alias(const char* name, const char* key) {
  (void)name;
  (void)key;  // mapped by apply_renames before the fields were read
}

void Reader::renamed(const char* old_key, const char* new_key) {
  (void)old_key;
  (void)new_key;  // mapped by apply_renames before the fields were read
}

void Reader::legacy(const char* old_key, const char* target) {
  (void)target;  // mapped by config.cc before the reader runs
  Frame& frame = frames_.back();
  if (frame.known.insert(old_key).second) frame.accepted.push_back(old_key);
}

void Reader::report_unknown_keys() {
  const Frame& frame = frames_.back();
  struct Unknown {
    std::string key;
    std::ptrdiff_t offset;
  };
  std::vector<Unknown> unknown;
  for (auto it = frame.object->begin(); it != frame.object->end(); ++it) {
    std::string key = it.name();
    if (frame.known.count(key) != 0) continue;
    unknown.push_back({std::move(key), it->getOffsetStart()});
  }
  if (unknown.empty()) return;
  // In file order: the first ones listed are the first ones the user sees in the file.
  std::sort(unknown.begin(), unknown.end(),
            [](const Unknown& a, const Unknown& b) { return a.offset < b.offset; });
  const std::string where =
      frame.path.empty() ? std::string("at the top level") : "in '" + frame.path + "'";
  std::string valid;
  std::size_t errors = 0, warnings = 0;
  for (std::size_t i = 0; i < unknown.size(); ++i) {
    const std::string& key = unknown[i].key;
    const Json::Value& value = (*frame.object)[key];
    const std::string path = frame.path.empty() ? key : frame.path + "." + key;
    if (i >= kUnknownKeysListedMax) {
      // Past the listed ones: counted, not compared against every known key.
      (frame.unknown == UnknownKeys::kError ? errors : warnings)++;
      continue;
    }
    // The nearest key accepted here; a near miss of a key Strata acts on is a typo (an error
    // even where DeepSpeed would ignore it, since the setting would silently not apply).
    std::string best;
    std::size_t best_distance = std::string::npos;
    const std::size_t limit = suggestion_distance_max(key.size());
    for (const std::string& candidate : frame.accepted) {
      const std::size_t d = distance_within(key, candidate, limit);
      if (d < best_distance) {
        best_distance = d;
        best = candidate;
      }
    }
    const bool near = !best.empty() && best_distance <= limit;
    const bool near_used =
        near && std::find(frame.used.begin(), frame.used.end(), best) != frame.used.end();
    if (key.rfind('_', 0) == 0 && frame.unknown == UnknownKeys::kWarn) {
      // "_comment" and the like: a comment the JSON format has no other place for.
      record(value, path, KeyUse::kNoEffect, "a comment (the name starts with '_')");
      continue;
    }
    if (frame.unknown == UnknownKeys::kError || near_used) {
      std::string hint;
      if (near) {
        hint = "did you mean '" + best + "'?";
      } else {
        if (valid.empty()) {
          for (const std::string& k : frame.accepted)
            valid += (valid.empty() ? "" : ", ") + k;
        }
        hint = "valid keys " + where + ": " + valid;
      }
      out_->errors.push_back(source_.locate(value, path) + ": " + path + ": unknown key; " + hint);
      record(value, path, KeyUse::kInvalid, near ? hint : "unknown key");
      continue;
    }
    const std::string message = std::string("not a key Strata knows; it has no effect") +
                                (near ? " (did you mean '" + best + "'?)" : "");
    out_->notes.push_back({path, message, Severity::kWarning});
    record(value, path, KeyUse::kNoEffect, "unknown to Strata");
  }
  if (errors > 0) {
    out_->errors.push_back(
        fmt::format("{}: {} more unknown keys {} (not listed)", source_.name(), errors, where));
  }
  if (warnings > 0) {
    out_->notes.push_back({frame.path.empty() ? "(top level)" : frame.path,
                           fmt::format("{} more keys Strata does not know, with no effect (not "
                                       "listed)",
                                       warnings),
                           Severity::kWarning});
  }
}

}  // namespace strata::config
