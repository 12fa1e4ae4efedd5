// Opening, creating, preallocating and removing the backing files of real (non-simulated)
// engines: the io_uring engine and the pread/pwrite pool share this.
#pragma once

#include <cstdint>
#include <string>

#include "io/core/queue_engine.h"

namespace strata::io::core {

// Opens the backing files of `spec`. With spec.create: creates each (0600, O_EXCL, never
// following a symlink), preallocates it with fallocate, and writes spec.header into its header
// block. O_DIRECT is switched on per `direct` (DirectIo::kAuto falls back to buffered I/O,
// reporting why in OpenedFile::buffered_reason). Errors name the path and what is wrong; on
// error nothing it created is left behind.
Result<OpenedFile> open_real_files(const FileSpec& spec, std::uint64_t stripe_bytes,
                                   DirectIo direct);

// Closes the descriptors of `file`, unlinking the backing files when `remove`.
Status close_real_files(const OpenedFile& file, bool remove);

// Bytes an unprivileged user may still write in `dir` (statvfs f_bavail).
Result<std::uint64_t> real_free_bytes(const std::string& dir);

// Bytes each backing file holds for `logical_bytes` of data striped over `stripes` files.
std::uint64_t data_bytes_per_stripe_file(std::uint64_t logical_bytes, std::uint64_t stripe_bytes,
                                         std::uint32_t stripes);

}  // namespace strata::io::core
