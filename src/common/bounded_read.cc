// Bounded reading of regular files and JSON (see bounded_read.h).
#include "common/bounded_read.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <json/reader.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>

namespace strata {
namespace {

const char* file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// 1-based line and column of byte `offset` in `text`.
std::string position(std::string_view text, std::size_t offset) {
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return fmt::format("line {}, column {}", line, column);
}

// The first byte at which arrays and objects nest deeper than `depth_max`, or npos. Brackets
// inside strings (and comments, when allowed) do not count. A linear scan, so that a hostile
// file never reaches the recursive parser with more nesting than it can take.
std::size_t too_deep_at(std::string_view text, int depth_max, bool comments) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (comments && c == '/' && i + 1 < text.size()) {
      if (text[i + 1] == '/') {
        while (i < text.size() && text[i] != '\n')
          ++i;
        continue;
      }
      if (text[i + 1] == '*') {
        const std::size_t end = text.find("*/", i + 2);
        if (end == std::string_view::npos) return std::string_view::npos;  // the parser says so
        i = end + 1;
        continue;
      }
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > depth_max) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}

// jsoncpp's multi-line error text on one line.
std::string one_line(const std::string& errors) {
  std::string out;
  bool space = false;
  for (char c : errors) {
    if (c == '\n' || c == ' ' || c == '\t' || c == '*') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

}  // namespace

Result<RegularFile> open_regular_file(const std::string& path, std::string_view what,
                                      ReadRefusal* refusal) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    return Status(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                  fmt::format("cannot open {}: {}", what, std::strerror(err)), path);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status(ErrorCode::kIo, fmt::format("cannot stat {}: {}", what, std::strerror(err)),
                  path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    if (refusal != nullptr) refusal->file_type = file_type(st.st_mode);
    return Status(ErrorCode::kIo,
                  fmt::format("{} is {}; only a regular file is read", what, file_type(st.st_mode)),
                  path);
  }
  // Regular files ignore O_NONBLOCK; clear it anyway so that later reads are plain.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return RegularFile{fd, static_cast<std::uint64_t>(st.st_size)};
}

Result<std::string> read_regular_file(const std::string& path, std::uint64_t bytes_max,
                                      std::string_view what, ReadRefusal* refusal) {
  STRATA_ASSIGN_OR_RETURN(const RegularFile file, open_regular_file(path, what, refusal));
  auto refuse = [&](std::uint64_t bytes) {
    if (refusal != nullptr) refusal->bytes = bytes;
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("{} holds {}{} bytes, more than the {} bytes it may have", what,
                              bytes > bytes_max ? "at least " : "", bytes, bytes_max),
                  path);
  };
  if (file.bytes > bytes_max) {
    ::close(file.fd);
    return refuse(file.bytes);
  }
  std::string text(static_cast<std::size_t>(file.bytes), '\0');
  std::uint64_t got = 0;
  int attempts = 0;
  // The file may change while it is read: read until EOF, but never past bytes_max.
  while (true) {
    if (got == text.size()) {
      if (text.size() > bytes_max) break;
      text.resize(std::min<std::uint64_t>(bytes_max + 1, text.size() + 4096));
    }
    const ssize_t n = ::read(file.fd, text.data() + got, text.size() - got);
    if (n < 0) {
      const int err = errno;
      if ((err == EINTR || err == EAGAIN) && ++attempts < 100) continue;
      ::close(file.fd);
      return Status(ErrorCode::kIo, fmt::format("cannot read {}: {}", what, std::strerror(err)),
                    path);
    }
    if (n == 0) break;
    got += static_cast<std::uint64_t>(n);
  }
  ::close(file.fd);
  if (got > bytes_max) return refuse(got);
  text.resize(static_cast<std::size_t>(got));
  return text;
}

Result<Json::Value> parse_json_bounded(std::string_view text, const std::string& source,
                                       const JsonLimits& limits) {
  if (text.size() > limits.bytes_max) {
    return Status(
        ErrorCode::kCorrupt,
        fmt::format("{} bytes of JSON exceed the limit of {} bytes", text.size(), limits.bytes_max),
        source);
  }
  const std::size_t deep = too_deep_at(text, limits.depth_max, limits.allow_comments);
  if (deep != std::string_view::npos) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("JSON nested deeper than {} levels at {}; valid: at most {}",
                              limits.depth_max, position(text, deep), limits.depth_max),
                  source);
  }
  Json::CharReaderBuilder builder;
  builder["rejectDupKeys"] = limits.reject_dup_keys;
  builder["allowComments"] = limits.allow_comments;
  builder["strictRoot"] = false;
  builder["failIfExtra"] = true;
  // The scan above bounds the depth; jsoncpp's own limit (which throws) stays out of reach.
  builder["stackLimit"] = limits.depth_max + 16;
  try {
    std::unique_ptr<Json::CharReader> reader(builder.newCharReader());
    Json::Value root;
    std::string errors;
    if (!reader->parse(text.data(), text.data() + text.size(), &root, &errors)) {
      return Status(ErrorCode::kCorrupt, "malformed JSON: " + one_line(errors), source);
    }
    return root;
  } catch (const std::exception& e) {
    return Status(ErrorCode::kCorrupt, fmt::format("malformed JSON: {}", e.what()), source);
  }
}

Result<Json::Value> read_json_file(const std::string& path, const JsonLimits& limits,
                                   std::string_view what) {
  STRATA_ASSIGN_OR_RETURN(const std::string text, read_regular_file(path, limits.bytes_max, what));
  STRATA_ASSIGN_OR_RETURN(Json::Value root, parse_json_bounded(text, path, limits));
  if (!root.isObject()) {
    return Status(ErrorCode::kCorrupt, fmt::format("{} is not a JSON object", what), path);
  }
  return root;
}

}  // namespace strata
