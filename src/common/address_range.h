// An address range with nothing behind it: reserved (mmap PROT_NONE, MAP_NORESERVE), never
// backed, released when its owner goes. It names a buffer whose values live elsewhere (an
// activation kept in 16 bits alone, Ops::pair_narrow_alone, is keyed by the fp32 address range it
// would have had), so that ranges of such keys never overlap each other or any real buffer: host
// allocations and a CUDA device's unified addresses are mapped by the same kernel, which hands the
// range to no one else. Any access to it faults, on the CPU and on a GPU, rather than reading or
// writing someone else's bytes.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace strata {

class AddressRange {
 public:
  // Reserves `bytes` (rounded up to pages; at least one); `what` names it in errors (kOutOfMemory
  // when the process has no address space left for it).
  static Result<AddressRange> reserve(std::uint64_t bytes, std::string_view what);

  AddressRange() = default;
  ~AddressRange();
  AddressRange(AddressRange&& other) noexcept;
  AddressRange& operator=(AddressRange&& other) noexcept;
  AddressRange(const AddressRange&) = delete;
  AddressRange& operator=(const AddressRange&) = delete;

  void* begin() const { return begin_; }
  std::uint64_t size() const { return bytes_; }

 private:
  void* begin_ = nullptr;
  std::uint64_t bytes_ = 0;
};

}  // namespace strata
