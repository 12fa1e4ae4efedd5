// A first-fit allocator over one fixed region of `capacity` bytes: the device memory of a backend
// under its hard budget. It only hands out offsets; the backend owns the memory itself (a host
// mapping on the CPU backend, one cudaMalloc on CUDA). Free blocks coalesce with their
// neighbours. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strata::backend {

class Arena {
 public:
  // `name` ("device arena") and `budget_key` ("strata.device_bytes_max") appear in errors.
  Arena(std::uint64_t capacity, std::string name, std::string budget_key);

  // The offset of `bytes` (rounded up to 256) aligned to `alignment` (a power of two, <= 4096,
  // relative to a 4096-aligned base). kOutOfMemory when no free block fits, naming the budget,
  // what is in use, the largest free block and `purpose`.
  Result<std::uint64_t> allocate(std::uint64_t bytes, std::uint64_t alignment,
                                 std::string_view purpose);
  // Returns an allocation made by allocate(); asserts on an offset it did not hand out.
  void free(std::uint64_t offset);

  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t bytes_in_use() const;
  std::uint64_t bytes_peak() const;
  std::uint64_t largest_free_block() const;

 private:
  std::uint64_t largest_free_locked() const;

  struct Allocation {
    std::uint64_t begin;  // start of the block taken (before alignment)
    std::uint64_t size;   // bytes taken from the free list
    std::uint64_t bytes;  // bytes counted as in use
  };
  const std::uint64_t capacity_;
  const std::string name_;
  const std::string budget_key_;
  mutable std::mutex mutex_;
  std::map<std::uint64_t, std::uint64_t> free_;    // offset -> size
  std::map<std::uint64_t, Allocation> allocated_;  // aligned offset -> allocation
  std::uint64_t in_use_ = 0;
  std::uint64_t peak_ = 0;
};

}  // namespace strata::backend
