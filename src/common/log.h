// Minimal leveled logging to stderr. The level comes from STRATA_LOG_LEVEL
// (error, warn, info, debug; default info) or from set_log_level().
#pragma once

#include <fmt/format.h>

#include <string_view>
#include <utility>

namespace strata {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_write(LogLevel level, std::string_view message);

template <typename... Args>
void log_at(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (static_cast<int>(level) > static_cast<int>(log_level())) return;
  log_write(level, fmt::format(format, std::forward<Args>(args)...));
}

#define STRATA_LOG_ERROR(...) ::strata::log_at(::strata::LogLevel::kError, __VA_ARGS__)
#define STRATA_LOG_WARN(...) ::strata::log_at(::strata::LogLevel::kWarn, __VA_ARGS__)
#define STRATA_LOG_INFO(...) ::strata::log_at(::strata::LogLevel::kInfo, __VA_ARGS__)
#define STRATA_LOG_DEBUG(...) ::strata::log_at(::strata::LogLevel::kDebug, __VA_ARGS__)

}  // namespace strata
