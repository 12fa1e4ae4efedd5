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
// to the NVMe home.
//
// Two milestones per unit: its parameters are ready (every tile went through Adam and its new
// parameters reached their home: what the next forward needs), and it is done (the master and
// moment writes completed too: what the unit's next gradient, a checkpoint or the next step
// need).
//
// The step cannot start before the global gradient norm is known (clipping and the skip on
// overflow need all of it), but its reads need not wait: preload() reads master, exp_avg and
// exp_avg_sq of the first `depth` tiles during the backward, so only their gradients are left to
// read when the step starts.
//
// A state machine driven by the caller's thread (pump / wait_* / finish), so the backend is only
// called from that thread; reads and writes run on the I/O engine's threads meanwhile and Adam on
// the CPU executor when pumped.
#pragma once

#include <cstdint>
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
  double adam_ms = 0.0;  // inside the Adam kernel
  double wait_ms = 0.0;  // blocked on reads or writes in wait_* / finish
};

class OptimizerPipeline {
 public:
  static Result<std::unique_ptr<OptimizerPipeline>> create(tier::TierManager& tiers,
                                                           AdamOptimizer& adam);
  ~OptimizerPipeline();
  OptimizerPipeline(const OptimizerPipeline&) = delete;
  OptimizerPipeline& operator=(const OptimizerPipeline&) = delete;

  // Reads master, exp_avg and exp_avg_sq of the first tiles ahead of the step (no-op when the
  // first tiles are host-homed, a step runs, or a preload is already in flight).
  Status preload();
  // Discards a preload (the step was skipped).
  Status cancel_preload();
  // Starts a step over every tile (the previous one must be finished): issues the gradient reads
  // of preloaded tiles.
  Status start(const PipelineStep& step);
  // Moves the pipeline along as far as it can without blocking (Adam runs on tiles whose reads
  // are done).
  Status pump();
  // Blocks until unit u's new parameters are in their home.
  Status wait_params(int unit);
  // Blocks until every write of unit u's update is done.
  Status wait_unit(int unit);
  // Blocks until the step is complete.
  Status finish();
  bool active() const { return active_; }
  // Whether a step stopped on an I/O error (the state on NVMe is then partly updated).
  bool failed() const { return failed_; }
  // Milestones of unit u in the current step (true when no step is active).
  bool params_ready(int unit) const;
  bool unit_done(int unit) const;

  // Benchmarks: move every byte but skip the arithmetic (the I/O alone).
  void set_skip_adam(bool skip) { skip_adam_ = skip; }
  const PipelineTimes& times() const { return times_; }

 private:
  enum class SlotState : std::uint8_t { kFree, kReading, kWriting };
  enum class Target : std::uint8_t { kNone, kParams, kDone, kAll };
  struct Tile {
    int unit = 0;
    std::int64_t index = 0;
  };
  struct Slot {
    SlotState state = SlotState::kFree;
    std::int64_t tile = -1;   // index into tiles_
    io::SwapHandle reads[4];  // master, exp_avg, exp_avg_sq, grad
    bool read_issued[4] = {false, false, false, false};
    bool read_done[4] = {false, false, false, false};
    io::SwapHandle writes[3];  // master, exp_avg, exp_avg_sq
    bool write_done[3] = {false, false, false};
    int write_count = 0;
    bool param_delivered = true;
    bool param_write = false;  // NVMe write (else a host->device copy when !param_delivered)
    io::SwapHandle param_handle;
    backend::Event copied;
    std::uint64_t read_begin_us = 0;
    std::uint64_t write_begin_us = 0;
  };

  OptimizerPipeline(tier::TierManager& tiers, AdamOptimizer& adam);
  float* stage(int slot, int array) const;
  Slot& slot_of(std::int64_t tile) { return slots_[static_cast<std::size_t>(tile % depth_)]; }
  bool nvme_state(std::int64_t tile) const;
  Status issue_read(Slot& slot, int array);
  Status issue_reads(Slot& slot, std::int64_t tile, bool with_grad);
  Status poll_reads(Slot& slot, bool block, bool* done);
  Status compute(Slot& slot);
  Status reap(Slot& slot, bool block_param, bool block_all, bool* freed);
  void param_delivered(const Tile& tile);
  Status step(bool block, Target target, int unit);
  bool reached(Target target, int unit) const;
  Status run(bool block, Target target, int unit);
  // Waits for everything in flight and ends the step (after an error).
  void abort();

  tier::TierManager& tiers_;
  backend::Backend& backend_;
  const tier::TierPlan& plan_;
  AdamOptimizer& adam_;
  std::int64_t depth_ = 3;
  std::vector<Tile> tiles_;  // every tile, units in order
  std::vector<std::int64_t> params_tiles_;  // per unit: tiles whose parameters are home
  std::vector<std::int64_t> done_tiles_;    // per unit: tiles fully written
  std::vector<Slot> slots_;                 // depth_
  PipelineStep step_;
  bool active_ = false;
  bool failed_ = false;
  std::int64_t preloaded_ = 0;     // tiles whose state reads were started by preload()
  std::int64_t next_read_ = 0;     // next tile to start reading
  std::int64_t next_compute_ = 0;  // next tile for Adam
  std::int64_t done_ = 0;          // tiles fully written (in order)
  bool skip_adam_ = false;
  PipelineTimes times_;
};

}  // namespace strata::optim
