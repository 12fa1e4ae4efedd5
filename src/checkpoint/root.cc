// A checkpoint root's steps, `latest` and rotation (see root.h), and find_checkpoint.
#include "checkpoint/root.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "common/bounded_read.h"
#include "common/log.h"

namespace strata::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr std::uint64_t kLatestBytesMax = 4096;

}  // namespace

Result<bool> path_exists(const std::string& path, struct stat* st) {
  struct stat local {};
  if (::lstat(path.c_str(), st != nullptr ? st : &local) == 0) return true;
  const int err = errno;
  if (err == ENOENT || err == ENOTDIR) return false;
  return Status(ErrorCode::kIo, fmt::format("cannot use the path: {}", std::strerror(err)), path);
}

std::int64_t checkpoint_step_of(const std::string& name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.size() < kPrefix.size() + 8 || name.size() > kPrefix.size() + 15 ||
      name.compare(0, kPrefix.size(), kPrefix) != 0) {
    return -1;
  }
  std::int64_t step = 0;
  for (std::size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

Result<std::vector<std::int64_t>> list_checkpoints(const std::string& root) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  fs::directory_iterator it(root, ec);
  if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) return steps;
  for (fs::directory_iterator end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::int64_t step = checkpoint_step_of(name);
    std::error_code ignored;
    if (step >= 0 && fs::is_regular_file(it->path() / "trainer_state.json", ignored))
      steps.push_back(step);
  }
  if (ec) return Status(ErrorCode::kIo, "cannot list the checkpoints: " + ec.message(), root);
  std::sort(steps.begin(), steps.end());
  return steps;
}

Status rotate_checkpoints(const std::string& root, int keep_last, std::int64_t current_step) {
  if (keep_last <= 0) return Status::ok();
  Result<std::vector<std::int64_t>> steps = list_checkpoints(root);
  if (!steps.is_ok()) {
    STRATA_LOG_WARN("checkpoint rotation skipped: {}", steps.status().to_string());
    return Status::ok();
  }
  std::vector<std::int64_t> older;
  for (std::int64_t s : *steps) {
    if (s < current_step) older.push_back(s);
  }
  // The current checkpoint counts as one of the kept.
  const std::size_t keep_older = static_cast<std::size_t>(keep_last - 1);
  std::vector<std::string> doomed;
  for (std::size_t i = 0; i + keep_older < older.size(); ++i)
    doomed.push_back(checkpoint_dir(root, older[i]));
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      const std::int64_t torn = checkpoint_step_of(name.substr(0, name.size() - 4));
      if (torn >= 0 && torn < current_step) doomed.push_back(it->path().string());
    }
  }
  for (const std::string& dir : doomed) {
    std::error_code rm;
    fs::remove_all(dir, rm);
    if (rm) STRATA_LOG_WARN("checkpoint rotation could not remove {}: {}", dir, rm.message());
  }
  return Status::ok();
}

Result<std::string> find_checkpoint(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(const bool here, path_exists(path + "/trainer_state.json"));
  if (here) return path;
  const std::string latest = path + "/latest";
  STRATA_ASSIGN_OR_RETURN(const bool has_latest, path_exists(latest));
  if (has_latest) {
    STRATA_ASSIGN_OR_RETURN(std::string name,
                            read_regular_file(latest, kLatestBytesMax, "the latest file"));
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
      name.pop_back();
    if (checkpoint_step_of(name) < 0) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("names '{}'; valid: a step directory name such as step_00000042",
                                name.substr(0, 64)),
                    latest);
    }
    STRATA_ASSIGN_OR_RETURN(const bool complete,
                            path_exists(path + "/" + name + "/trainer_state.json"));
    if (!complete) {
      return Status(
          ErrorCode::kNotFound,
          fmt::format("names {}, which holds no trainer_state.json (removed or moved?)", name),
          latest);
    }
    return path + "/" + name;
  }
  return Status(ErrorCode::kNotFound,
                "no checkpoint here: expected trainer_state.json, or a 'latest' file naming a "
                "checkpoint directory",
                path);
}

std::string newer_checkpoints_note(const std::string& root, std::int64_t step) {
  Result<std::vector<std::int64_t>> steps = list_checkpoints(root);
  if (!steps.is_ok() || steps->empty() || steps->back() <= step) return {};
  return fmt::format(
      "{} holds checkpoints up to step {}, newer than step {} resumed from: each is "
      "replaced when this run checkpoints at its step",
      root, steps->back(), step);
}

}  // namespace strata::checkpoint
