// The tiered storage manager: owns every byte of training state of one rank, as the TierPlan
// (plan.h) lays it out, and the fixed staging areas that move it:
//   device  parameters homed on the device, master, exp_avg, exp_avg_sq and the gradient
//           accumulator of units whose optimizer state is homed there (one allocation each),
//           parameter frames (per size class, plus a frame of its own for each persistent unit),
//           fp32 compute copies, gradient frames;
//   host    pinned: parameters homed on the host; master, exp_avg, exp_avg_sq and the gradient
//           accumulator of host-homed units (one mapping, each array 4 KiB-staggered); parameter
//           staging, gradient staging, the optimizer pipeline's stage buffers, gradient
//           write-behind tiles and a unit scratch, each on 2 MiB boundaries with MADV_HUGEPAGE;
//   nvme    one SwapSpace per distinct list of swap folders (plan().swap), one extent
//           (checksummed when plan().swap.checksum) per tile of every NVMe-homed slot.
// Everything is allocated by create(); nothing is allocated afterwards, so each tier's use is
// fixed and hard-limited by its budget (the device arena and the pinned budget are enforced by
// the backend, the NVMe budget here). Before anything is created, each swap folder is checked:
// it must exist, be a writable directory and have room for the swap files (errors name the
// nvme_path key the folder came from).
//
// Called from the trainer's thread, except read_tile / write_tile / wait / poll and the host
// pointers, which the optimizer pipeline's worker thread uses too (the I/O engine and the swap
// space are thread-safe; each operation belongs to the thread that started it).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/trace.h"
#include "io/engine.h"
#include "io/swap_space.h"
#include "model/layout.h"
#include "offload/plan.h"

namespace strata::offload {

// Makes the I/O engine (tests pass the fault twin; default: make_engine).
using EngineFactory =
    std::function<Result<std::unique_ptr<io::IoEngine>>(const io::EngineOptions& options)>;

struct TierOptions {
  EngineFactory engine_factory;  // empty: io::make_engine
  std::string swap_tag;          // names the run folders under nvme_path ("" = pid)
  Trace* trace = nullptr;
};

struct TierUsage {
  std::uint64_t bytes_in_use[kTierCount] = {0, 0, 0};
  std::uint64_t bytes_peak[kTierCount] = {0, 0, 0};
  std::uint64_t bytes_max[kTierCount] = {0, 0, 0};  // budgets (0: none)
};

struct IoCounters {
  std::uint64_t read_bytes[kSlotKinds] = {0, 0, 0, 0, 0};
  std::uint64_t write_bytes[kSlotKinds] = {0, 0, 0, 0, 0};
  std::uint64_t reads = 0;
  std::uint64_t writes = 0;
};

class TierManager {
 public:
  // Checks the swap folders, then allocates everything the plan lists. kNotFound / kIo / kNoSpace
  // naming the nvme_path key for unusable folders, kOutOfMemory naming the budget when memory
  // does not fit, kConfig when the swap files exceed plan.swap.bytes_max (strata.nvme_bytes_max).
  static Result<std::unique_ptr<TierManager>> create(backend::Backend& backend,
                                                     const model::ModelLayout& layout,
                                                     TierPlan plan, const TierOptions& options);
  ~TierManager();
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  const TierPlan& plan() const { return plan_; }
  const model::ModelLayout& layout() const { return layout_; }
  backend::Backend& backend() { return backend_; }
  Trace* trace() const { return trace_; }
  int units() const { return static_cast<int>(plan_.units.size()); }

  // ---- homes ----------------------------------------------------------------------------------
  // The slot of unit u of an optimizer kind (master .. grad) as stored (slot_codec.h), when
  // homed on the host.
  void* host_slot(int unit, SlotKind kind) const;
  // The same as fp32, for a kind stored as fp32 (the default; stored_as_fp32()).
  float* host_state(int unit, SlotKind kind) const;
  // The same on the device (offload_optimizer none, when the plan put it there).
  float* device_state(int unit, SlotKind kind) const;
  // Unit u's parameter shard in the storage type, when homed on the host / on the device (the
  // device master itself for fp32 parameters beside it).
  void* host_param(int unit) const;
  void* device_param(int unit) const;

  // ---- NVMe tiles -----------------------------------------------------------------------------
  // Starts reading / writing tile t of slot (kind, unit) from / to `buffer` (pinned, 4 KiB
  // aligned, the tile's bytes). The slot must be homed on NVMe.
  Result<io::SwapHandle> read_tile(SlotKind kind, int unit, std::int64_t tile, void* buffer,
                                   io::Priority priority);
  Result<io::SwapHandle> write_tile(SlotKind kind, int unit, std::int64_t tile, const void* buffer,
                                    io::Priority priority);
  // Waits for / polls an operation of read_tile or write_tile (same kind); a read is verified
  // against its checksum. Errors (kIo, kNoSpace, kCorrupt) name the file, extent and errno.
  Status wait(SlotKind kind, io::SwapHandle handle);
  std::optional<Status> poll(SlotKind kind, io::SwapHandle handle);
  // Bytes of tile t of `kind` for unit u as stored (TierPlan::tile_bytes).
  std::uint64_t tile_bytes(SlotKind kind, int unit, std::int64_t tile) const;

  // ---- whole slots, any home (not on the step's hot path) -----------------------------------
  // Copies the slot of (kind, unit) as stored (TierPlan::shard_bytes) into `dst` (any host
  // memory, or 4 KiB-aligned for NVMe homes). Device homes (fp32 only) go through a copy on the
  // compute stream and a wait.
  Status read_slot(SlotKind kind, int unit, void* dst);
  // Writes `src` (same layout) into the slot's home.
  Status write_slot(SlotKind kind, int unit, const void* src);
  // Rounds the master of unit u to the storage type and stores it as the unit's parameters.
  Status refresh_params(int unit);
  // The fp32 unit scratch (largest unit), or null when the plan has none.
  float* unit_scratch() const { return unit_scratch_; }
  // With compressed state: a slot image of the largest shard (TierPlan::raw_scratch_bytes,
  // 4 KiB-aligned); else null.
  void* raw_scratch() const { return raw_scratch_; }

  // ---- staging areas (pinned) -----------------------------------------------------------------
  void* param_staging(int i) const;      // plan().param_staging_buffers of them
  void* grad_staging(int i) const;       // plan().grad_staging_buffers
  void* grad_write_buffer(int i) const;  // plan().grad_write_buffers tiles as stored
  char* pipeline_area() const { return pipeline_; }

  // ---- device areas ---------------------------------------------------------------------------
  void* param_frame(int size_class, int i) const;
  void* persistent_frame(int unit) const;
  float* compute_slot(int size_class, int i) const;
  // The unit's norm weights and biases kept apart in fp32 (UnitPlan::apart_offset), or null.
  float* kept_apart(int unit) const;
  float* grad_frame(int size_class, int i) const;
  // The storage-type copy of a gradient frame (16-bit storage; the frame itself for fp32; null
  // where its class has none, SizeClass::grad_copy).
  void* grad_frame_copy(int size_class, int i) const;

  // ---- accounting -----------------------------------------------------------------------------
  TierUsage usage() const;
  // Bytes moved so far (a snapshot; the optimizer's worker thread adds to them).
  IoCounters io_counters() const;
  io::IoEngine* engine() const { return engine_.get(); }
  // The nvme_path folders in use (empty without NVMe).
  std::vector<std::string> swap_dirs() const;

 private:
  TierManager(backend::Backend& backend, const model::ModelLayout& layout, TierPlan plan);
  Status check_paths() const;
  Status allocate_device();
  Status allocate_host();
  Status create_swap(const TierOptions& options);
  Result<void*> pinned(std::uint64_t bytes, std::uint64_t align, std::string_view purpose);
  std::size_t extent_index(SlotKind kind, int unit, std::int64_t tile) const;
  io::SwapSpace& space_of(SlotKind kind) const;

  backend::Backend& backend_;
  model::ModelLayout layout_;
  TierPlan plan_;
  Trace* trace_ = nullptr;
  std::vector<backend::Buffer> buffers_;  // every device and pinned allocation
  std::vector<void*> device_params_;      // per unit (device home) or null
  std::vector<void*> host_params_;        // per unit (host home) or null
  std::vector<char*> host_state_;         // per unit: 4 slots (host home) or null
  std::vector<float*> device_state_;      // per unit: 4 arrays (device home) or null
  std::vector<std::vector<void*>> frames_, compute_, grads_;  // per class
  std::vector<void*> persistent_;                             // per unit or null
  float* apart_ = nullptr;                                    // plan_.apart_numel
  std::vector<void*> param_staging_, grad_staging_;
  std::vector<void*> grad_write_;
  char* pipeline_ = nullptr;
  float* unit_scratch_ = nullptr;
  void* raw_scratch_ = nullptr;
  std::uint64_t nvme_bytes_ = 0;
  std::uint64_t nvme_budget_ = 0;

  std::unique_ptr<io::IoEngine> engine_;
  std::unique_ptr<io::SwapSpace> spaces_[2];  // [0] parameters, [1] optimizer (may be shared)
  int space_of_kind_[kSlotKinds] = {0, 1, 1, 1, 1};
  std::vector<io::Extent> extents_;       // [kind][unit][tile], flattened
  std::vector<std::size_t> extent_base_;  // per kind * units + unit: first tile's index
  std::atomic<std::uint64_t> read_bytes_[kSlotKinds] = {};
  std::atomic<std::uint64_t> write_bytes_[kSlotKinds] = {};
  std::atomic<std::uint64_t> reads_{0};
  std::atomic<std::uint64_t> writes_{0};
};

}  // namespace strata::offload
