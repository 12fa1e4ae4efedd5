// The update gate: how the prefetch scheduler (param_scheduler.h) and the optimizer pipeline
// (optimizer_pipeline.h) talk while an optimizer step is in flight. The protocol is written down
// here, once; the pipeline implements it, the scheduler uses it.
//
// Why there is a protocol at all: the optimizer changes every unit's parameters in their home, on a
// worker thread, while the trainer's thread already runs the next forward and the scheduler
// prefetches that forward's units. A unit read from its home before its update has landed there
// would be stale, so the scheduler asks the gate first:
//
//   params_ready(u)    true: u's parameters in their home are final (or no step is in flight) —
//                      fetch as usual. false: u's update is pending — do not fetch it yet.
//   wait_for_params(u) blocks until params_ready(u), moving the step along meanwhile (the
//                      pipeline's device copies are issued from the waiting thread); used where
//                      a fetch must happen now (a demand fetch, an all-gather every rank makes at
//                      the same point). Returns the step's first error.
//
// The hand-off, where device memory is host memory (the CPU backend) and parameters are homed
// on NVMe: instead of waiting for u's update and then reading the new parameters back from NVMe,
// the scheduler reserves u's frame and offers it:
//
//   offer_frame(u, p)  asks the pipeline to also write u's new parameters at p (the place of this
//                      rank's shard in the frame). Accepted (true) only while the worker has not
//                      begun u: the worker decides at u's first tile, so a unit is handed over
//                      whole or not at all, whatever the timing.
//   handed_off(u)      true once an accepted offer is filled: the frame holds u's new parameters
//                      (their write home may still be in flight; fetches from the home still wait
//                      for params_ready).
//
// Per unit and step, the offer is one atomic state the two threads move forward and never back:
//
//   none --trainer: offer_frame--> offered --worker: first tile of u--> taken
//                                                  (the worker copies each of u's tiles to p)
//   none --worker: first tile of u, no offer--> late (offer_frame now returns false)
//
// The gate is reset when a step starts (every unit back to none). While no step is in flight,
// params_ready is true and offer_frame false.
//
// Threads and lifetime: every member is called from the trainer's thread (the worker's side is
// internal to the pipeline). A scheduler holds its gate by pointer: the gate must outlive it (the
// scheduler's destructor completes hand-offs in flight through it; OffloadStore declares the
// pipeline before the scheduler for this reason).
#pragma once

#include "common/status.h"

namespace strata::offload {

class UpdateGate {
 public:
  virtual ~UpdateGate() = default;
  // Whether unit u's parameters in their home are final: no update in flight will change them.
  virtual bool params_ready(int unit) const = 0;
  // Blocks until params_ready(unit); the first error of the step in flight.
  virtual Status wait_for_params(int unit) = 0;
  // Offers `destination` (the unit's shard in a device frame) for unit u's new parameters; true
  // when accepted (the update of u is pending and not yet begun).
  virtual bool offer_frame(int unit, void* destination) = 0;
  // Whether an accepted offer for unit u has been filled with its new parameters.
  virtual bool handed_off(int unit) const = 0;
};

}  // namespace strata::offload
