// The fallback engine for machines where io_uring cannot be used: a fixed pool of threads, each
// moving one piece at a time with pread/pwrite, threads x queue_depth of them (at most 64) so
// that about as many pieces are in flight as the io_uring engine would keep.
#pragma once

#include <memory>

#include "io/engine.h"

namespace strata::io {

inline constexpr std::uint32_t kPosixThreadsMax = 64;

// Starts the pool.
Result<std::unique_ptr<IoEngine>> make_posix_engine(const EngineOptions& options);

}  // namespace strata::io
