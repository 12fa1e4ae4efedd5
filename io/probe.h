// What this machine's I/O stack can do: whether io_uring works (probed with a real ring, since
// seccomp and sysctls can forbid it on kernels that have it), and, for a directory, whether
// O_DIRECT works there, what alignment it needs, and how much room it has.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace strata::io {

struct UringProbe {
  bool available = false;
  std::string error;           // why not, when !available
  std::string kernel_release;  // uname -r
  bool read_fixed = false;     // IORING_OP_READ_FIXED supported
  bool write_fixed = false;    // IORING_OP_WRITE_FIXED supported
};

// Sets up an 8-entry ring, submits a NOP and reaps it.
UringProbe probe_io_uring();

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

// Probes `dir` by creating, writing, reading back and removing a small temporary file
// (O_DIRECT, 0600). Errors (kNotFound, kIo) name the directory: missing, not a directory,
// or not writable.
Result<DirectoryProbe> probe_directory(const std::string& dir);

// Alignment (bytes) O_DIRECT needs on the open file `fd`: statx STATX_DIOALIGN where the kernel
// reports it, else the backing device's logical block size, else 4096; never less than 4096.
std::uint32_t direct_io_alignment(int fd);

// Alignment (bytes) to use for O_DIRECT I/O in `dir`: the larger of the memory and offset
// alignment the probe found, and at least 4096.
std::uint32_t required_alignment(const DirectoryProbe& probe);

}  // namespace strata::io
