// Errors as values: every module boundary returns Status or Result<T>; no exception crosses one.
// A Status carries a code (which decides the process exit code), a message for the user, and
// optional context (a file, key path or offset) that the message is about.
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>
#include <variant>

#include "common/assert.h"

namespace strata {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // a caller passed a value outside the contract (user input included)
  kConfig,           // a configuration file or override is wrong; exit code 2
  kUsage,            // a command line is wrong; exit code 2
  kNotFound,         // a file, device or key does not exist
  kIo,               // an operating-system I/O call failed
  kNoSpace,          // a tier, file system or budget has no room
  kCorrupt,          // data read back failed verification
  kUnavailable,      // a facility (GPU, io_uring, O_DIRECT) is not present here
  kOutOfMemory,      // a memory budget or allocation was exceeded
  kInternal,         // a bug in Strata
};

const char* error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message, std::string context = {})
      : code_(code), message_(std::move(message)), context_(std::move(context)) {
    STRATA_ASSERT(code != ErrorCode::kOk);
  }

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  const std::string& context() const { return context_; }

  // "context: message", or just the message when there is no context.
  std::string to_string() const;

  // Returns a copy whose context is prefixed with `outer` ("outer: inner").
  Status with_context(const std::string& outer) const;

  // The process exit code for this status: 0 ok, 2 configuration or usage, 1 anything else.
  int exit_code() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
  std::string context_;
};

template <typename... Args>
Status make_error(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  return Status(code, fmt::format(format, std::forward<Args>(args)...));
}

// Result<T> holds either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {  // NOLINT: implicit by design
    STRATA_ASSERT(!std::get<Status>(data_).is_ok());
  }

  bool is_ok() const { return std::holds_alternative<T>(data_); }
  explicit operator bool() const { return is_ok(); }

  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(data_);
  }
  T& value() & {
    STRATA_ASSERT(is_ok());
    return std::get<T>(data_);
  }
  const T& value() const& {
    STRATA_ASSERT(is_ok());
    return std::get<T>(data_);
  }
  T&& value() && {
    STRATA_ASSERT(is_ok());
    return std::get<T>(std::move(data_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace strata

#define STRATA_CONCAT_INNER(a, b) a##b
#define STRATA_CONCAT(a, b) STRATA_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function when it is not ok.
#define STRATA_TRY(expr)                          \
  do {                                            \
    ::strata::Status strata_try_status_ = (expr); \
    if (!strata_try_status_.is_ok()) {            \
      return strata_try_status_;                  \
    }                                             \
  } while (0)

// Evaluates a Result<T> expression; on error returns its Status, else moves the value into `lhs`.
#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL(STRATA_CONCAT(strata_result_, __LINE__), lhs, expr)
#define STRATA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.is_ok()) {                                \
    return tmp.status();                             \
  }                                                  \
  lhs = std::move(tmp).value()
