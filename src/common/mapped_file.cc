// Read-only mappings of whole files (see mapped_file.h).
#include "common/mapped_file.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/bounded_read.h"

namespace strata {

Result<MappedFile> MappedFile::open(const std::string& path, std::string_view what, Access access) {
  STRATA_ASSIGN_OR_RETURN(const RegularFile opened, open_regular_file(path, what));
  MappedFile file;
  if (opened.bytes == 0) {
    // mmap refuses a length of 0; the caller says what an empty file means to it.
    ::close(opened.fd);
    return file;
  }
  void* map = ::mmap(nullptr, opened.bytes, PROT_READ, MAP_PRIVATE, opened.fd, 0);
  const int map_err = errno;
  // The mapping keeps the file; the descriptor is not needed past this point.
  ::close(opened.fd);
  if (map == MAP_FAILED) {
    return Status(ErrorCode::kIo, fmt::format("mmap failed: {}", std::strerror(map_err)), path);
  }
  file.map_ = map;
  file.bytes_ = opened.bytes;
  // Advice only: a kernel that ignores it reads the same bytes, so its result does not matter.
  if (access == Access::kRandom) ::madvise(map, opened.bytes, MADV_RANDOM);
  return file;
}

MappedFile::~MappedFile() {
  if (map_ != nullptr) ::munmap(map_, bytes_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) ::munmap(map_, bytes_);
    map_ = std::exchange(other.map_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace strata
