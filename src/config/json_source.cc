#include "config/json_source.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <sstream>
#include <string_view>

#include "common/bounded_read.h"

namespace strata::config {
namespace {

// jsoncpp reports "* Line 3, Column 5\n  Syntax error: ...". Turns each into "name:3:5: ...".
std::string reformat_errors(const std::string& errors, const std::string& name) {
  std::istringstream in(errors);
  std::string line;
  std::string out;
  std::string location;
  while (std::getline(in, line)) {
    int line_number = 0;
    int column = 0;
    if (std::sscanf(line.c_str(), "* Line %d, Column %d", &line_number, &column) == 2) {
      location = fmt::format("{}:{}:{}", name, line_number, column);
      continue;
    }
    std::size_t first = line.find_first_not_of(' ');
    if (first == std::string::npos) continue;
    std::string message = line.substr(first);
    if (message.rfind("See Line", 0) == 0) continue;
    if (!out.empty()) out += "\n";
    out += location.empty() ? name + ": " + message : location + ": " + message;
  }
  return out.empty() ? name + ": malformed JSON" : out;
}

std::unique_ptr<Json::CharReader> make_reader() {
  Json::CharReaderBuilder builder;
  builder["allowComments"] = true;
  builder["allowTrailingCommas"] = true;
  builder["strictRoot"] = false;
  builder["allowSingleQuotes"] = false;
  builder["failIfExtra"] = true;
  builder["rejectDupKeys"] = true;
  builder["allowSpecialFloats"] = false;
  builder["skipBom"] = true;
  // A second fence behind find_excess_nesting: jsoncpp throws past this depth.
  builder["stackLimit"] = kConfigDepthMax + 8;
  return std::unique_ptr<Json::CharReader>(builder.newCharReader());
}

// Parses `text` with jsoncpp, which throws on some hostile input (depth past stackLimit): every
// exception becomes `errors`.
bool parse_json(const std::string& text, Json::Value* out, std::string* errors) {
  try {
    auto reader = make_reader();
    return reader->parse(text.data(), text.data() + text.size(), out, errors);
  } catch (const std::exception& e) {
    *errors = e.what();
    return false;
  }
}

// Walks `text` as jsoncpp's dialect lexes it and calls visit(i) at each byte i that is code,
// outside strings and // or /* */ comments (a string ends at its closing quote or at the end of
// its line). visit may move i on past bytes it consumed; it returns false to stop the walk.
// Returns where the walk stopped, or npos at the end of the text.
template <typename Visit>
std::size_t walk_code(std::string_view text, Visit visit) {
  enum class State { kCode, kString, kLineComment, kBlockComment };
  State state = State::kCode;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const char next = i + 1 < text.size() ? text[i + 1] : '\0';
    switch (state) {
      case State::kCode:
        if (c == '"') {
          state = State::kString;
        } else if (c == '/' && next == '/') {
          state = State::kLineComment;
          ++i;
        } else if (c == '/' && next == '*') {
          state = State::kBlockComment;
          ++i;
        } else if (!visit(i)) {
          return i;
        }
        break;
      case State::kString:
        if (c == '\\') {
          ++i;
        } else if (c == '"' || c == '\n') {
          state = State::kCode;
        }
        break;
      case State::kLineComment:
        if (c == '\n') state = State::kCode;
        break;
      case State::kBlockComment:
        if (c == '*' && next == '/') {
          state = State::kCode;
          ++i;
        }
        break;
    }
  }
  return std::string_view::npos;
}

}  // namespace

std::string blank_hash_comments(std::string text) {
  walk_code(text, [&text](std::size_t& i) {
    if (text[i] == '#') {
      // Up to the newline, which stays: the walk goes on after it, in code.
      for (; i < text.size() && text[i] != '\n'; ++i)
        text[i] = ' ';
    }
    return true;
  });
  return text;
}

std::size_t find_excess_nesting(const std::string& text, int depth_max) {
  int depth = 0;
  return walk_code(text, [&](std::size_t& i) {
    const char c = text[i];
    if (c == '{' || c == '[') return ++depth <= depth_max;
    if ((c == '}' || c == ']') && depth > 0) --depth;
    return true;
  });
}

Result<std::string> JsonSource::read_file(const std::string& path) {
  ReadRefusal refusal;
  Result<std::string> text = read_regular_file(path, kConfigBytesMax, "the config file", &refusal);
  if (text.is_ok()) return text;
  // In the config's own words and code (kConfig: exit 2), whatever the reader's.
  if (refusal.file_type != nullptr) {
    return Status(ErrorCode::kConfig,
                  fmt::format("is {}, not a config file; give a JSON file", refusal.file_type),
                  path);
  }
  if (refusal.bytes != 0) {
    return Status(ErrorCode::kConfig,
                  fmt::format("the config file is {} bytes; a config may be at most {} MiB "
                              "(DeepSpeed configs are a few KiB)",
                              refusal.bytes, kConfigBytesMax >> 20),
                  path);
  }
  return Status(ErrorCode::kConfig, text.status().message(), path);
}

Result<JsonSource> JsonSource::parse(std::string text, std::string name) {
  JsonSource source;
  source.text_ = blank_hash_comments(std::move(text));
  source.name_ = std::move(name);
  source.line_starts_.push_back(0);
  for (std::size_t i = 0; i < source.text_.size(); ++i) {
    if (source.text_[i] == '\n') source.line_starts_.push_back(i + 1);
  }
  std::size_t first = source.text_.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) {
    return Status(ErrorCode::kConfig, "the file is empty; a config is a JSON object like {}",
                  source.name_);
  }
  const std::size_t deep = find_excess_nesting(source.text_, kConfigDepthMax);
  if (deep != std::string::npos) {
    Json::Value at;
    at.setOffsetStart(static_cast<std::ptrdiff_t>(deep));
    return Status(ErrorCode::kConfig,
                  fmt::format("sections and lists nest more than {} levels deep here; a "
                              "DeepSpeed config nests about 4",
                              kConfigDepthMax),
                  source.locate(at, ""));
  }
  std::string errors;
  if (!parse_json(source.text_, &source.root_, &errors)) {
    return Status(ErrorCode::kConfig, "malformed JSON:\n" + reformat_errors(errors, source.name_));
  }
  if (!source.root_.isObject()) {
    return Status(ErrorCode::kConfig,
                  "the top level must be a JSON object ({...}), not " +
                      std::string(source.root_.isArray() ? "an array" : "a single value"),
                  source.locate(source.root_, ""));
  }
  return source;
}

Status JsonSource::apply_override(const std::string& assignment) {
  std::size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return Status(ErrorCode::kUsage,
                  fmt::format("--set expects KEY.PATH=VALUE (e.g. zero_optimization.stage=3), "
                              "got '{}'",
                              assignment));
  }
  const std::string value_text = assignment.substr(eq + 1);
  Json::Value value;
  std::string ignored;
  if (find_excess_nesting(value_text, kConfigDepthMax) != std::string::npos) {
    return Status(
        ErrorCode::kUsage,
        fmt::format("--set {}: the value nests more than {} levels deep",
                    assignment.substr(0, std::min<std::size_t>(eq + 20, 80)), kConfigDepthMax));
  }
  if (!parse_json(value_text, &value, &ignored)) {
    value = Json::Value(value_text);  // not JSON: a bare string such as a path
  }
  return set(assignment.substr(0, eq), std::move(value), "--set " + assignment);
}

Status JsonSource::set(const std::string& path, Json::Value value, const std::string& origin) {
  std::vector<std::string> keys;
  std::size_t start = 0;
  while (true) {
    std::size_t dot = path.find('.', start);
    std::string key =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (key.empty()) {
      return Status(ErrorCode::kUsage, fmt::format("{}: empty key in the dotted path", origin));
    }
    keys.push_back(key);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  Json::Value* node = &root_;
  std::string walked;
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) {
    walked += (walked.empty() ? "" : ".") + keys[i];
    if (!node->isMember(keys[i]) || (*node)[keys[i]].isNull()) {
      (*node)[keys[i]] = Json::Value(Json::objectValue);
    }
    Json::Value& child = (*node)[keys[i]];
    if (!child.isObject()) {
      return Status(ErrorCode::kConfig,
                    fmt::format("{}: '{}' is not a section (it holds a {}), so it has no key '{}'",
                                origin, walked, child.isArray() ? "list" : "value", keys[i + 1]));
    }
    node = &child;
  }
  (*node)[keys.back()] = std::move(value);
  overrides_[path] = origin;
  return Status::ok();
}

const std::string* JsonSource::override_origin(const std::string& path) const {
  // A value under an overridden path came from the command line, not the file. Overrides are
  // few (a handful of flags), so a scan is fine.
  for (const auto& [override_path, origin] : overrides_) {
    if (path == override_path || (path.size() > override_path.size() &&
                                  path.compare(0, override_path.size(), override_path) == 0 &&
                                  path[override_path.size()] == '.')) {
      return &origin;
    }
  }
  return nullptr;
}

std::string JsonSource::locate(const Json::Value& value, const std::string& path) const {
  if (!overrides_.empty()) {
    if (const std::string* origin = override_origin(path)) return *origin;
  }
  const std::ptrdiff_t offset = value.getOffsetStart();
  if (offset < 0 || static_cast<std::size_t>(offset) > text_.size()) return name_;
  // Binary search in the line index keeps locating linear in the number of problems, not
  // quadratic (a file of 200k unknown keys).
  const auto at = static_cast<std::size_t>(offset);
  const auto line = std::upper_bound(line_starts_.begin(), line_starts_.end(), at) - 1;
  return fmt::format("{}:{}:{}", name_, (line - line_starts_.begin()) + 1, at - *line + 1);
}

}  // namespace strata::config
