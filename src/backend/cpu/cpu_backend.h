// CpuBackend: the Backend whose "device" is a capped region of host memory, so that every code
// path above the kernels (budgets, streams, events, overlapping copies) runs without a GPU.
//   - device memory: one anonymous mapping of device_bytes_max (reserved, committed on touch),
//     carved by an Arena; exceeding it is kOutOfMemory naming strata.device_bytes_max;
//   - pinned memory: page-aligned mappings counted against host_bytes_max (not mlock'ed: on the
//     CPU backend nothing DMAs from it);
//   - the compute stream runs ops synchronously in the calling thread, parallelised on a oneTBB
//     arena of `threads` threads;
//   - each copy stream is a thread of its own with a fixed-capacity command queue, so copies
//     really overlap compute; events and stream waits follow CUDA's semantics.
// Stream jitter (a test mode: CpuBackendOptions::stream_jitter, or STRATA_TEST_STREAM_JITTER=SEED
// through common/fault_points.h): the compute stream too becomes a thread of its own that runs
// behind the host thread (ops are queued, as kernel launches are on a GPU; a copy touching
// pageable memory, sum() and the optimizer ops' read-backs wait for it), and every command of
// every stream first sleeps a random time drawn from the seed. The streams then run as far apart
// as their events allow, so a missing record or wait between them changes results, and the
// engine's bit-identity tests run under it (docs/reliability.md, "Stream ordering").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"

namespace strata::backend {

struct CpuBackendOptions {
  std::uint64_t device_bytes_max = 4ull << 30;  // the arena's hard budget
  std::uint64_t host_bytes_max = 0;             // pinned budget; 0 = 80% of available memory
  int threads = 0;                              // compute threads; 0 = all cores available
  // How errors name the budgets (a config key, or a command-line option).
  std::string device_budget_name = "strata.device_bytes_max";
  std::string host_budget_name = "strata.host_bytes_max";
  // Stream jitter with this seed; nullopt: as stream_jitter_seed() says (the environment).
  std::optional<std::uint64_t> stream_jitter;
};

// Creates a CpuBackend: maps the arena and starts the copy threads. kInvalidArgument for a zero
// budget, kOutOfMemory when the mapping fails.
Result<std::unique_ptr<Backend>> make_cpu_backend(const CpuBackendOptions& options);

// Memory available to new allocations on this machine (MemAvailable), or 0 when unknown.
std::uint64_t host_memory_available_bytes();

}  // namespace strata::backend
