// ParamStore: an NVMe home for opaque byte units (the 16-bit parameters of one module each), for
// a caller that moves them itself (the Python package's parameter offload, strata._core).
//
// It is the tier manager's NVMe tier without the plan: one io::IoEngine and one io::SwapSpace
// (kind "param") made the same way (the engine's options from `aio`, xxHash3 footers with
// strata.nvme_checksum, a run folder under each zero_optimization.offload_param.nvme_path), one
// extent per unit, each padded to the swap space's alignment. read() and write() block until the
// unit's bytes are in the caller's buffer / on the file, and neither adds an I/O path of its own:
// they are SwapSpace::read / write / wait.
//
// - Buffers. A buffer aligned to alignment() that may take the padded unit (`room` bytes) moves
//   directly (O_DIRECT); any other goes through an aligned bounce buffer of the store (a pool
//   that grows to the number of calls in flight at once and is kept until close()). read() never
//   writes past `room`, write() never reads past it.
// - Units never written. read() of a unit that no write() has completed fails (kInvalidArgument,
//   "never written"), with or without checksums: parameters that were never stored are a bug of
//   the caller, and zeros would train silently on them. A write that fails leaves its unit
//   "never written" again.
// - Threads. read() and write() may be called from several threads at once: calls on different
//   units are in flight together (the swap space and the engine take concurrent submissions);
//   calls on one unit are ordered (a read sees a whole write, never half of one). close() waits
//   for the calls in flight; later calls fail with "closed".
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/engine.h"
#include "io/swap_space.h"

namespace strata::offload {

struct ParamStoreSettings {
  std::vector<std::string> dirs;  // the swap folders (zero_optimization.offload_param.nvme_path)
  bool checksum = true;           // an xxHash3 footer block after every unit, verified on read
  std::uint64_t bytes_max = 0;    // the swap file at most, footers included (0: no limit)
  io::EngineOptions engine;       // block size, queue depth, threads (the `aio` section)
  std::string swap_tag;           // names the run folder under each dir ("" = the pid)
  // Makes the engine (tests: the fault twin); empty: io::make_engine.
  std::function<Result<std::unique_ptr<io::IoEngine>>(const io::EngineOptions&)> engine_factory;
};

struct ParamStoreUsage {
  std::uint64_t nvme_bytes = 0;      // the swap file's capacity, footers included
  std::uint64_t read_bytes = 0;      // unit bytes delivered by completed reads
  std::uint64_t write_bytes = 0;     // unit bytes stored by completed writes
  std::uint64_t io_read_bytes = 0;   // the same, padded to the alignment (what the drive moved)
  std::uint64_t io_write_bytes = 0;  //   (checksum footers not counted)
  std::uint64_t reads = 0;           // completed reads
  std::uint64_t writes = 0;          // completed writes
  std::uint64_t bounce_buffers = 0;  // aligned bounce buffers made (kept until close())
  std::vector<std::string> dirs;     // the run folders (one per swap folder)
  bool checksums = false;
};

class ParamStore {
 public:
  // The config key the swap folders come from: errors about them name it.
  static constexpr const char* kPathKey = "zero_optimization.offload_param.nvme_path";
  static constexpr const char* kBudgetKey = "strata.nvme_bytes_max";

  // Checks the units (at least one, each > 0 bytes) and the folders (each probed as the tier
  // manager's), computes the swap file's size against bytes_max (kConfig naming
  // strata.nvme_bytes_max and the bytes needed), then makes the engine, the swap space and one
  // extent per unit.
  static Result<std::unique_ptr<ParamStore>> create(const ParamStoreSettings& settings,
                                                    const std::vector<std::uint64_t>& unit_bytes);
  // close(), logging a failure.
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  int units() const { return static_cast<int>(units_.size()); }
  std::uint64_t unit_bytes(int u) const { return units_[static_cast<std::size_t>(u)].bytes; }
  // The unit's extent: unit_bytes rounded up to alignment().
  std::uint64_t padded_bytes(int u) const;
  // What a buffer must be aligned to for the direct path (at least 4096).
  std::uint32_t alignment() const { return alignment_; }
  // The swap file's capacity, footers included (what strata.nvme_bytes_max is checked against).
  std::uint64_t nvme_bytes() const { return nvme_bytes_; }

  // Unit u's bytes into out[0, unit_bytes(u)). `room`: bytes at `out` the store may write,
  // >= unit_bytes(u); with room >= padded_bytes(u) and `out` aligned the read goes there
  // directly. Errors name the unit (and, from the swap space, the file and what failed).
  Status read(int u, void* out, std::uint64_t room);
  // src[0, unit_bytes(u)) to unit u's extent; returns once the write has completed. `room`:
  // bytes readable at `src`, >= unit_bytes(u) (the direct path needs padded_bytes(u)).
  Status write(int u, const void* src, std::uint64_t room);

  ParamStoreUsage usage() const;
  // Waits for the calls in flight, then removes the swap file and run folders. Idempotent.
  Status close();
  bool closed() const;

 private:
  struct Unit {
    std::uint64_t bytes = 0;
    io::Extent extent;
    bool written = false;  // a write completed (guarded by the unit's lock)
  };
  struct Bounce {
    void operator()(void* p) const;
  };
  using BounceBuffer = std::unique_ptr<std::uint8_t, Bounce>;

  ParamStore() = default;
  Status check_call(int u, const void* buffer, std::uint64_t room, const char* what) const;
  Result<BounceBuffer> take_bounce();
  void give_bounce(BounceBuffer buffer);
  Status move(int u, void* buffer, bool read);

  std::vector<Unit> units_;
  std::unique_ptr<std::shared_mutex[]> unit_locks_;  // read: shared; write: exclusive
  std::uint32_t alignment_ = 4096;
  std::uint64_t nvme_bytes_ = 0;
  std::uint64_t bounce_bytes_ = 0;  // the largest padded unit
  bool checksum_ = false;
  std::vector<std::string> run_dirs_;

  // Calls in flight hold it shared; close() takes it exclusively.
  mutable std::shared_mutex life_;
  bool closed_ = false;
  std::unique_ptr<io::IoEngine> engine_;  // outlives space_
  std::unique_ptr<io::SwapSpace> space_;

  mutable std::mutex bounce_mu_;
  std::vector<BounceBuffer> bounce_free_;
  std::uint64_t bounce_made_ = 0;

  std::atomic<std::uint64_t> read_bytes_{0}, write_bytes_{0};
  std::atomic<std::uint64_t> io_read_bytes_{0}, io_write_bytes_{0};
  std::atomic<std::uint64_t> reads_{0}, writes_{0};
};

}  // namespace strata::offload
