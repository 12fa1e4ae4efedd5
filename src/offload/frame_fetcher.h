// The mechanics of bringing parameters to the device (what the prefetch scheduler decides to
// fetch, param_scheduler.h, this carries out): per framed unit a state machine
//
//   absent --start_fetch--> reading (NVMe tiles into a staging buffer, or into the frame itself
//                           where device memory is host memory) --> copying (host->device) -->
//                           resident
//   absent --start_fetch--> copying (from a host home, or a stage-3 shard's device home) --> ...
//   absent --start_handoff--> hand-off (the optimizer writes the new parameters into the frame,
//                           update_gate.h) --> resident
//   resident --evict--> absent (the frame is free for another unit)
//
// over the plan's frames (one pool per size class, plus a frame of its own for each persistent
// unit) and parameter staging buffers. A frame taken by a new fetch is written only after the
// kernels that read it for its previous unit (an event recorded at that unit's last release), on
// the host->device stream or, for writes by the host or the I/O engine, by waiting for it. A fetch
// that fails is abandoned (its reads waited for, its frame and staging freed), and its error is
// kept as the first error, so draining always ends.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "offload/tier_manager.h"
#include "offload/update_gate.h"

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

class PrefetchPolicy;

class FrameFetcher {
 public:
  enum class Stage : std::uint8_t { kAbsent, kReading, kCopying, kHandoff, kResident };

  // `gate`: the optimizer step's update gate (may be null); it must outlive the fetcher.
  static Result<std::unique_ptr<FrameFetcher>> create(TierManager& tiers, UpdateGate* gate,
                                                      SchedulerStats* stats);
  // Completes or abandons every fetch in flight.
  ~FrameFetcher();
  FrameFetcher(const FrameFetcher&) = delete;
  FrameFetcher& operator=(const FrameFetcher&) = delete;

  // ---- a unit's state -----------------------------------------------------------------------
  Stage stage(int unit) const { return states_[static_cast<std::size_t>(unit)].stage; }
  // Holds on the unit (acquires in use, and a gather started ahead): a held unit is not evicted.
  int users(int unit) const { return states_[static_cast<std::size_t>(unit)].users; }
  void hold(int unit) { ++states_[static_cast<std::size_t>(unit)].users; }
  // Drops a hold; returns the holds left.
  int unhold(int unit);
  // Whether the unit's frame holds the parameters of the update in flight (a hand-off).
  bool holds_update(int unit) const;
  // The unit's frame (device memory, the whole padded unit), and where this rank's shard goes in
  // it (the frame itself unless stage 3 shards the parameters).
  void* frame_data(int unit) const;
  void* shard_data(int unit) const;
  // Framed units on the device now or on their way, and their elements.
  std::uint64_t live_elements() const;
  // Whether a frame of the unit's class is free or held by a unit nobody holds.
  bool frame_available(int unit) const;
  // Whether device memory is host memory (NVMe reads land in frames; hand-offs are possible).
  bool direct() const { return direct_; }

  // ---- fetching -----------------------------------------------------------------------------
  // Starts fetching an absent unit into a frame of its class; `policy` picks the cached unit to
  // evict when none is free. A prefetch (demand false) returns false when no frame or staging
  // buffer is available; a demand fetch waits for one.
  Result<bool> start_fetch(int unit, bool demand, const PrefetchPolicy& policy);
  // Reserves a frame for `unit` (update pending) and offers it through the gate; false when no
  // frame is free or the optimizer has begun the unit already.
  Result<bool> start_handoff(int unit, const PrefetchPolicy& policy);
  // Moves one fetch along: reads done -> host->device copy -> resident; with `block`, until it
  // is resident. A fetch that fails is abandoned and its error kept (first_error()).
  Status advance(int unit, bool block);
  // Moves every fetch in flight along without blocking.
  Status poll();
  // Completes every fetch in flight (a failing one is abandoned), so it always ends; returns the
  // first error.
  Status drain();
  // The unit's kernels are queued (its last hold was dropped by a release): whoever writes its
  // frame next waits for them.
  Status released(int unit);
  // Gives the unit's frame up (the unit must be resident or absent and not held).
  void evict(int unit);
  // The unit's parameters changed in their home: its device copy is dropped.
  void invalidate(int unit);

  // Keeps `s` as the first error if it is one; the first error any fetch met.
  void note(const Status& s);
  const Status& first_error() const { return first_error_; }

 private:
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
    // Persistent units: recorded on the compute stream at each last release (see Frame).
    backend::Event released;
    std::uint64_t begin_us = 0;
    bool handed = false;  // resident through a hand-off of the current update
  };
  struct Frame {
    void* data = nullptr;
    int unit = -1;
    // Recorded on the compute stream when the unit it holds is released.
    backend::Event released;
  };

  FrameFetcher(TierManager& tiers, UpdateGate* gate, SchedulerStats* stats);
  UnitState& state(int unit) { return states_[static_cast<std::size_t>(unit)]; }
  const UnitState& state(int unit) const { return states_[static_cast<std::size_t>(unit)]; }
  Result<int> find_frame(int unit, bool demand, const PrefetchPolicy& policy);
  Result<int> find_staging(bool demand);
  Status issue_reads(int unit, bool demand);
  Status move_fetch(int unit, bool block);
  void abandon(int unit);
  Status complete(int unit);
  // The event after which unit u's frame is free of its previous user's kernels, and the wait
  // for it: on the host->device stream (`copy`) or by the calling thread.
  backend::Event frame_released(int unit) const;
  Status wait_frame_free(int unit, bool copy);

  TierManager& tiers_;
  UpdateGate* gate_ = nullptr;
  SchedulerStats* stats_;
  backend::Backend& backend_;
  const TierPlan& plan_;
  bool direct_ = false;
  std::vector<UnitState> states_;
  std::vector<std::vector<Frame>> frames_;  // per size class
  std::vector<std::uint8_t> staging_busy_;
  std::vector<int> in_flight_;  // units reading, copying or handed off, in start order
  int reads_in_flight_ = 0;
  Status first_error_;
};

}  // namespace strata::offload
