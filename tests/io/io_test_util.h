// Helpers for the io tests: aligned buffers, data stamped with its own file offset (so a block
// read back from the wrong place is caught), and small file systems mounted for one test.
#pragma once

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace strata::testing {

class AlignedBuffer {
 public:
  explicit AlignedBuffer(std::size_t bytes, std::size_t alignment = 4096) : bytes_(bytes) {
    void* raw = nullptr;
    if (::posix_memalign(&raw, alignment, bytes) != 0) std::abort();
    data_ = static_cast<std::uint8_t*>(raw);
    std::memset(data_, 0, bytes);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::uint8_t* data() const { return data_; }
  std::size_t size() const { return bytes_; }

 private:
  std::uint8_t* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Fills `bytes` (a multiple of 8) with words that encode their own file offset and `tag`.
inline void stamp(std::uint8_t* data, std::size_t bytes, std::uint64_t file_offset,
                  std::uint64_t tag) {
  for (std::size_t i = 0; i < bytes; i += 8) {
    const std::uint64_t word = (file_offset + i) * 0x9E3779B97F4A7C15ull ^ tag;
    std::memcpy(data + i, &word, 8);
  }
}

// The first byte offset in `data` that does not hold its stamp, or -1 when all do.
inline std::int64_t first_unstamped(const std::uint8_t* data, std::size_t bytes,
                                    std::uint64_t file_offset, std::uint64_t tag) {
  for (std::size_t i = 0; i < bytes; i += 8) {
    const std::uint64_t want = (file_offset + i) * 0x9E3779B97F4A7C15ull ^ tag;
    std::uint64_t got = 0;
    std::memcpy(&got, data + i, 8);
    if (got != want) return static_cast<std::int64_t>(i);
  }
  return -1;
}

// A file system mounted on `dir` for the life of the object (tests run as root here); ok()
// is false, with why(), where mounting is not allowed.
class ScopedMount {
 public:
  ScopedMount(const std::string& dir, const char* type, unsigned long flags, const char* data) {
    dir_ = dir;
    if (::mount(type, dir.c_str(), type, flags, data) == 0) {
      mounted_ = true;
    } else {
      why_ = std::string("mount -t ") + type + " failed: " + std::strerror(errno);
    }
  }
  ~ScopedMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  ScopedMount(const ScopedMount&) = delete;
  ScopedMount& operator=(const ScopedMount&) = delete;
  bool ok() const { return mounted_; }
  const std::string& why() const { return why_; }

 private:
  std::string dir_;
  bool mounted_ = false;
  std::string why_;
};

}  // namespace strata::testing
