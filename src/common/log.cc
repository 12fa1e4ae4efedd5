#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace strata {
namespace {

LogLevel level_from_env() {
  const char* value = std::getenv("STRATA_LOG_LEVEL");
  if (value == nullptr) return LogLevel::kInfo;
  if (std::strcmp(value, "error") == 0) return LogLevel::kError;
  if (std::strcmp(value, "warn") == 0) return LogLevel::kWarn;
  if (std::strcmp(value, "debug") == 0) return LogLevel::kDebug;
  return LogLevel::kInfo;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}

}  // namespace

LogLevel log_level() {
  return static_cast<LogLevel>(level_storage().load());
}

void set_log_level(LogLevel level) {
  level_storage().store(static_cast<int>(level));
}

void log_write(LogLevel level, std::string_view message) {
  static std::mutex mutex;
  static constexpr const char* kNames[] = {"error", "warning", "info", "debug"};
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "strata %s: %.*s\n", kNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace strata
