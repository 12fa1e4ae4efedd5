// What this machine's I/O stack can do: whether io_uring works (probed with a real ring, since
// seccomp and sysctls can forbid it on kernels that have it), and, for a directory, whether
// O_DIRECT works there, what alignment it needs, and how much room it has.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "sys/io_facts.h"

namespace strata::io {

// The facts themselves are plain types of the base layer (sys/io_facts.h), which the machine
// report prints; this is where they are found.
using sys::DirectoryProbe;
using sys::required_alignment;
using sys::UringProbe;

// Sets up an 8-entry ring, submits a NOP and reaps it.
UringProbe probe_io_uring();

// Probes `dir` by creating, writing, reading back and removing a small temporary file
// (O_DIRECT, 0600). Errors (kNotFound, kIo) name the directory: missing, not a directory,
// or not writable.
Result<DirectoryProbe> probe_directory(const std::string& dir);

// probe_directory for a swap folder given by the config key `key` (an nvme_path): a failure says
// that the folder cannot hold the swap files and what to give instead, naming the key.
Result<DirectoryProbe> probe_swap_folder(const std::string& dir, const char* key);

// Alignment (bytes) O_DIRECT needs on the open file `fd`: statx STATX_DIOALIGN where the kernel
// reports it, else the backing device's logical block size, else 4096; never less than 4096.
std::uint32_t direct_io_alignment(int fd);

}  // namespace strata::io
