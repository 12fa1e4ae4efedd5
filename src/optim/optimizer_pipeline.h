// The optimizer pipeline: one Adam/AdamW step over every tile of every unit (units in order,
// tiles of sub_group_size elements), streamed three deep through fixed pinned buffers:
//
//     read tile i+1  ||  Adam on tile i  ||  write tile i-1
//
// For a tile whose optimizer state is homed on NVMe, master, exp_avg, exp_avg_sq and the
// accumulated gradient are read into stage (i mod 3), Adam updates them there, and master and
// both moments are written back; a host-homed tile is updated in place. The new parameters go
// straight to the parameters' home: Adam writes its bf16/fp16 copy-out into the host home in
// place, or into the stage's copy-out buffer, which is then copied to the device home or written
// to the NVMe home. A unit is done when every write of its tiles has completed; `on_unit_done`
// then lets the prefetcher drop the unit's stale device copy.
//
// It is a state machine driven by the caller's thread (pump / wait_unit / finish), so the
// backend is only ever called from that thread; the reads and writes run on the I/O engine's
// threads and Adam on the CPU executor meanwhile. The trainer starts a step after the backward
// and the global norm, and lets the next step's forward wait per unit (wait_unit), so the
// optimizer's I/O overlaps the next forward.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "optim/adam_optimizer.h"
#include "tier/tier_manager.h"

namespace strata::optim {

struct PipelineStep {
  double lr = 0.0;
  double grad_multiplier = 1.0;  // 1 / combined scale (unscale and clip)
  std::int64_t step = 1;         // Adam's t
};

struct PipelineTimes {
  double adam_ms = 0.0;    // inside the Adam kernel
  double wait_ms = 0.0;    // blocked on reads (or writes holding a stage) while pumping
  double active_ms = 0.0;  // from start() to the last tile's writes done
};

class OptimizerPipeline {
 public:
  // `skip_adam` (benchmarks only) moves every byte and skips the arithmetic.
  static Result<std::unique_ptr<OptimizerPipeline>> create(tier::TierManager& tiers,
                                                           AdamOptimizer& adam);
  ~OptimizerPipeline();
  OptimizerPipeline(const OptimizerPipeline&) = delete;
  OptimizerPipeline& operator=(const OptimizerPipeline&) = delete;

  // Starts a step over every tile. The previous step must be finished.
  void start(const PipelineStep& step);
  // Moves the pipeline along as far as it can without blocking (Adam runs on tiles whose reads
  // are done).
  Status pump();
  // Blocks until every tile of unit u is updated and written home.
  Status wait_unit(int unit);
  // Blocks until the step is complete.
  Status finish();
  bool active() const { return active_; }
  // Whether a step stopped on an I/O error (its state on NVMe is then partly updated: training
  // must stop, and resume from the last checkpoint).
  bool failed() const { return failed_; }
  // Whether unit u's update of the current step is done (true when no step is active).
  bool unit_done(int unit) const;

  // Called once per unit, in order, when its update is complete.
  void set_on_unit_done(std::function<void(int)> fn) { on_unit_done_ = std::move(fn); }
  // Benchmarks: skip the arithmetic (I/O alone) or the I/O (Adam alone, on whatever the stage
  // buffers hold).
  void set_skip_adam(bool skip) { skip_adam_ = skip; }
  const PipelineTimes& times() const { return times_; }
  void reset_times() { times_ = PipelineTimes{}; }

 private:
  enum class SlotState : std::uint8_t { kFree, kReading, kWriting };
  struct Tile {
    int unit = 0;
    std::int64_t index = 0;
  };
  struct Slot {
    SlotState state = SlotState::kFree;
    std::int64_t tile = -1;   // index into tiles_
    io::SwapHandle reads[4];  // master, exp_avg, exp_avg_sq, grad
    std::uint8_t read_done[4] = {0, 0, 0, 0};
    int read_count = 0;
    io::SwapHandle writes[4];
    tier::SlotKind write_kinds[4] = {};
    int write_count = 0;
    bool copy_pending = false;
    backend::Event copied;
    std::uint64_t read_begin_us = 0;
    std::uint64_t write_begin_us = 0;
  };

  OptimizerPipeline(tier::TierManager& tiers, AdamOptimizer& adam);
  Status issue_reads(Slot& slot, std::int64_t tile);
  Status wait_reads(Slot& slot, bool block, bool* done);
  Status compute(Slot& slot);
  Status reap_writes(Slot& slot, bool block, bool* done);
  Status step(bool block, int until_unit);
  Status run(bool block, int until_unit);
  // Waits for everything in flight and ends the step (after an error).
  void abort();
  float* stage(int slot, int array) const;

  tier::TierManager& tiers_;
  backend::Backend& backend_;
  const tier::TierPlan& plan_;
  AdamOptimizer& adam_;
  std::vector<Tile> tiles_;  // every tile, units in order
  std::vector<std::int64_t> last_tile_of_unit_;
  std::vector<std::int64_t> done_tiles_;  // per unit, this step
  std::vector<Slot> slots_;               // pipeline_depth
  PipelineStep step_;
  bool active_ = false;
  bool failed_ = false;
  std::int64_t next_read_ = 0;     // next tile to start reading
  std::int64_t next_compute_ = 0;  // next tile for Adam
  std::int64_t done_ = 0;          // tiles fully written
  int next_done_unit_ = 0;         // units reported done, in order
  std::vector<std::uint8_t> unit_done_;
  std::function<void(int)> on_unit_done_;
  bool skip_adam_ = false;
  PipelineTimes times_;
  std::int64_t start_us_ = 0;
};

}  // namespace strata::optim
