#include "common/address_range.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "common/units.h"

namespace strata {

Result<AddressRange> AddressRange::reserve(std::uint64_t bytes, std::string_view what) {
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t size = (std::max<std::uint64_t>(bytes, 1) + page - 1) / page * page;
  void* p = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return Status(ErrorCode::kOutOfMemory,
                  fmt::format("cannot reserve {} of address space for {}: {}", format_bytes(size),
                              what, std::strerror(errno)),
                  std::string(what));
  }
  AddressRange range;
  range.begin_ = p;
  range.bytes_ = size;
  return range;
}

AddressRange::~AddressRange() {
  if (begin_ != nullptr) ::munmap(begin_, bytes_);
}

AddressRange::AddressRange(AddressRange&& other) noexcept
    : begin_(std::exchange(other.begin_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

AddressRange& AddressRange::operator=(AddressRange&& other) noexcept {
  if (this != &other) {
    if (begin_ != nullptr) ::munmap(begin_, bytes_);
    begin_ = std::exchange(other.begin_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace strata
