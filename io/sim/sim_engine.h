// The deterministic fault twin: an IoEngine over memory that injects EIO, ENOSPC, short
// transfers, torn writes and latency at configurable rates. Every decision is a hash of the
// seed, the request's submit order, the piece's offset and its retry count, so a run with the
// same seed and the same submit order meets the same faults whatever the thread timing. The
// seed is logged when the twin starts.
//
// What each fault does to one attempt at a piece:
//   eio      the attempt fails with EIO; a read leaves the buffer untouched
//   enospc   a write fails with ENOSPC; nothing lands
//   short    only part of the bytes move (a multiple of the alignment); the engine resubmits
//   torn     a write lands only partly and then fails with EIO (a power cut mid-write)
//   latency  the attempt is delayed by latency_us before it runs
// Faults never touch data a completed write put there: acknowledged data is never lost.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/engine.h"

namespace strata::io {

struct SimFaults {
  double eio_rate = 0.0;      // of attempts (reads and writes)
  double enospc_rate = 0.0;   // of write attempts
  double short_rate = 0.0;    // of attempts longer than one alignment unit
  double torn_rate = 0.0;     // of write attempts
  double latency_rate = 0.0;  // of attempts
  std::uint64_t latency_us = 200;
};

struct SimOptions {
  std::uint64_t seed = 1;
  SimFaults faults;
  std::uint64_t capacity_bytes = 1ull << 30;  // the simulated disk; beyond it: ENOSPC
  std::uint32_t alignment_bytes = 4096;       // what the simulated files demand
};

struct SimCounters {
  std::uint64_t attempts = 0;
  std::uint64_t eio = 0;
  std::uint64_t enospc = 0;
  std::uint64_t short_transfers = 0;
  std::uint64_t torn = 0;
  std::uint64_t delayed = 0;
};

// Test controls of a running twin.
class SimControl {
 public:
  virtual ~SimControl() = default;
  // The seed the twin was started with.
  virtual std::uint64_t seed() const = 0;
  // Replaces the fault rates for attempts from now on.
  virtual void set_faults(const SimFaults& faults) = 0;
  // While paused, queued pieces stay queued (lets a test line requests up, e.g. priorities).
  virtual void set_paused(bool paused) = 0;
  // Faults injected so far.
  virtual SimCounters counters() const = 0;
  // Bytes of the simulated backing file `path` (header included); kNotFound if it is absent.
  virtual Result<std::vector<std::uint8_t>> contents(const std::string& path) const = 0;
  // Flips one byte of a simulated backing file, as silent media corruption would.
  virtual Status corrupt_byte(const std::string& path, std::uint64_t offset) = 0;
};

// Starts a twin; `options` gives block size, queue depth and threads as for any engine.
Result<std::unique_ptr<IoEngine>> make_sim_engine(const EngineOptions& options,
                                                  const SimOptions& sim);

// The controls of `engine` if it is a twin, else nullptr.
SimControl* sim_control(IoEngine* engine);

}  // namespace strata::io
