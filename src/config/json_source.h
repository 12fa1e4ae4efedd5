// The JSON dialect DeepSpeed users write (DeepSpeed reads configs with hjson): standard JSON plus
// // , /* */ and # comments and trailing commas; duplicate keys are rejected. Keeps the source
// text so any value can be located as file:line:column, and applies --set overrides.
#pragma once

#include <json/json.h>

#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::config {

class JsonSource {
 public:
  // Parses `text`; `name` (a file path) appears in every error and location.
  static Result<JsonSource> parse(std::string text, std::string name);

  const Json::Value& root() const { return root_; }
  Json::Value& root() { return root_; }
  const std::string& name() const { return name_; }

  // Applies one "dotted.key.path=VALUE" override: VALUE is parsed as JSON when it is JSON, else
  // taken as a string. Intermediate objects are created as needed.
  Status apply_override(const std::string& assignment);

  // "file:LINE:COL" for a value of the tree, or "--set PATH=VALUE" when an override set it.
  std::string locate(const Json::Value& value, const std::string& path) const;

 private:
  std::string text_;
  std::string name_;
  Json::Value root_;
  std::map<std::string, std::string> overrides_;  // key path -> the --set text that set it
};

// Replaces `#` comments outside strings with spaces (same length, so offsets stay true).
std::string blank_hash_comments(std::string text);

}  // namespace strata::config
