// Reading files that may be hostile: only regular files (a FIFO, a device such as /dev/zero, a
// directory or a socket is refused at once, never read or waited on), never more than a stated
// number of bytes, and JSON only up to a stated size and nesting depth. Every problem is a Status
// naming the file; no exception leaves these functions (jsoncpp's are caught and named).
#pragma once

#include <json/value.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strata {

// An open regular file: its descriptor (close it) and size at open.
struct RegularFile {
  int fd = -1;
  std::uint64_t bytes = 0;
};

// Why a file was refused, for a caller that words the error in its own terms (the config
// reader): set beside the Status, and left empty for OS errors.
struct ReadRefusal {
  const char* file_type = nullptr;  // not a regular file: "a directory", "a FIFO (named pipe)"...
  std::uint64_t bytes = 0;          // too large: at least this many bytes (more than bytes_max)
};

// Opens `path` read-only without blocking (a FIFO with no writer does not hang the open) and
// checks that it is a regular file. `what` says what the file is for in errors ("the data
// file"). kNotFound when it does not exist; kIo for other OS errors or a file that is not
// regular (naming its type, also in `refusal` when given).
Result<RegularFile> open_regular_file(const std::string& path, std::string_view what,
                                      ReadRefusal* refusal = nullptr);

// The whole content of the regular file `path`, refused (kInvalidArgument; its size in
// `refusal` when given) when it is larger than `bytes_max`.
Result<std::string> read_regular_file(const std::string& path, std::uint64_t bytes_max,
                                      std::string_view what, ReadRefusal* refusal = nullptr);

struct JsonLimits {
  std::uint64_t bytes_max = std::uint64_t{16} << 20;
  int depth_max = 64;           // nesting of arrays and objects; the root object is depth 1
  bool allow_comments = false;  // // and /* */ (jsoncpp's dialect)
  bool reject_dup_keys = true;  // a key twice in one object is an error
};

// Parses `text` as one JSON value within `limits`. kCorrupt naming `source` and the line and
// column at fault (too deep, too big, malformed); never throws.
Result<Json::Value> parse_json_bounded(std::string_view text, const std::string& source,
                                       const JsonLimits& limits);

// read_regular_file + parse_json_bounded; the root must be an object.
Result<Json::Value> read_json_file(const std::string& path, const JsonLimits& limits,
                                   std::string_view what);

}  // namespace strata
