// What every fuzz target checks besides "no crash, no hang, no sanitizer report": a rejection
// is a named error (a message, and a context naming the file, key or value at fault, or a message
// that names the input `source` itself), never an empty Status. Inputs reach readers that take a
// path through an in-memory file (memfd).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/status.h"

namespace strata::fuzz {

// Aborts (a finding) when `status` is an error without a message, or one that names nothing.
inline void check_named(const Status& status, const std::string& source) {
  if (status.is_ok()) return;
  const bool names =
      !status.context().empty() || status.message().find(source) != std::string::npos;
  if (status.message().empty() || !names) {
    std::fprintf(stderr, "unnamed rejection: code %d, message '%s', context '%s'\n",
                 static_cast<int>(status.code()), status.message().c_str(),
                 status.context().c_str());
    std::abort();
  }
}

// Keeps a computed value observable, so the work that produced it is not optimised away.
inline void sink(std::uint64_t value) {
  static volatile std::uint64_t kept = 0;
  kept = kept ^ value;
}

// An in-memory regular file holding `data`, reachable by path() while this object lives.
class MemFile {
 public:
  MemFile(const std::uint8_t* data, std::size_t size) {
    fd_ = ::memfd_create("strata-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    std::size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += static_cast<std::size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace strata::fuzz
