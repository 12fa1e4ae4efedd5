// Optimizer work on state that stays in the backend's device memory: with offload_optimizer none
// the plan keeps the fp32 master, exp_avg, exp_avg_sq and gradient of the units on the device
// (strata.device_optimizer, offload/plan.h), and the optimizer pipeline runs each tile's AdamW
// here instead of streaming it through CPU Adam (offload/optimizer_pipeline.h).
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
};

}  // namespace strata::backend
