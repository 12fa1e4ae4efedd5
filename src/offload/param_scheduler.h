// The prefetch scheduler: brings units' parameters to the device ahead of their use.
//
// A unit whose parameters are not homed on the device ("framed", plan.h) is fetched into a
// device frame of its size class: from NVMe into a pinned staging buffer (tile by tile), then
// host->device; from a host home, host->device directly. Where device memory is host memory (the
// CPU backend) NVMe reads land in the frame itself: no staging, no copy, and a fetch is complete
// as soon as its reads are, without waiting for the compute thread to issue the copy. After the
// first pass has recorded the order of uses (UseOrder), every acquire also starts fetches for the
// units planned next, in order, within the plan's prefetch limits (plan.h, PrefetchLimits):
//   - the units fetched ahead and not yet used total at most bucket_elements,
//   - the units on the device (in use, cached, in flight) total at most live_elements_max,
//   - a frame of the unit's class is free, or holds a unit whose next use comes later
//     (eviction by next use: the farthest goes first), and a staging buffer is free.
// A released unit stays cached in its frame when its next planned use is within
// reuse_distance_max elements of parameters; persistent units (plan.h) have frames of their own
// and stay resident.
// An acquire of a unit that is not resident fetches it on demand (demand I/O priority) and waits:
// frames never exceed the plan, so the device budget holds for demand fetches too. The time the
// compute thread waits is counted (compute_wait).
//
// ZeRO stage 3 on several ranks: each rank's home holds its shard of every unit; a fetch brings the
// shard into its place in the frame and acquire() all-gathers the rest from the other ranks (at
// every acquire: see gather()). The shard's NVMe read and host->device copy are prefetched as
// above; each acquire also starts the all-gather of the unit planned next (gather_ahead()), so it
// runs while the current unit computes.
//
// While an optimizer step runs, the update gate (update_gate.h, where the protocol is written
// down) keeps the prefetcher away from units whose update is pending; where NVMe reads land in
// frames directly, the prefetcher instead reserves the frame and offers it through the gate, and
// the optimizer writes the new parameters into it as it computes them (start_handoff()), so the
// forward that follows the optimizer finds them resident instead of reading them back. The
// optimizer changes parameters in their homes: invalidate() drops a unit's device copy.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "offload/tier_manager.h"
#include "offload/update_gate.h"
#include "offload/use_order.h"

namespace strata::offload {

struct SchedulerStats {
  std::uint64_t demand_fetches = 0;  // acquires that found the unit absent
  std::uint64_t prefetches = 0;      // fetches started ahead of use
  std::uint64_t late = 0;            // acquires that found a prefetch still in flight
  std::uint64_t hits = 0;            // acquires that found the unit resident
  std::uint64_t evictions = 0;
  std::uint64_t bytes_to_device = 0;  // host->device bytes
  double wait_ms = 0.0;               // compute thread blocked in acquire (all-gathers included)
  std::uint64_t handoffs = 0;         // units the optimizer wrote straight into their frame
  std::uint64_t gathers = 0;          // all-gathers of stage-3 shards (several ranks)
  std::uint64_t gathers_ahead = 0;    // of them, started one use ahead
};

// The collective type of a storage type.
comm::DataType comm_type(kernels::DType type);

class ParamScheduler {
 public:
  // `gate`: the optimizer step's update gate (null when nothing updates the parameters while the
  // scheduler runs); it must outlive the scheduler. `comm`: the data-parallel ranks (needed when
  // the plan is for more than one).
  static Result<std::unique_ptr<ParamScheduler>> create(TierManager& tiers,
                                                        UpdateGate* gate = nullptr,
                                                        comm::Comm* comm = nullptr);
  ~ParamScheduler();
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
  void invalidate(int unit);
  // Moves fetches along without blocking and starts planned prefetches; returns the first error
  // once there is one.
  Status pump();
  // Completes every fetch in flight; a fetch that fails is abandoned (its frame and staging
  // buffer freed), so drain always ends. Returns the first error of the scheduler, if any.
  Status drain();
  // The first error any fetch, prefetch or gather met (ok if none): I/O errors and corrupt
  // extents are never lost, even where they happened in a call that cannot report them.
  const Status& first_error() const { return first_error_; }

  const SchedulerStats& stats() const { return stats_; }
  const UseOrder& order() const { return order_; }
  // Whether unit u is on the device now (resident, not in flight).
  bool resident(int unit) const;
  // Whether unit u's frame already holds the parameters of the update in flight (handed off by
  // the optimizer), so its use need not wait for their write to the NVMe home.
  bool holds_update(int unit) const;

 private:
  // kHandoff: a frame is reserved and offered to the optimizer, which writes the unit's new
  // parameters into it.
  enum class Stage : std::uint8_t { kAbsent, kReading, kCopying, kHandoff, kResident };
  struct UnitState {
    Stage stage = Stage::kAbsent;
    int frame = -1;  // index in its class's pool; -1 with a persistent frame
    int users = 0;
    int staging = -1;  // param staging buffer while reading / copying from NVMe
    std::int64_t next_tile = 0;
    std::int64_t done_tiles = 0;
    std::vector<io::SwapHandle> reads;  // per tile
    std::vector<std::uint8_t> read_done;
    backend::Event copied;
    std::uint64_t begin_us = 0;
    bool handed = false;     // resident through a hand-off of the current update
    bool gathering = false;  // an all-gather started ahead is in flight (and holds a use)
    comm::Handle gather;
    // Persistent units: recorded on the compute stream at each last release (see Frame).
    backend::Event released;
  };
  struct Frame {
    void* data = nullptr;
    int unit = -1;
    // Recorded on the compute stream when the unit it holds is released: nothing may write the
    // frame for another fetch before the kernels queued up to then have read it.
    backend::Event released;
  };

  ParamScheduler(TierManager& tiers, UpdateGate* gate, comm::Comm* comm);
  // Where this rank's shard goes in the unit's frame (the frame itself unless stage 3 shards it).
  void* shard_data(int unit);
  // Stage 3 on several ranks: all-gathers the unit's shards in its frame (blocking), or finishes
  // the gather gather_ahead() started for it.
  Status gather(int unit);
  bool sharded(int unit) const;
  // Starts the all-gather of the unit planned next (see the .cc for why ranks stay in step).
  Status gather_ahead();
  // Reserves a frame for `unit` (update pending) and offers it through the gate; false when no
  // frame is free or the optimizer has begun the unit already.
  Result<bool> start_handoff(int unit);
  Status finish_gather(int unit);
  // Waits through the gate for unit u's pending update (counted as waiting, traced).
  Status wait_for_update(int unit);
  UnitState& state(int unit) { return states_[static_cast<std::size_t>(unit)]; }
  void* frame_data(int unit);
  std::int64_t numel(int unit) const;
  // Starts fetching `unit`; false when no frame or staging buffer is available (prefetch only:
  // a demand fetch waits for one).
  Result<bool> start_fetch(int unit, bool demand);
  Result<int> find_frame(int unit, bool demand);
  Result<int> find_staging(bool demand);
  Status issue_reads(int unit, bool demand);
  // Moves one fetch along (see move_fetch()); a fetch that fails is abandoned and its error
  // recorded, so the unit leaves in_flight_ either way when `block`.
  Status advance(int unit, bool block);
  Status move_fetch(int unit, bool block);
  // Ends a failed fetch: waits for its reads still in flight and its copy, frees its staging
  // buffer and frame, and takes it off in_flight_ (the unit is absent again).
  void abandon(int unit);
  // Keeps `s` as the first error if it is one.
  void note(const Status& s);
  Status complete(int unit);
  // The event after which unit u's frame is free of its previous user's kernels.
  backend::Event frame_released(int unit);
  // Orders a write into unit u's frame after those kernels: on the host->device stream (`copy`),
  // or by blocking the caller (a host or I/O-engine write: direct reads, the optimizer's hand-off).
  Status wait_frame_free(int unit, bool copy);
  void evict(int unit);
  Status prefetch();
  int next_use(int unit) const;

  TierManager& tiers_;
  UpdateGate* gate_ = nullptr;
  comm::Comm* comm_ = nullptr;
  backend::Backend& backend_;
  const TierPlan& plan_;
  const PrefetchLimits& limits_;
  bool direct_ = false;  // NVMe reads land in the frames (device memory is host memory)
  UseOrder order_;
  std::vector<UnitState> states_;
  std::vector<std::vector<Frame>> frames_;  // per size class
  std::vector<std::uint8_t> staging_busy_;
  std::vector<int> in_flight_;  // units reading or copying, in start order
  int reads_in_flight_ = 0;
  SchedulerStats stats_;
  Status first_error_;
};

}  // namespace strata::offload
