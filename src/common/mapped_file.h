// A regular file mapped whole and read-only, unmapped when its owner goes: the one mapping the
// token files, their mask files and safetensors files are read through. Only a regular file is
// mapped (open_regular_file: a FIFO or a device is refused, never waited on), and every error
// names the file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strata {

class MappedFile {
 public:
  // How the bytes will be read: kRandom turns the kernel's read-ahead off (madvise).
  enum class Access { kNormal, kRandom };

  // Opens `path` and maps it; `what` names the file in errors ("the data file"). An empty file
  // maps to no bytes. Errors as open_regular_file's, or kIo when mmap fails.
  static Result<MappedFile> open(const std::string& path, std::string_view what,
                                 Access access = Access::kNormal);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The file's bytes, valid while this object lives (a move keeps them where they are).
  const std::uint8_t* bytes() const { return static_cast<const std::uint8_t*>(map_); }
  // The file's size when it was mapped.
  std::uint64_t size() const { return bytes_; }

 private:
  void* map_ = nullptr;
  std::uint64_t bytes_ = 0;
};

}  // namespace strata
