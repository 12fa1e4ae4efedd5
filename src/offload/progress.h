// The engine's one progress driver. Three engines have work in flight that nobody waits for at
// once — the optimizer's host->device copies of new parameters, gradients on their way home,
// parameter fetches — and each moves only when asked. Instead of each engine moving itself here
// and there (three pumps called from five places), the store calls poll() once at every point
// where the runner comes by (an acquire, a gradient handed over, the end of a micro-batch), and
// poll() moves all of them along without blocking, in one fixed order:
//   1. the optimizer's device copies (the next forward waits for their units);
//   2. the gradients that have arrived (their staging buffers come free for the next units);
//   3. parameter fetches, then the prefetches there is room for now.
// It returns the first error. Blocking waits (a demand fetch, a frame, an update) stay with the
// engine that waits; they move their own work while they block, and the store, once an update it
// waited for is home, moves the optimizer's copies on through poll_updates() (step 1 alone: the
// unit it waited for is not acquired yet, so no fetch may be issued before it).
#pragma once

#include "common/status.h"

namespace strata::offload {

class OptimizerPipeline;
class GradPath;
class ParamScheduler;

class Progress {
 public:
  Progress(OptimizerPipeline& pipeline, GradPath& grads, ParamScheduler& scheduler)
      : pipeline_(pipeline), grads_(grads), scheduler_(scheduler) {}
  // Moves everything in flight along, without blocking; the first error.
  Status poll();
  // Step 1 of poll() alone: the optimizer's device copies; the step's first error.
  Status poll_updates();

 private:
  OptimizerPipeline& pipeline_;
  GradPath& grads_;
  ParamScheduler& scheduler_;
};

}  // namespace strata::offload
