#include "sys/memory.h"

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace strata::sys {
namespace {

std::optional<std::uint64_t> limit_bytes(rlim_t value) {
  if (value == RLIM_INFINITY) return std::nullopt;
  return static_cast<std::uint64_t>(value);
}

// Whether this process holds CAP_IPC_LOCK in its effective set (then RLIMIT_MEMLOCK is ignored).
bool has_ipc_lock() {
  __user_cap_header_struct header{};
  header.version = _LINUX_CAPABILITY_VERSION_3;
  header.pid = 0;
  __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  return (data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32))) != 0;
}

}  // namespace

Result<HostMemory> probe_host_memory() {
  std::ifstream in("/proc/meminfo");
  if (!in) return Status(ErrorCode::kIo, "cannot read host memory facts", "/proc/meminfo");
  HostMemory memory;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    std::uint64_t value = 0;
    std::string unit;
    if (!(fields >> key >> value)) continue;
    fields >> unit;
    const std::uint64_t scale = unit == "kB" ? 1024 : 1;
    if (key == "MemTotal:") memory.total_bytes = value * scale;
    if (key == "MemAvailable:") memory.available_bytes = value * scale;
    if (key == "Hugepagesize:") memory.huge_page_bytes = value * scale;
    if (key == "HugePages_Free:") memory.huge_pages_free = value;
  }
  if (memory.total_bytes == 0) {
    return Status(ErrorCode::kIo, "no MemTotal line found", "/proc/meminfo");
  }
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_MEMLOCK, &limit) == 0) {
    memory.memlock_soft_bytes = limit_bytes(limit.rlim_cur);
    memory.memlock_hard_bytes = limit_bytes(limit.rlim_max);
  }
  memory.can_lock_unlimited = has_ipc_lock();
  return memory;
}

}  // namespace strata::sys
