// What this machine's I/O stack can do, as plain facts: io/probe.h finds them (it runs the rings
// and the O_DIRECT files, a layer above), and `strata report` (sys/report.h) prints them with
// the other machine facts, so the types live here, below both.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace strata::sys {

struct UringProbe {
  bool available = false;
  std::string error;           // why not, when !available
  std::string kernel_release;  // uname -r
  bool read_fixed = false;     // IORING_OP_READ_FIXED supported
  bool write_fixed = false;    // IORING_OP_WRITE_FIXED supported
};

struct DirectoryProbe {
  std::string path;
  std::string fs_type;  // "ext4", "xfs", "tmpfs", "overlay", ... or "0x<magic>"
  bool direct_io = false;
  std::string direct_io_error;  // why O_DIRECT failed, when !direct_io
  // Alignment O_DIRECT needs for buffer addresses and for file offsets/lengths, in bytes.
  std::uint32_t mem_align_bytes = 4096;
  std::uint32_t offset_align_bytes = 4096;
  std::string align_source;               // "statx", "block device" or "default"
  std::uint32_t logical_block_bytes = 0;  // of the backing block device; 0 when none
  std::string block_device;               // e.g. "nvme0n1p2"; "" when none (tmpfs, overlay)
  std::uint64_t free_bytes = 0;           // available to unprivileged users
  std::uint64_t total_bytes = 0;
};

// Alignment (bytes) to use for O_DIRECT I/O in the probed directory: the larger of the memory and
// offset alignment the probe found, and at least 4096.
inline std::uint32_t required_alignment(const DirectoryProbe& probe) {
  return std::max<std::uint32_t>({probe.mem_align_bytes, probe.offset_align_bytes, 4096u});
}

}  // namespace strata::sys
