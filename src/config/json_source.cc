#include "config/json_source.h"

#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <sstream>

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
  return std::unique_ptr<Json::CharReader>(builder.newCharReader());
}

}  // namespace

std::string blank_hash_comments(std::string text) {
  enum class State { kCode, kString, kLineComment, kBlockComment };
  State state = State::kCode;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    char next = i + 1 < text.size() ? text[i + 1] : '\0';
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
        } else if (c == '#') {
          for (; i < text.size() && text[i] != '\n'; ++i)
            text[i] = ' ';
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
  return text;
}

Result<JsonSource> JsonSource::parse(std::string text, std::string name) {
  JsonSource source;
  source.text_ = blank_hash_comments(std::move(text));
  source.name_ = std::move(name);
  std::size_t first = source.text_.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) {
    return Status(ErrorCode::kConfig, "the file is empty; a config is a JSON object like {}",
                  source.name_);
  }
  auto reader = make_reader();
  std::string errors;
  const char* begin = source.text_.data();
  if (!reader->parse(begin, begin + source.text_.size(), &source.root_, &errors)) {
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
  std::string path = assignment.substr(0, eq);
  std::string value_text = assignment.substr(eq + 1);
  std::vector<std::string> keys;
  std::size_t start = 0;
  while (true) {
    std::size_t dot = path.find('.', start);
    std::string key =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (key.empty()) {
      return Status(ErrorCode::kUsage,
                    fmt::format("--set {}: empty key in the dotted path", assignment));
    }
    keys.push_back(key);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }

  Json::Value value;
  std::string ignored;
  auto reader = make_reader();
  if (!reader->parse(value_text.data(), value_text.data() + value_text.size(), &value, &ignored)) {
    value = Json::Value(value_text);  // not JSON: a bare string such as a path
  }

  Json::Value* node = &root_;
  std::string walked;
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) {
    walked += (walked.empty() ? "" : ".") + keys[i];
    Json::Value& child = (*node)[keys[i]];
    if (child.isNull()) child = Json::Value(Json::objectValue);
    if (!child.isObject()) {
      return Status(
          ErrorCode::kConfig,
          fmt::format("--set {}: '{}' is not a section (it holds a {}), so it has no "
                      "key '{}'",
                      assignment, walked, child.isArray() ? "list" : "value", keys[i + 1]));
    }
    node = &child;
  }
  (*node)[keys.back()] = value;
  overrides_[path] = assignment;
  return Status::ok();
}

std::string JsonSource::locate(const Json::Value& value, const std::string& path) const {
  // A value under an overridden path came from the command line, not the file.
  for (const auto& [override_path, assignment] : overrides_) {
    if (path == override_path || path.rfind(override_path + ".", 0) == 0) {
      return "--set " + assignment;
    }
  }
  std::ptrdiff_t offset = value.getOffsetStart();
  if (offset < 0 || static_cast<std::size_t>(offset) > text_.size()) return name_;
  int line = 1;
  int column = 1;
  for (std::ptrdiff_t i = 0; i < offset; ++i) {
    if (text_[static_cast<std::size_t>(i)] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return fmt::format("{}:{}:{}", name_, line, column);
}

}  // namespace strata::config
