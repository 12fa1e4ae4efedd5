// The JSON dialect DeepSpeed users write (DeepSpeed reads configs with hjson): standard JSON plus
// // , /* */ and # comments and trailing commas; duplicate keys are rejected. Keeps the source
// text so any value can be located as file:line:column, and applies command-line overrides
// (--set and the `strata train` flags), remembering which one set which key.
//
// Hostile input is bounded: config files are regular files of at most kConfigBytesMax bytes
// (a FIFO, a device or a directory is a named error, never a hang), and nesting deeper than
// kConfigDepthMax levels is a named error before the recursive JSON reader sees it.
#pragma once

#include <json/json.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::config {

// DeepSpeed configs nest about four levels deep; 64 leaves room for any real file while keeping
// the recursive reader (and Json::Value's recursive copy and destruction) far from the stack's end.
inline constexpr int kConfigDepthMax = 64;
// The largest config file read; real ones are a few KiB.
inline constexpr std::uint64_t kConfigBytesMax = std::uint64_t{16} << 20;

class JsonSource {
 public:
  // Parses `text`; `name` (a file path) appears in every error and location.
  static Result<JsonSource> parse(std::string text, std::string name);

  // The text of a config file: a regular file of at most kConfigBytesMax bytes (kConfig naming
  // the file otherwise; a FIFO or device is refused without reading from it).
  static Result<std::string> read_file(const std::string& path);

  const Json::Value& root() const { return root_; }
  Json::Value& root() { return root_; }
  const std::string& name() const { return name_; }

  // Applies one "dotted.key.path=VALUE" override: VALUE is parsed as JSON when it is JSON, else
  // taken as a string. Intermediate objects are created as needed.
  Status apply_override(const std::string& assignment);

  // Sets the value at a dotted key path; `origin` ("--lr 2e-5") stands for the place in errors.
  Status set(const std::string& path, Json::Value value, const std::string& origin);

  // "file:LINE:COL" for a value of the tree, or the override's origin when one set it.
  std::string locate(const Json::Value& value, const std::string& path) const;

  // The origin of the override that set `path` (or a section holding it); null when the value
  // came from the file.
  const std::string* override_origin(const std::string& path) const;

 private:
  std::string text_;
  std::string name_;
  Json::Value root_;
  std::vector<std::size_t> line_starts_;          // offset of each line's first byte
  std::map<std::string, std::string> overrides_;  // key path -> the override that set it
};

// Replaces `#` comments outside strings with spaces (same length, so offsets stay true).
std::string blank_hash_comments(std::string text);

// The offset of the first bracket nested deeper than `depth_max` levels ({ and [ outside strings
// and comments), or npos when the text stays within it.
std::size_t find_excess_nesting(const std::string& text, int depth_max);

}  // namespace strata::config
