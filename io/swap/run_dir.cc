#include "io/swap/run_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "common/log.h"
#include "io/core/queue_engine.h"
#include "io/swap_space.h"

namespace strata::io::swap {
namespace {

using core::errno_text;

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Whether the regular file `path` starts with `magic`.
bool file_starts_with(const std::string& path, const char* magic) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  const std::size_t n = std::strlen(magic);
  std::vector<char> head(n);
  const ssize_t got = ::pread(fd, head.data(), n, 0);
  ::close(fd);
  return got == static_cast<ssize_t>(n) && std::memcmp(head.data(), magic, n) == 0;
}

// Cleans one stale run folder whose lock this process now holds (`lock_fd`).
void clean_locked(const std::string& run, std::uint32_t uid, StaleCleanup* report) {
  std::unique_ptr<DIR, DirCloser> d(::opendir(run.c_str()));
  if (!d) {
    report->kept.push_back(run + ": cannot list it: " + errno_text(errno));
    return;
  }
  std::vector<std::string> foreign;
  while (struct dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name == "." || name == ".." || name == kLockName) continue;
    const std::string path = run + "/" + name;
    struct stat st {};
    const bool ours = ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == uid &&
                      is_swap_file_name(name) && file_starts_with(path, kFileMagic);
    if (!ours) {
      foreign.push_back(name);
      continue;
    }
    if (::unlink(path.c_str()) == 0) {
      report->freed_bytes += static_cast<std::uint64_t>(st.st_blocks) * 512;
    } else {
      foreign.push_back(name + " (" + errno_text(errno) + ")");
    }
  }
  if (!foreign.empty()) {
    std::string list;
    for (const std::string& f : foreign)
      list += (list.empty() ? "" : ", ") + f;
    report->kept.push_back(run + ": holds files Strata did not make, left in place: " + list);
    return;
  }
  ::unlink((run + "/" + kLockName).c_str());
  if (::rmdir(run.c_str()) == 0) {
    report->removed_dirs.push_back(run);
  } else {
    report->kept.push_back(run + ": cannot remove it: " + errno_text(errno));
  }
}

}  // namespace

std::string run_dir_name(std::uint32_t uid, const std::string& tag) {
  return fmt::format("strata-swap-u{}-{}", uid, tag);
}

std::string staging_dir_name(std::uint32_t uid, const std::string& tag, std::int64_t pid) {
  return fmt::format(".{}.p{}", run_dir_name(uid, tag), pid);
}

std::int64_t staging_dir_pid(const std::string& name, std::uint32_t uid) {
  const std::string prefix = "." + run_dir_name(uid, "");
  const std::size_t dot = name.rfind(".p");
  if (!starts_with(name, prefix) || dot == std::string::npos || dot < prefix.size() ||
      dot + 2 == name.size() || name.size() - dot > 12) {
    return -1;
  }
  std::int64_t pid = 0;
  for (std::size_t i = dot + 2; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    pid = pid * 10 + (name[i] - '0');
  }
  return pid;
}

std::string swap_file_name(const std::string& kind, std::int32_t rank) {
  return fmt::format("strata-{}-r{}.swp", kind, rank);
}

bool is_swap_file_name(const std::string& name) {
  // strata-<kind>-r<digits>.swp with kind in [a-z0-9_]+
  if (!starts_with(name, "strata-") || name.size() < 14) return false;
  if (name.compare(name.size() - 4, 4, ".swp") != 0) return false;
  const std::string middle = name.substr(7, name.size() - 11);  // <kind>-r<digits>
  const std::size_t dash = middle.rfind("-r");
  if (dash == std::string::npos || dash == 0 || dash + 2 == middle.size()) return false;
  for (std::size_t i = 0; i < dash; ++i) {
    const char c = middle[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  for (std::size_t i = dash + 2; i < middle.size(); ++i) {
    if (middle[i] < '0' || middle[i] > '9') return false;
  }
  return true;
}

Result<RunDir> create_run_dir(const std::string& parent, std::uint32_t uid,
                              const std::string& tag) {
  struct stat st {};
  if (::stat(parent.c_str(), &st) != 0) {
    const int err = errno;
    return Status(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                  fmt::format("nvme_path is not usable: {}", errno_text(err)), parent);
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status(ErrorCode::kInvalidArgument, "nvme_path is not a directory", parent);
  }
  // The folder is made under a name of this process's own, with its lock taken and written,
  // and only then renamed to the run's name: a folder with a run's name always has a held lock,
  // so another process cleaning stale folders (clean_stale_swap) never sees one half made. A
  // folder is renamed, not created in place, because a run between mkdir and flock looked
  // stale to another rank starting beside it, which removed it.
  RunDir run;
  run.path = parent + "/" + run_dir_name(uid, tag);
  const std::string staging = parent + "/" + staging_dir_name(uid, tag, ::getpid());
  if (::mkdir(staging.c_str(), 0700) != 0) {
    return Status(ErrorCode::kIo,
                  fmt::format("cannot create the swap folder in {}: {}", parent, errno_text(errno)),
                  staging);
  }
  auto discard_staging = [&] {
    if (run.lock_fd >= 0) ::close(run.lock_fd);
    run.lock_fd = -1;
    ::unlink((staging + "/" + kLockName).c_str());
    ::rmdir(staging.c_str());
  };
  auto give_up = [&](const std::string& what, int err, const std::string& where) {
    discard_staging();
    return Status(ErrorCode::kIo, fmt::format("{}: {}", what, errno_text(err)), where);
  };
  const std::string lock_path = staging + "/" + kLockName;
  run.lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (run.lock_fd < 0) return give_up("cannot create the lock file", errno, lock_path);
  if (::flock(run.lock_fd, LOCK_EX | LOCK_NB) != 0)
    return give_up("cannot lock the lock file", errno, lock_path);
  const std::string text =
      fmt::format("{}uid={}\npid={}\nhost={}\n", kLockMagic, uid, ::getpid(), host_name());
  if (::pwrite(run.lock_fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
    return give_up("cannot write the lock file", errno, lock_path);
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, run.path.c_str(), RENAME_NOREPLACE) != 0) {
    const int err = errno;
    if (err == EEXIST || err == ENOTEMPTY) {
      discard_staging();
      return Status(
          ErrorCode::kIo,
          "a swap folder with this run's name (from its process id) exists and could "
          "not be cleaned: a live run holds it, or it holds files Strata did not make "
          "(see the warning above). Remove those files, or the folder if no run uses it, or give "
          "this run another nvme_path",
          run.path);
    }
    return give_up(fmt::format("cannot create the swap folder in {}", parent), err, run.path);
  }
  return run;
}

Status remove_run_dir(RunDir* run) {
  Status result;
  if (run->lock_fd < 0) return result;
  if (::unlink((run->path + "/" + kLockName).c_str()) != 0 && errno != ENOENT) {
    result = Status(ErrorCode::kIo,
                    fmt::format("cannot remove the lock file: {}", errno_text(errno)), run->path);
  }
  if (::rmdir(run->path.c_str()) != 0 && result.is_ok()) {
    result = Status(ErrorCode::kIo,
                    fmt::format("cannot remove the swap folder: {}", errno_text(errno)), run->path);
  }
  ::close(run->lock_fd);
  run->lock_fd = -1;
  return result;
}

}  // namespace strata::io::swap

namespace strata::io {

StaleCleanup clean_stale_swap(const std::vector<std::string>& dirs, std::uint32_t uid) {
  StaleCleanup report;
  const std::string prefix = fmt::format("strata-swap-u{}-", uid);
  for (const std::string& parent : dirs) {
    std::unique_ptr<DIR, swap::DirCloser> d(::opendir(parent.c_str()));
    if (!d) continue;  // SwapSpace::create reports a missing directory itself
    while (struct dirent* e = ::readdir(d.get())) {
      const std::string name = e->d_name;
      if (!swap::starts_with(name, prefix)) {
        // A folder another process is making (create_run_dir) is its own business until that
        // process has died.
        const std::int64_t pid = swap::staging_dir_pid(name, uid);
        if (pid <= 0 || pid > std::numeric_limits<pid_t>::max()) continue;
        if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
      }
      const std::string run = parent + "/" + name;
      struct stat st {};
      if (::lstat(run.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != uid) {
        report.kept.push_back(run + ": not a folder of this user");
        continue;
      }
      const std::string lock_path = run + "/" + swap::kLockName;
      int fd = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0) {
        // A run that died while making its folder (staging name) or removing it leaves one
        // without a lock; rmdir removes only an empty one.
        if (::rmdir(run.c_str()) == 0) {
          report.removed_dirs.push_back(run);
        } else {
          report.kept.push_back(run + ": no lock file and not empty");
        }
        continue;
      }
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        report.live_dirs.push_back(run);
        ::close(fd);
        continue;
      }
      if (!swap::file_starts_with(lock_path, swap::kLockMagic)) {
        report.kept.push_back(run + ": its lock file is not Strata's");
        ::close(fd);
        continue;
      }
      swap::clean_locked(run, uid, &report);
      ::close(fd);
    }
  }
  return report;
}

}  // namespace strata::io
