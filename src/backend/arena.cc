// First-fit arena with coalescing free blocks (see arena.h).
#include "backend/arena.h"

#include <fmt/format.h>

#include "common/units.h"

namespace strata::backend {
namespace {
constexpr std::uint64_t kGranule = 256;
}  // namespace

Arena::Arena(std::uint64_t capacity, std::string name, std::string budget_key)
    : capacity_(capacity / kGranule * kGranule),
      name_(std::move(name)),
      budget_key_(std::move(budget_key)) {
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

Result<std::uint64_t> Arena::allocate(std::uint64_t bytes, std::uint64_t alignment,
                                      std::string_view purpose) {
  STRATA_ASSERT(alignment > 0 && (alignment & (alignment - 1)) == 0 && alignment <= 4096);
  alignment = std::max(alignment, kGranule);
  const std::uint64_t size = align_up(std::max<std::uint64_t>(bytes, 1), kGranule);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const std::uint64_t block = it->first;
    const std::uint64_t block_size = it->second;
    const std::uint64_t aligned = align_up(block, alignment);
    if (aligned + size > block + block_size || size > capacity_) continue;
    free_.erase(it);
    if (aligned > block) free_.emplace(block, aligned - block);
    const std::uint64_t end = aligned + size;
    if (end < block + block_size) free_.emplace(end, block + block_size - end);
    allocated_.emplace(aligned, Allocation{aligned, size, size});
    in_use_ += size;
    peak_ = std::max(peak_, in_use_);
    return aligned;
  }
  return Status(
      ErrorCode::kOutOfMemory,
      fmt::format("cannot allocate {} for {}: {} of the {} budget ({}) are in use and "
                  "the largest free block is {}; raise {} or shrink the job (smaller "
                  "micro-batch, shorter sequences, activation checkpointing)",
                  format_bytes(size), purpose, format_bytes(in_use_), format_bytes(capacity_),
                  budget_key_, format_bytes(largest_free_locked()), budget_key_),
      name_);
}

void Arena::free(std::uint64_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(offset);
  STRATA_ASSERT_MSG(it != allocated_.end(), "Arena::free of an offset it did not hand out");
  std::uint64_t begin = it->second.begin;
  std::uint64_t size = it->second.size;
  in_use_ -= it->second.bytes;
  allocated_.erase(it);
  // Coalesce with the following and the preceding free block.
  auto next = free_.lower_bound(begin);
  if (next != free_.end() && next->first == begin + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(begin, size);
}

std::uint64_t Arena::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_;
}

std::uint64_t Arena::bytes_peak() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

std::uint64_t Arena::largest_free_block() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return largest_free_locked();
}

std::uint64_t Arena::largest_free_locked() const {
  std::uint64_t largest = 0;
  for (const auto& [offset, size] : free_)
    largest = std::max(largest, size);
  return largest;
}

}  // namespace strata::backend
