// The io_uring engine: one ring and one thread per aio.intra_op_parallelism, each keeping up to
// queue_depth pieces in flight, with the files (and, where the caller registers them, the
// buffers) registered with every ring.
#pragma once

#include <memory>

#include "io/engine.h"

namespace strata::io {

// Starts the engine; kUnavailable when a ring cannot be set up (old kernel, seccomp, sysctl
// kernel.io_uring_disabled), with the reason.
Result<std::unique_ptr<IoEngine>> make_uring_engine(const EngineOptions& options);

}  // namespace strata::io
