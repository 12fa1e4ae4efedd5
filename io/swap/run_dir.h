// A run's swap folder: creating it with its lock, removing it at exit, and recognising (and
// cleaning) the folders that crashed runs left behind. Only SwapSpace uses this.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace strata::io::swap {

inline constexpr char kLockName[] = "strata-swap.lock";
inline constexpr char kLockMagic[] = "strata-swap v1\n";  // first line of every lock file
inline constexpr char kFileMagic[] = "STRATA-SWAP v1 ";   // start of every swap file's header

// "strata-swap-u<uid>-<tag>".
std::string run_dir_name(std::uint32_t uid, const std::string& tag);
// ".strata-swap-u<uid>-<tag>.p<pid>": where process `pid` makes the folder before it takes the
// run's name (create_run_dir).
std::string staging_dir_name(std::uint32_t uid, const std::string& tag, std::int64_t pid);
// The process id in a staging folder's name; -1 when `name` is not one of uid's.
std::int64_t staging_dir_pid(const std::string& name, std::uint32_t uid);
// "strata-<kind>-r<rank>.swp".
std::string swap_file_name(const std::string& kind, std::int32_t rank);
// Whether `name` has the shape swap_file_name() gives.
bool is_swap_file_name(const std::string& name);

struct RunDir {
  std::string path;
  int lock_fd = -1;  // open and flock()ed while the run lives
};

// Creates `parent`/run_dir_name(uid, tag) (0700) and its lock file, and locks it. Errors name
// the directory: missing (kNotFound), read-only or not permitted (kIo), held by a live run.
Result<RunDir> create_run_dir(const std::string& parent, std::uint32_t uid, const std::string& tag);

// Unlinks the lock file, removes the (by then empty) folder and drops the lock.
Status remove_run_dir(RunDir* dir);

}  // namespace strata::io::swap
