// Writing files that survive a crash and a power cut. A file is written under a temporary name,
// fsync'ed, closed and renamed over its final name, and the directory is fsync'ed after the
// rename, so that after a crash the final name holds either the old content or the whole new one
// (never a torn file), and once the call returned the new content survives a power cut. Every
// error names the file and says what failed (a full disk is kNoSpace), and each step passes a
// crash point (common/fault_points.h) so tests can stop a write anywhere.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strata {

class DurableFile {
 public:
  // Creates (truncates) `path` for writing with `mode` (less the umask).
  static Result<DurableFile> create(const std::string& path, mode_t mode = 0644);
  ~DurableFile();  // closes a file still open (errors ignored: call close() to see them)
  DurableFile(DurableFile&& other) noexcept;
  DurableFile& operator=(DurableFile&&) = delete;
  DurableFile(const DurableFile&) = delete;

  // Writes all `bytes`, resuming short writes and retrying EINTR a bounded number of times.
  Status write(const void* data, std::uint64_t bytes);
  // fsync: the bytes written so far are on stable storage when it returns ok.
  Status sync();
  // Closes the file (a close error is reported: on NFS it can be the first sign of a full disk).
  Status close();

  const std::string& path() const { return path_; }
  std::uint64_t bytes_written() const { return written_; }

 private:
  DurableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
  std::uint64_t written_ = 0;
};

// fsync of a directory: entries created, renamed or removed in it are durable when it returns.
Status sync_directory(const std::string& dir);

// rename(from, to), then fsync of the directory holding `to` (and of `from`'s when it differs).
Status rename_durably(const std::string& from, const std::string& to);

// Writes `text` to `path` as described above (path + ".tmp", fsync, rename, fsync directory).
Status write_file_atomically(const std::string& path, std::string_view text, mode_t mode = 0644);

// "the file system is full" style text for an errno from writing.
ErrorCode error_code_for_write(int err);

}  // namespace strata
