// Host memory facts: what the kernel reports in /proc/meminfo and what this process may pin
// (RLIMIT_MEMLOCK, `ulimit -l`). Pinned staging buffers count against both.
#pragma once

#include <cstdint>
#include <optional>

#include "common/status.h"

namespace strata::sys {

struct HostMemory {
  std::uint64_t total_bytes = 0;      // MemTotal
  std::uint64_t available_bytes = 0;  // MemAvailable: what can be allocated without swapping
  std::uint64_t huge_page_bytes = 0;  // Hugepagesize
  std::uint64_t huge_pages_free = 0;  // HugePages_Free
  // RLIMIT_MEMLOCK soft and hard limits; nullopt means unlimited.
  std::optional<std::uint64_t> memlock_soft_bytes;
  std::optional<std::uint64_t> memlock_hard_bytes;
  bool can_lock_unlimited = false;  // CAP_IPC_LOCK (root): the limit does not apply
};

// Reads /proc/meminfo and getrlimit(RLIMIT_MEMLOCK). kIo when /proc/meminfo cannot be read.
Result<HostMemory> probe_host_memory();

}  // namespace strata::sys
