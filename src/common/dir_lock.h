// One process at a time in a directory: the lock a training run holds on its output_dir and its
// checkpoint root, and `strata convert` on its OUT_DIR, for as long as it writes there.
//
// The lock is a file in the directory (kDirLockName, or one per rank: dir_lock_name(rank)). Two
// ways to hold it, chosen by what the file system supports:
//   - flock (every local file system, NFS v4, Lustre with flock mounts): the file is open and
//     flock(LOCK_EX)ed for the holder's life. The kernel drops the lock when the process ends in
//     any way (kill -9 included), so a lock is never stale: a file left behind by a dead process
//     is simply taken. Release unlinks the file while still holding it; a process that opened the
//     old file meanwhile sees that the path no longer names what it locked and tries again, so two
//     processes never both believe they hold it.
//   - an exclusive file (where flock fails with ENOLCK, EOPNOTSUPP or ENOSYS: some network file
//     systems): the holder's description is written to a private file and link()ed to the lock's
//     name, which succeeds for one process only (atomic on NFS too). A lock file whose holder is on
//     this host and no longer alive (its pid gone, or reused: the start time differs) is taken
//     over; one held from another host cannot be checked and is refused, naming the host and
//     saying how to clear it.
// Either way the file holds the holder's description (pid, host, start time, command line), which
// a refused process names in its message. docs/reliability.md states what each way guarantees.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace strata {

inline constexpr char kDirLockName[] = ".strata.lock";

// ".strata.lock" for rank 0, ".strata.rank<R>.lock" for the others.
std::string dir_lock_name(int rank);

// A lock file's holder, as it describes itself.
struct LockHolder {
  std::int64_t pid = 0;
  std::string host;
  std::string started;            // "2026-11-27 21:03:04 UTC"
  std::uint64_t start_ticks = 0;  // the process's start, in clock ticks after boot (/proc)
  std::string command;            // its command line, arguments joined by spaces
  // "pid 123 on host h, started 2026-11-27 21:03:04 UTC: strata train --config c.json".
  std::string describe() const;
};

enum class LockMode : std::uint8_t { kFlock, kExclusiveFile };
const char* to_string(LockMode mode);

struct LockRequest {
  std::string dir;  // an existing directory
  std::string name = kDirLockName;
  std::string context;  // what the errors name: the key or argument that chose `dir`
  ErrorCode busy_code = ErrorCode::kConfig;  // the error when another process holds the lock
  std::string advice;  // what the user can do about a held lock, appended to that error
};

class DirLock {
 public:
  DirLock() = default;  // holds nothing
  ~DirLock();
  DirLock(DirLock&& other) noexcept;
  DirLock& operator=(DirLock&& other) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  // Takes the lock `request.dir`/`request.name` for this process, never waiting for it. Errors:
  // `busy_code` when another process holds it ("<dir> is in use by pid P on host H, started T:
  // COMMAND. <advice>"), kIo naming the file for anything the OS refused.
  static Result<DirLock> acquire(const LockRequest& request);

  bool held() const { return fd_ >= 0 || file_held_; }
  const std::string& path() const { return path_; }
  LockMode mode() const { return mode_; }

  // Gives the lock up and removes its file (nothing when not held). Errors are not reported:
  // a lock file that cannot be removed is taken by the next process all the same (flock), or
  // named as this process's, which is no longer alive (exclusive file).
  void release();

 private:
  std::string path_;
  LockMode mode_ = LockMode::kFlock;
  int fd_ = -1;             // kFlock: the open, locked file
  LockHolder self_;         // kExclusiveFile: what this process wrote, to check before removing
  bool file_held_ = false;  // kExclusiveFile: the file is this process's
};

// This process as a lock holder.
LockHolder this_process();

// Parses a lock file's text; pid 0 when it is not one.
LockHolder parse_lock_holder(const std::string& text);

}  // namespace strata
