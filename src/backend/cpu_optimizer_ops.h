// OptimizerOps for the CPU backend: kernels::AdamKernel on the backend's oneTBB arena, blocks of
// kAdamBlockElems dealt to its threads (the update is element-wise, so the split does not change
// a bit), and gradient statistics from AdamKernel::grad_stats added in call order.
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
  void grad_stats_reset() override { total_ = {}; }
  void grad_stats_add(const void* grad, kernels::DType dtype, std::int64_t n) override;
  Result<kernels::GradStats> grad_stats_read() override { return total_; }

 private:
  tbb::task_arena* arena_;
  kernels::AdamKernel kernel_;
  kernels::GradStats total_;
};

}  // namespace strata::backend
