// FastPaths (see fast_path.h).
#include "backend/fast_path.h"

#include <fmt/format.h>
#include <json/value.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "common/log.h"

namespace strata::backend {
namespace {

std::mutex g_fail_mutex;
std::optional<std::string> g_fail_for_test;

// The name the test seam makes fail, from fail_fast_path_for_test() or the environment.
std::optional<std::string> failing_name() {
  {
    std::lock_guard<std::mutex> lock(g_fail_mutex);
    if (g_fail_for_test) return g_fail_for_test;
  }
  const char* env = std::getenv("STRATA_TEST_FAST_PATH_FAIL");
  if (env != nullptr && *env != '\0') return std::string(env);
  return std::nullopt;
}

// Whether `name` contains one of the comma-separated parts of `failing`.
bool planted_in(const std::string& name, const std::string& failing) {
  std::size_t begin = 0;
  while (begin <= failing.size()) {
    const std::size_t end = std::min(failing.find(',', begin), failing.size());
    const std::string part = failing.substr(begin, end - begin);
    if (!part.empty() && name.find(part) != std::string::npos) return true;
    begin = end + 1;
  }
  return false;
}

}  // namespace

void fail_fast_path_for_test(std::optional<std::string> name_contains) {
  std::lock_guard<std::mutex> lock(g_fail_mutex);
  g_fail_for_test = std::move(name_contains);
}

FastPaths::FastPaths(Warn warn) : warn_(std::move(warn)) {
  if (!warn_) warn_ = [](const std::string& message) { STRATA_LOG_WARN("{}", message); };
}

FastPath* FastPaths::find(const std::string& name) {
  for (FastPath& path : paths_)
    if (path.name == name) return &path;
  return nullptr;
}

bool FastPaths::active(const std::string& name) const {
  for (const FastPath& path : paths_)
    if (path.name == name) return path.active;
  return false;
}

void FastPaths::warn_off(const FastPath& path) {
  warn_(fmt::format("fast path {} is off: {}; instead: {}", path.name, path.detail, path.replaces));
}

bool FastPaths::adopt(const std::string& name, const std::string& replaces,
                      const std::string& covers, const std::function<Status()>& check) {
  STRATA_ASSERT(find(name) == nullptr);
  FastPath path{name, replaces, false, ""};
  const std::optional<std::string> failing = failing_name();
  Status result = Status::ok();
  if (failing && planted_in(name, *failing)) {
    result = Status(ErrorCode::kInternal,
                    fmt::format("a mismatch planted by STRATA_TEST_FAST_PATH_FAIL={}", *failing));
  } else {
    result = check();
  }
  if (result.is_ok()) {
    path.active = true;
    path.detail = covers;
  } else {
    path.detail = fmt::format("its check failed: {}", result.to_string());
  }
  paths_.push_back(std::move(path));
  if (!paths_.back().active) warn_off(paths_.back());
  return paths_.back().active;
}

void FastPaths::not_applicable(const std::string& name, const std::string& replaces,
                               const std::string& reason) {
  STRATA_ASSERT(find(name) == nullptr);
  paths_.push_back(FastPath{name, replaces, false, fmt::format("not applicable: {}", reason)});
}

void FastPaths::disable(const std::string& name, const std::string& reason) {
  FastPath* path = find(name);
  STRATA_ASSERT(path != nullptr);
  if (!path->active) return;
  path->active = false;
  path->detail = reason;
  warn_off(*path);
}

Json::Value fast_paths_json(const std::vector<FastPath>& paths) {
  Json::Value list(Json::arrayValue);
  for (const FastPath& path : paths) {
    Json::Value p;
    p["name"] = path.name;
    p["active"] = path.active;
    p["replaces"] = path.replaces;
    p["detail"] = path.detail;
    if (path.uses >= 0) p["uses"] = Json::Int64(path.uses);
    if (path.declined >= 0) p["declined"] = Json::Int64(path.declined);
    list.append(p);
  }
  return list;
}

std::string fast_paths_text(const std::vector<FastPath>& paths) {
  std::string text;
  for (const FastPath& path : paths) {
    text +=
        path.active
            ? fmt::format("  {}: on ({}), instead of {}\n", path.name, path.detail, path.replaces)
            : fmt::format("  {}: off: {}; instead: {}\n", path.name, path.detail, path.replaces);
  }
  return text;
}

}  // namespace strata::backend
