// The optimizer pipeline: one Adam/AdamW step over every tile of every unit (units in order,
// tiles of the plan's tile_elements), streamed `depth` deep (TierPlan::pipeline_depth, from
// strata.optimizer_pipeline_depth: five by default, three at least) through fixed pinned stages:
//
//     read tiles i+1 .. i+depth-2  ||  Adam on tile i  ||  write tile i-1 (and earlier, in flight)
//
// For a tile whose optimizer state is homed on NVMe, master, exp_avg, exp_avg_sq and the
// accumulated gradient are read into stage (i mod depth), Adam updates them there, and master and
// both moments are written back; a host-homed tile is updated in place. The new parameters go
// straight to the parameters' home: Adam writes its bf16/fp16 copy-out into the host home in
// place, or into the stage's copy-out buffer, which is then written to the NVMe home or copied to
// the device home.
//
// Two milestones per unit: its parameters are ready (every tile went through Adam and its new
// parameters reached their home: what the next forward needs), and it is done (the master and
// moment writes completed too: what the unit's next gradient, a checkpoint or the next step
// need).
//
// Threads. The step runs on a worker thread of its own, so reads, Adam and writes keep going
// while the trainer's thread computes the next forward (with a GPU, Adam on the CPU overlaps the
// GPU's work; on the CPU backend the two share the cores). Each tile's arithmetic is the same
// whichever thread runs it, so results do not depend on the timing. Two things cross threads:
//   - milestones: per-unit atomic tile counts the worker raises and the trainer's thread reads
//     (params_ready, unit_done), with a condition variable for the waits;
//   - device copies: the backend is only ever called from the trainer's thread, so for a tile
//     whose parameters live on the device the worker only asks, and the trainer's thread does the
//     copy when it next comes by (pump() from the progress driver, any wait). Per stage, one
//     atomic delivery state:
//         none --worker: copy wanted--> requested --trainer: copy issued--> issued
//              --trainer: copy complete--> done --worker: tile counted--> none
//   - the hand-off of new parameters into a prefetcher's frame: the UpdateGate protocol
//     (update_gate.h), implemented here.
// The worker's side is in optimizer_pipeline.cc, the trainer's thread's in
// optimizer_pipeline_control.cc.
//
// The step cannot start before the global gradient norm is known (clipping and the skip on
// overflow need all of it), but its reads need not wait: preload() reads master, exp_avg and
// exp_avg_sq of the first tiles during the backward, so only their gradients are left to read
// when the step starts.
//
// Units whose optimizer state the plan homed on the device (offload_optimizer none) take no part
// in the above: start() queues their tiles' AdamW on the backend's OptimizerOps (the compute
// stream, the same fp32 operations as CPU Adam, the bf16/fp16 copy-out written straight into the
// device parameters) and records an event; their milestones are that event.
//
// The pipeline needs only a tier manager and the Adam driver: with a plan for any set of flat
// units (a model's, or a binding's parameter groups) it runs the same step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "offload/cpu_adam.h"
#include "offload/tier_manager.h"
#include "offload/update_gate.h"

namespace strata::offload {

struct PipelineStep {
  double lr = 0.0;
  double grad_multiplier = 1.0;  // 1 / combined scale (unscale and clip)
  std::int64_t step = 1;         // Adam's t
};

struct PipelineTimes {
  double adam_ms = 0.0;  // inside the Adam kernel
  double wait_ms = 0.0;  // the worker blocked on reads or writes
};

class OptimizerPipeline final : public UpdateGate {
 public:
  // Starts the worker thread.
  static Result<std::unique_ptr<OptimizerPipeline>> create(TierManager& tiers, CpuAdam& adam);
  // Finishes a step in flight and stops the worker.
  ~OptimizerPipeline() override;
  OptimizerPipeline(const OptimizerPipeline&) = delete;
  OptimizerPipeline& operator=(const OptimizerPipeline&) = delete;

  // Reads master, exp_avg and exp_avg_sq of the first tiles ahead of the step (no-op when they
  // are host-homed, a step runs, or a preload is already in flight).
  Status preload();
  // Discards a preload (the step was skipped).
  Status cancel_preload();
  // Starts a step over every tile (the previous one must be finished).
  Status start(const PipelineStep& step);
  // Starts a step over the tiles of `units` alone, in that order (host- or NVMe-homed units, each
  // once): a binding that hands gradients over unit by unit during the backward steps each unit
  // as soon as it has landed. Each tile's arithmetic is the same as in a whole step, so a step
  // split into parts gives the bits of the whole. Units left out are untouched and count as
  // ready. A preload in flight (it read the whole step's first tiles) is discarded.
  Status start(const PipelineStep& step, const std::vector<int>& units);
  // Issues the host->device copies of new device-homed parameters; returns the step's error.
  // Only the progress driver (progress.h) calls it; the pipeline's own waits deliver as they wait.
  Status pump();
  // Block until every write of unit u's update is done / the step is complete. The first error
  // of the step is returned.
  Status wait_unit(int unit);
  Status finish();
  bool active() const { return active_.load(); }
  // Whether a step stopped on an I/O error (the state on NVMe is then partly updated).
  bool failed() const { return failed_.load(); }
  // Whether every write of unit u's update is done (true when no step is active).
  bool unit_done(int unit) const;

  // ---- UpdateGate (update_gate.h) -------------------------------------------------------------
  // Unit u's new parameters are home (true when no step is active).
  bool params_ready(int unit) const override;
  // Blocks until params_ready(u), issuing device copies meanwhile. The copies that come due after
  // it returns move on at the caller's next Progress::poll() (the store's progress driver).
  Status wait_for_params(int unit) override;
  // The worker also copies each of u's new tiles to `destination`, right after Adam, when the
  // offer comes before u's first tile (parameters homed on NVMe, during a step only).
  bool offer_frame(int unit, void* destination) override;
  bool handed_off(int unit) const override;

  // Benchmarks: move every byte but skip the arithmetic (the I/O alone). Between steps only.
  void set_skip_adam(bool skip) { skip_adam_ = skip; }
  // Between steps only.
  PipelineTimes times() const;

 private:
  enum class SlotState : std::uint8_t { kFree, kReading, kWriting };
  enum class Delivery : int { kNone = 0, kRequested, kIssued, kDone };
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
    bool param_write = false;  // an NVMe write; else a device copy through `delivery`
    io::SwapHandle param_handle;
    // The device copy: the worker requests it, the trainer's thread issues and completes it.
    std::atomic<int> delivery{0};
    void* copy_dst = nullptr;
    const void* copy_src = nullptr;
    std::uint64_t copy_bytes = 0;
    backend::Event copied;
    std::uint64_t read_begin_us = 0;
    std::uint64_t write_begin_us = 0;
  };

  // The arrays of a stage, in order: what a tile reads (all four) and writes back (the first
  // three).
  static constexpr SlotKind kStateKinds[4] = {SlotKind::kMaster, SlotKind::kExpAvg,
                                              SlotKind::kExpAvgSq, SlotKind::kGrad};

  OptimizerPipeline(TierManager& tiers, CpuAdam& adam);
  char* stage(int slot, int array) const;
  Slot& slot_of(std::int64_t tile) { return slots_[static_cast<std::size_t>(tile % depth_)]; }
  bool nvme_state(std::int64_t tile) const;
  // Worker side.
  void worker_main();
  Status run_step();
  Status issue_read(Slot& slot, int array);
  Status issue_reads(Slot& slot, std::int64_t tile, bool with_grad);
  Status poll_reads(Slot& slot, bool block, bool* done);
  Status compute(Slot& slot);
  Status reap(Slot& slot, bool block, bool* freed);
  void abort_io();
  // Trainer's side: device copies requested by the worker.
  Status deliver();
  // Waits (delivering meanwhile) until `ready()`, or the step fails.
  template <typename Ready>
  Status wait_until(Ready ready);

  TierManager& tiers_;
  backend::Backend& backend_;
  const TierPlan& plan_;
  CpuAdam& adam_;
  std::int64_t depth_ = 0;
  std::vector<Tile> all_tiles_;  // every host- and NVMe-homed tile, units in order
  std::vector<Tile> tiles_;      // the tiles of this step: all_tiles_, or those of some units
  bool partial_ = false;         // tiles_ is a part (start(step, units))
  // listed: per unit, whether a partial step runs it (nullptr: the whole step).
  Status begin_step(const PipelineStep& step, const std::vector<char>* listed);
  void whole_step_tiles();
  std::vector<int> device_units_;  // units whose state (and Adam) is on the device
  // Recorded on the compute stream after the device units' AdamW: their milestones.
  backend::Event device_done_;
  bool device_unit(int unit) const;
  bool device_pending() const;
  // Queues the device units' AdamW (the trainer's thread, at start()).
  Status run_device_tiles();
  std::vector<std::atomic<std::int64_t>> params_tiles_;  // per unit: tiles whose params are home
  std::vector<std::atomic<std::int64_t>> done_tiles_;    // per unit: tiles fully written
  // Per unit, the hand-off state of update_gate.h: kHandNone, then kHandOffered (trainer) or
  // kHandLate (worker, first tile begun without an offer); kHandTaken once the worker saw the offer
  // at the first tile.
  enum : int { kHandNone = 0, kHandOffered, kHandTaken, kHandLate };
  std::vector<std::atomic<int>> hand_;
  std::vector<std::atomic<char*>> hand_destination_;
  std::vector<std::atomic<std::int64_t>> hand_tiles_;  // tiles copied into the frame
  std::vector<Slot> slots_;                            // depth_
  // Recorded on the compute stream when a step starts: the device copies of new parameters wait
  // for it, so no kernel queued before the step still reads the parameters they overwrite.
  backend::Event step_started_;
  PipelineStep step_;
  // The Adam kernel's arguments of this step (from step_ and Adam's settings, at begin_step()),
  // the same for CPU Adam and the device's.
  kernels::AdamParams params_;
  kernels::AdamFusion fusion_;
  std::int64_t preloaded_ = 0;     // tiles whose state reads preload() started
  std::int64_t next_read_ = 0;     // worker: next tile to start reading
  std::int64_t next_compute_ = 0;  // worker: next tile for Adam
  std::int64_t done_ = 0;          // worker: tiles fully written
  bool skip_adam_ = false;
  PipelineTimes times_;  // written by the worker during a step

  std::mutex mu_;
  std::condition_variable cv_;  // the worker and waiters on milestones
  std::atomic<bool> active_{false};
  std::atomic<bool> failed_{false};
  bool run_requested_ = false;  // under mu_
  bool stop_ = false;           // under mu_
  Status error_;                // under mu_: the step's first error
  std::thread worker_;
};

}  // namespace strata::offload
