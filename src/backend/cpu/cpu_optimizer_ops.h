// OptimizerOps for the CPU backend: kernels::AdamKernel on the backend's oneTBB arena, blocks of
// kAdamBlockElems dealt to its threads (the update is element-wise, so the split does not change
// a bit).
#pragma once

#include <tbb/task_arena.h>

#include "backend/optimizer_ops.h"

namespace strata::backend {

class CpuOptimizerOps final : public OptimizerOps {
 public:
  CpuOptimizerOps(tbb::task_arena* arena, kernels::AdamKernel kernel)
      : arena_(arena), kernel_(kernel) {}

  Result<kernels::AdamResult> adam_step(const kernels::AdamParams& params,
                                        const kernels::AdamFusion& fusion,
                                        const kernels::AdamTile& tile) override;

 private:
  tbb::task_arena* arena_;
  kernels::AdamKernel kernel_;
};

}  // namespace strata::backend
