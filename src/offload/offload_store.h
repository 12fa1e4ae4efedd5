// All training state of one rank, wherever it lives, behind the model runner's UnitStore seam
// (model/runner.h): the model side of the offload engine (engine.h builds it). It works on the
// engine's
//   TierManager        every byte and its home, as the plan lays them out (tier_manager.h);
//   OptimizerPipeline  tiles `depth` deep through CPU Adam, new parameters straight home; it is
//                      also the update gate (update_gate.h) the scheduler asks during a step;
//   Sharding           the ZeRO collectives (sharding.h);
// and owns
//   GradPath           gradients leave the device once and accumulate in fp32 in their home,
//                      with each tile's sum of squares (grad_path.h);
//   ParamScheduler     parameters to the device ahead of use (param_scheduler.h);
//   Progress           the one driver that moves the three engines' work in flight along
//                      (progress.h), called at each point where the runner comes by.
// The in-memory run is the special case where every home is the device or the host: the same
// kernels run on the same tiles in the same order whatever the tiers, so offloading does not
// change a single bit of the result.
//
// A step, as the trainer drives it:
//   for each micro-batch m:  begin_micro_batch(m == 0, m == last, step * accumulation + m)
//                            runner.train_step(*this)   (acquire/release params, grads)
//                            end_micro_batch()
//   finish_backward()        every gradient is home; grad_sum_squares() is final
//   start_optimizer(step)    Adam starts streaming tiles (skip_optimizer() when the step is
//                            skipped instead)
// The next step's forward waits per unit (acquire_params) for that unit's update only, so the
// optimizer's I/O overlaps the next forward; finish_optimizer() waits for all of it (before
// checkpoints and at the end).
//
// Lifetimes: the store goes before the engine's pipeline and tier manager (engine.h), and within
// it the scheduler goes before the gradient path: each engine goes before the memory and files
// it uses, and the scheduler, which completes hand-offs through the pipeline's gate as it goes,
// before the gate.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/layout.h"
#include "model/runner.h"
#include "offload/grad_path.h"
#include "offload/optimizer_pipeline.h"
#include "offload/param_scheduler.h"
#include "offload/progress.h"
#include "offload/sharding.h"
#include "offload/tier_manager.h"

namespace strata::offload {

struct StateCounters {
  double compute_wait_ms = 0.0;  // compute blocked on parameters, updates or gradient buffers
};

class OffloadStore final : public model::UnitStore<float> {
 public:
  // The model's engines over the engine's tier manager, pipeline and sharding (engine.h: the
  // only caller); they must outlive the store.
  static Result<std::unique_ptr<OffloadStore>> create(TierManager& tiers,
                                                      OptimizerPipeline& pipeline,
                                                      Sharding& sharding);
  // Forgets the fp32 copies it noted as widened (Ops::note_widened): their memory is freed.
  ~OffloadStore() override;

  const model::ModelLayout& layout() const { return tiers_.layout(); }
  const TierPlan& plan() const { return tiers_.plan(); }
  kernels::DType storage() const { return tiers_.plan().storage; }
  int units() const { return tiers_.units(); }
  TierManager& tiers() { return tiers_; }
  ParamScheduler& scheduler() { return *scheduler_; }
  OptimizerPipeline& pipeline() { return pipeline_; }
  GradPath& grad_path() { return *grads_; }
  Sharding& sharding() { return sharding_; }

  // ---- whole units (initialisation, checkpoints; not the step's hot path) --------------------
  // A buffer for unit u's fp32 `kind` shard to be filled and then passed to store(): the host
  // home itself (stored as fp32), or the unit scratch.
  float* fill_buffer(SlotKind kind, int unit);
  // Stores unit u's fp32 `kind` shard from `src` (any memory) into its home, encoded as the
  // plan stores it (slot_codec.h).
  Status store(SlotKind kind, int unit, const float* src);
  // Unit u's fp32 `kind` shard: the host home itself (stored as fp32), or a copy in the unit
  // scratch, decoded when stored compressed (valid until the next view / store / fill_buffer).
  Result<const float*> view(SlotKind kind, int unit);
  // Unit u's `kind` slot as stored (TierPlan::shard_bytes; checkpoints): the host home itself,
  // or a copy in the state scratch (the unit scratch for fp32 state).
  Result<const void*> view_stored(SlotKind kind, int unit);
  // Writes a slot image as stored into unit u's `kind` home.
  Status store_stored(SlotKind kind, int unit, const void* stored);
  // After the masters changed (initialisation, resume): zeroes the moments when `zero_moments`,
  // and rounds every master into the parameters' home.
  Status refresh(bool zero_moments);
  // The whole unit u of fp32 master weights into `whole` (padded_numel elements, any host
  // memory), gathered from every rank's shard; waits for the optimizer step in flight first.
  // Between steps, on every rank in the same order.
  Status gather_masters(int unit, float* whole);

  // ---- the step -------------------------------------------------------------------------------
  // `sequence`: the micro-batch's number in the run (GradPath::begin_micro_batch).
  void begin_micro_batch(bool first, bool last, std::int64_t sequence = 0);
  Status end_micro_batch();
  // Every gradient of the step is in its home.
  Status finish_backward();
  // Sum of squares of the accumulated gradients (tiles in order; inf/NaN when any is).
  double grad_sum_squares() const { return grads_->sum_squares(); }
  // Starts the optimizer step; with `wait`, also finishes it.
  Status start_optimizer(const PipelineStep& step, bool wait);
  // The step is skipped (gradient not finite): drops what was read ahead for it.
  Status skip_optimizer();
  Status finish_optimizer();
  void begin_eval_batch();
  void end_eval_batch();

  StateCounters& counters() { return counters_; }
  // The first I/O or engine error of the run. After one, the state may be half updated (an
  // optimizer step stopped midway), so every later step, view or checkpoint returns it: training
  // stops and resumes from the last checkpoint.
  const Status& failure() const { return failure_; }

  // UnitStore.
  Result<const float*> acquire_params(int unit) override;
  void release_params(int unit) override;
  Result<float*> acquire_grads(int unit) override;
  Status grads_ready(int unit) override;

 private:
  // What a compute slot's fp32 copy holds of its unit: every parameter; the tensors other than
  // the weights (the GEMMs read those from the 16-bit parameters, Ops::note_widened_weights_only);
  // none (the others are read from their area apart too, Ops::note_kept_apart).
  enum class Holds { kAll, kOthers, kNothing };
  struct ComputeSlot {
    float* data = nullptr;
    int unit = -1;
    int users = 0;
    Holds holds = Holds::kAll;
  };
  // Makes the slot's copy of `unit` readable from `stored` (its 16-bit parameters): the weights
  // read by the GEMMs from `stored` where the backend promises it, the other tensors from the
  // unit's area apart (TierManager::kept_apart, widened there at the first use after a change of
  // the parameters) where it promises that too, else what it does not promise widened into the
  // copy. `again`: the slot holds this unit already, only what it lacks is widened.
  void widen(ComputeSlot& slot, int unit, const void* stored, bool again);
  OffloadStore(TierManager& tiers, OptimizerPipeline& pipeline, Sharding& sharding);
  // Waits for unit u's parameters (`whole`: every write of its update) from the optimizer step
  // in flight.
  Status wait_for_update(int unit, bool whole);
  // Records the first failure; returns `s`, or the recorded failure when there is one.
  Status guard(Status s);
  // ZeRO 1/2: the unit's shards other ranks updated, gathered at its first use after an update.
  Status regather(int unit);

  TierManager& tiers_;
  OptimizerPipeline& pipeline_;
  Sharding& sharding_;
  // In order of construction; destroyed in reverse (see the header comment).
  std::unique_ptr<GradPath> grads_;
  std::unique_ptr<ParamScheduler> scheduler_;
  std::unique_ptr<Progress> progress_;
  std::vector<std::uint8_t> regather_;             // per unit: all-gather before the next use
  std::vector<std::vector<ComputeSlot>> compute_;  // per size class
  std::vector<UnitRanges> ranges_;                 // per unit
  // Per unit: its area apart holds the present parameters' widening (cleared when they change).
  std::vector<std::uint8_t> apart_current_;
  StateCounters counters_;
  Status failure_;
  bool last_micro_batch_ = true;
  bool preloaded_ = false;
};

}  // namespace strata::offload
