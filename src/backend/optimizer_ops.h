// Optimizer work on state that stays in the backend's device memory: with
// zero_optimization.offload_optimizer.ratio < 1 a fraction of the tiles (fp32 master, exp_avg,
// exp_avg_sq and gradient) is kept on the device and updated there instead of being streamed
// through CPU Adam. Also the gradient statistics that global clipping and dynamic loss scaling
// need (sum of squares and inf/NaN count), accumulated on the device so that the global norm costs
// one read-back per step rather than one per unit.
//
// Everything runs on the compute stream. Pointers are device memory of the backend that made the
// OptimizerOps. The CPU backend runs kernels::AdamKernel; the CUDA backend runs kernels/cuda/adam,
// which performs the same fp32 operations, so both give bit-identical weights, moments and
// bf16/fp16 copies.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/dtype.h"

namespace strata::backend {

class OptimizerOps {
 public:
  virtual ~OptimizerOps() = default;

  // One Adam/AdamW step over a tile in device memory, with kernels::AdamKernel::step's semantics
  // (contract in kernels/cpu/adam.h). Without fusion.check_finite it only queues the work and
  // returns {skipped = false}; with check_finite it waits for the compute stream and reports
  // whether the tile was skipped (and leaves it untouched when it was). Errors: kInvalidArgument
  // for params out of range; a CUDA failure as kInternal.
  virtual Result<kernels::AdamResult> adam_step(const kernels::AdamParams& params,
                                                const kernels::AdamFusion& fusion,
                                                const kernels::AdamTile& tile) = 0;

  // Zeroes the gradient-statistics accumulator.
  virtual void grad_stats_reset() = 0;
  // Adds the statistics of grad[0, n) (device memory, `dtype`) to the accumulator. Asynchronous;
  // contributions are combined in call order, so the total does not depend on timing.
  virtual void grad_stats_add(const void* grad, kernels::DType dtype, std::int64_t n) = 0;
  // Waits for the compute stream and returns the accumulated statistics: sum_sq is inf/NaN when
  // any element was.
  virtual Result<kernels::GradStats> grad_stats_read() = 0;
};

}  // namespace strata::backend
