// The prefetch scheduler: brings units' parameters to the device ahead of their use. It is the
// runner's side of the parameter path, made of two parts:
//   PrefetchPolicy (prefetch_policy.h)  what to fetch ahead, evict and keep, from the recorded
//                                       order of uses and the plan's limits;
//   FrameFetcher (frame_fetcher.h)      how: frames, staging, NVMe reads, host->device copies,
//                                       the optimizer's hand-offs, failures.
// A unit whose parameters are not homed on the device ("framed", plan.h) is fetched into a frame
// of its size class. An acquire of a unit that is not resident fetches it on demand (demand I/O
// priority) and waits: frames never exceed the plan, so the device budget holds for demand
// fetches too. The time the compute thread waits is counted (compute_wait).
//
// ZeRO stage 3 on several ranks: each rank's home holds its shard of every unit; a fetch brings
// the shard into its place in the frame and acquire() all-gathers the rest from the other ranks
// (Sharding::start_gather, at every acquire: see gather()). The shard's read and copy are
// prefetched as above; each acquire also starts the all-gather of the unit planned next
// (gather_ahead()), so it runs while the current unit computes.
//
// While an optimizer step runs, the update gate (update_gate.h, where the protocol is written
// down) keeps the prefetcher away from units whose update is pending; where NVMe reads land in
// frames directly, the prefetcher instead reserves the frame and offers it through the gate, and
// the optimizer writes the new parameters into it as it computes them, so the forward that
// follows the optimizer finds them resident instead of reading them back. The optimizer changes
// parameters in their homes: invalidate() drops a unit's device copy.
//
// It never moves work along on its own: the engine's progress driver (progress.h) calls poll().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "offload/frame_fetcher.h"
#include "offload/prefetch_policy.h"
#include "offload/sharding.h"
#include "offload/tier_manager.h"
#include "offload/update_gate.h"

namespace strata::offload {

class ParamScheduler {
 public:
  // `gate`: the optimizer step's update gate (null when nothing updates the parameters while the
  // scheduler runs); it must outlive the scheduler. `sharding`: the ranks' collectives (null on
  // one rank; needed for a plan of several).
  static Result<std::unique_ptr<ParamScheduler>> create(TierManager& tiers,
                                                        UpdateGate* gate = nullptr,
                                                        Sharding* sharding = nullptr);
  ParamScheduler(const ParamScheduler&) = delete;
  ParamScheduler& operator=(const ParamScheduler&) = delete;

  // Starts / ends a pass (a training step's micro-batches are one pass each). A failure of the
  // prefetches or gathers they start is kept as the scheduler's first error (see first_error()).
  void begin_pass(Pass kind);
  void end_pass();
  // Unit u's parameters in the storage type on the device, valid until release(u). Returns the
  // first error once there is one.
  Result<const void*> acquire(int unit);
  void release(int unit);
  // Unit u's parameters changed in their home: its device copy is dropped. The unit must not be
  // in use or in flight.
  void invalidate(int unit) { fetcher_->invalidate(unit); }
  // Moves fetches along without blocking and starts planned prefetches; returns the first error
  // once there is one.
  Status poll();
  // Completes every fetch in flight; a fetch that fails is abandoned (its frame and staging
  // buffer freed), so drain always ends. Returns the first error of the scheduler, if any.
  Status drain() { return fetcher_->drain(); }
  // The first error any fetch, prefetch or gather met (ok if none): I/O errors and corrupt
  // extents are never lost, even where they happened in a call that cannot report them.
  const Status& first_error() const { return fetcher_->first_error(); }

  const SchedulerStats& stats() const { return stats_; }
  const UseOrder& order() const { return policy_.order(); }
  // Whether unit u is on the device now (resident, not in flight).
  bool resident(int unit) const;
  // Whether unit u's frame already holds the parameters of the update in flight (handed off by
  // the optimizer), so its use need not wait for their write to the NVMe home.
  bool holds_update(int unit) const { return fetcher_->holds_update(unit); }

 private:
  ParamScheduler(TierManager& tiers, UpdateGate* gate, Sharding* sharding);
  // Stage 3 on several ranks: all-gathers the unit's shards in its frame (blocking), or finishes
  // the gather gather_ahead() started for it.
  Status gather(int unit);
  // Starts the all-gather of the unit planned next (see the .cc for why ranks stay in step).
  Status gather_ahead();
  Status finish_gather(int unit);
  // Waits through the gate for unit u's pending update (counted as waiting, traced).
  Status wait_for_update(int unit);
  // Starts a prefetch of `unit`: a fetch, or a hand-off when its update is pending.
  Result<bool> start_prefetch(int unit);
  void add_wait(std::chrono::steady_clock::time_point start);

  TierManager& tiers_;
  UpdateGate* gate_ = nullptr;
  Sharding* sharding_ = nullptr;
  const TierPlan& plan_;
  SchedulerStats stats_;
  PrefetchPolicy policy_;
  std::unique_ptr<FrameFetcher> fetcher_;
  struct Gather {
    bool in_flight = false;  // an all-gather started ahead (it holds a use of the unit)
    comm::Handle handle;
  };
  std::vector<Gather> gathers_;  // per unit
};

}  // namespace strata::offload
