// The run's folders (see run_directories.h).
#include "train/run_directories.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/root.h"

namespace strata::train {
namespace fs = std::filesystem;
namespace {

// Creates the missing folders of `path` (each with `mode`); an existing component that is not a
// directory is an error naming `key`.
Status create_folders(const std::string& path, mode_t mode, const char* key) {
  if (path.empty()) return Status::ok();
  std::string prefix;
  std::size_t at = 0;
  while (at <= path.size()) {
    std::size_t slash = path.find('/', at);
    if (slash == std::string::npos) slash = path.size();
    prefix = path.substr(0, slash);
    at = slash + 1;
    if (prefix.empty() || prefix == "." || prefix == "..") continue;
    struct stat st {};
    if (::stat(prefix.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        return Status(
            ErrorCode::kConfig,
            fmt::format("'{}' exists and is not a directory; give a directory path", prefix), key);
      }
      continue;
    }
    if (errno != ENOENT || (::mkdir(prefix.c_str(), mode) != 0 && errno != EEXIST)) {
      return Status(ErrorCode::kConfig,
                    fmt::format("cannot create the folder '{}': {}", prefix, std::strerror(errno)),
                    key);
    }
  }
  return Status::ok();
}

// What of another run `config`'s output_dir holds, for the message; empty when nothing.
Result<std::vector<std::string>> other_run(const config::Config& config) {
  const std::string& out = config.strata.output_dir;
  const std::string root = checkpoint_root(config);
  std::vector<std::string> found;
  STRATA_ASSIGN_OR_RETURN(const bool latest, checkpoint::path_exists(root + "/latest"));
  STRATA_ASSIGN_OR_RETURN(const std::vector<std::int64_t> steps,
                          checkpoint::list_checkpoints(root));
  if (!steps.empty()) {
    found.push_back(fmt::format("{} checkpoint(s) in {} (steps {} to {})", steps.size(), root,
                                steps.front(), steps.back()));
  } else if (latest) {
    found.push_back(root + "/latest");
  }
  struct stat st {};
  STRATA_ASSIGN_OR_RETURN(const bool metrics, checkpoint::path_exists(out + "/metrics.jsonl", &st));
  if (metrics && st.st_size > 0) found.push_back(out + "/metrics.jsonl");
  STRATA_ASSIGN_OR_RETURN(const bool final_model, checkpoint::path_exists(out + "/final"));
  if (final_model) found.push_back(out + "/final");
  return found;
}

// `path` with links, `.`, `..` and a trailing slash resolved; empty when that fails.
fs::path canonical_dir(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::path(path), ec);
  if (ec) return {};
  if (!p.has_filename() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return p;
}

// Whether two paths name the same directory.
bool same_directory(const std::string& a, const std::string& b) {
  const fs::path x = canonical_dir(a);
  return !x.empty() && x == canonical_dir(b);
}

// Whether `resume_from` names a checkpoint inside `root` (the same run continuing).
bool resumes_within(const std::string& resume_from, const std::string& root) {
  Result<std::string> dir = checkpoint::find_checkpoint(resume_from);
  if (!dir.is_ok()) return false;
  std::error_code a, b;
  const fs::path parent = fs::weakly_canonical(fs::path(*dir), a).parent_path();
  const fs::path here = fs::weakly_canonical(fs::path(root), b);
  return !a && !b && parent == here;
}

}  // namespace

std::string checkpoint_root(const config::Config& config) {
  return config.strata.checkpoint_dir.empty() ? config.strata.output_dir + "/checkpoints"
                                              : config.strata.checkpoint_dir;
}

Status claim_output_dir(const config::Config& config, bool remove,
                        std::vector<std::string>* removed) {
  const config::StrataConfig& s = config.strata;
  const std::string root = checkpoint_root(config);
  // With overwrite, only the rank that removes looks (the others would race its removals).
  if (s.overwrite_output_dir && !remove) return Status::ok();
  STRATA_ASSIGN_OR_RETURN(const std::vector<std::string> found, other_run(config));
  if (found.empty()) return Status::ok();
  if (!s.resume_from.empty() && resumes_within(s.resume_from, root)) return Status::ok();
  if (!s.overwrite_output_dir) {
    std::string what;
    for (const std::string& f : found)
      what += (what.empty() ? "" : ", ") + f;
    return Status(
        ErrorCode::kConfig,
        fmt::format("{} holds another run ({}); a fresh run would replace it. Continue it with "
                    "--set strata.resume_from={}, write elsewhere with --set "
                    "strata.output_dir=DIR, or replace it with --set "
                    "strata.overwrite_output_dir=true (strata train --overwrite)",
                    s.output_dir, what, root),
        "strata.output_dir");
  }
  if (!remove) return Status::ok();
  // Overwriting: the old run's checkpoints go, so that `latest` and rotation only ever see this
  // run's; metrics.jsonl is truncated when it is opened.
  std::vector<std::string> doomed = {root + "/latest", s.output_dir + "/final"};
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0)
      name = name.substr(0, name.size() - 4);
    if (checkpoint::checkpoint_step_of(name) >= 0) doomed.push_back(it->path().string());
  }
  for (const std::string& path : doomed) {
    std::error_code rm;
    if (fs::remove_all(path, rm) > 0 && removed != nullptr) removed->push_back(path);
    if (rm) {
      return Status(ErrorCode::kIo, "cannot remove the old run's file: " + rm.message(), path);
    }
  }
  return Status::ok();
}

Result<std::vector<DirLock>> lock_run_directories(const config::Config& config, int rank) {
  const config::StrataConfig& s = config.strata;
  const std::string root = checkpoint_root(config);
  const char* root_key = s.checkpoint_dir.empty() ? "strata.output_dir" : "strata.checkpoint_dir";
  const std::string advice =
      "One run at a time may write there: wait for that run to end, or give this one another "
      "strata.output_dir (strata train --output_dir DIR). A lock file left by a process that has "
      "ended is taken over by itself";
  std::vector<DirLock> locks;
  auto lock = [&](const std::string& dir, const std::string& name, const char* key) -> Status {
    LockRequest request;
    request.dir = dir;
    request.name = name;
    request.context = key;
    request.advice = advice;
    STRATA_ASSIGN_OR_RETURN(DirLock held, DirLock::acquire(request));
    locks.push_back(std::move(held));
    return Status::ok();
  };
  if (rank == 0) {
    STRATA_TRY(lock(s.output_dir, dir_lock_name(0), "strata.output_dir"));
    if (!same_directory(root, s.output_dir)) STRATA_TRY(lock(root, dir_lock_name(0), root_key));
  } else {
    STRATA_TRY(lock(root, dir_lock_name(rank), root_key));
  }
  return locks;
}

Result<DirLock> lock_resume_root(const config::Config& config, const std::string& resume_dir,
                                 int rank) {
  const fs::path dir = canonical_dir(resume_dir);
  const std::string root = dir.empty() ? std::string() : dir.parent_path().string();
  if (root.empty() || same_directory(root, checkpoint_root(config))) return DirLock();
  LockRequest request;
  request.dir = root;
  request.name = dir_lock_name(rank);
  request.context = "strata.resume_from";
  request.advice = fmt::format(
      "That run is writing (and rotating) the checkpoints of {}: resume from it once it has "
      "ended, or copy the checkpoint {} elsewhere first",
      root, resume_dir);
  return DirLock::acquire(request);
}

Status check_resumable(const checkpoint::TrainerCounters& c, const config::Config& config,
                       const std::string& dir) {
  if (c.step >= config.strata.train_steps) {
    return Status(ErrorCode::kConfig,
                  fmt::format("the checkpoint {} is at step {} and strata.train_steps is {}: "
                              "nothing is left to train; raise strata.train_steps above {} to "
                              "train further, or take its model with `strata convert {} OUT_DIR`",
                              dir, c.step, config.strata.train_steps, c.step, dir),
                  "strata.train_steps");
  }
  const std::string manifest = dir + "/trainer_state.json";
  const config::Fp16Config& fp16 = config.fp16;
  const bool dynamic = fp16.enabled && fp16.loss_scale == 0.0;
  const double fixed = fp16.enabled ? fp16.loss_scale : 1.0;
  if (!dynamic && c.scaler.scale != fixed) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("loss_scaler.scale is {}, but this run's scale is fixed at {}",
                              c.scaler.scale, fixed),
                  manifest);
  }
  if (dynamic && (c.scaler.scale < fp16.min_loss_scale || c.scaler.hysteresis > fp16.hysteresis)) {
    return Status(
        ErrorCode::kCorrupt,
        fmt::format("loss_scaler scale {} and hysteresis {} do not fit "
                    "fp16.min_loss_scale {} and fp16.hysteresis {}",
                    c.scaler.scale, c.scaler.hysteresis, fp16.min_loss_scale, fp16.hysteresis),
        manifest);
  }
  return Status::ok();
}

Status prepare_run_directories(const config::Config& config) {
  const config::StrataConfig& s = config.strata;
  STRATA_TRY(create_folders(s.output_dir, 0777, "strata.output_dir"));
  STRATA_TRY(
      create_folders(checkpoint_root(config), 0777,
                     s.checkpoint_dir.empty() ? "strata.output_dir" : "strata.checkpoint_dir"));
  if (!s.trace_file.empty()) {
    const std::string folder = fs::path(s.trace_file).parent_path().string();
    STRATA_TRY(create_folders(folder, 0700, "strata.trace_file"));
  }
  return prepare_nvme_paths(config);
}

Status prepare_nvme_folders(const std::vector<std::string>& paths, const char* key) {
  for (const std::string& path : paths) {
    STRATA_TRY(create_folders(path, 0700, key));
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IWOTH) != 0 &&
        (st.st_mode & S_ISVTX) == 0) {
      return Status(ErrorCode::kConfig,
                    fmt::format("'{}' may be written by every user and has no sticky bit, so "
                                "another user could replace this run's swap files; give a "
                                "folder of your own (it is created with mode 0700 when missing)",
                                path),
                    key);
    }
  }
  return Status::ok();
}

Status prepare_nvme_paths(const config::Config& config) {
  const config::ZeroConfig& z = config.zero_optimization;
  if (z.offload_param.device == config::OffloadDevice::kNvme) {
    STRATA_TRY(prepare_nvme_folders(z.offload_param.nvme_path,
                                    "zero_optimization.offload_param.nvme_path"));
  }
  if (z.offload_optimizer.device == config::OffloadDevice::kNvme) {
    STRATA_TRY(prepare_nvme_folders(z.offload_optimizer.nvme_path,
                                    "zero_optimization.offload_optimizer.nvme_path"));
  }
  return Status::ok();
}

}  // namespace strata::train
