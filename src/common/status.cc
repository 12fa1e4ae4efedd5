#include "common/status.h"

namespace strata {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kConfig:
      return "configuration error";
    case ErrorCode::kUsage:
      return "usage error";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kIo:
      return "I/O error";
    case ErrorCode::kNoSpace:
      return "no space";
    case ErrorCode::kCorrupt:
      return "corrupt data";
    case ErrorCode::kUnavailable:
      return "unavailable";
    case ErrorCode::kOutOfMemory:
      return "out of memory";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "unknown error";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  if (context_.empty()) return message_;
  return context_ + ": " + message_;
}

Status Status::with_context(const std::string& outer) const {
  if (is_ok()) return *this;
  return Status(code_, message_, context_.empty() ? outer : outer + ": " + context_);
}

int Status::exit_code() const {
  switch (code_) {
    case ErrorCode::kOk:
      return 0;
    case ErrorCode::kConfig:
    case ErrorCode::kUsage:
      return 2;
    default:
      return 1;
  }
}

}  // namespace strata
