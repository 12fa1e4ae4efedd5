// CPU Adam: the Adam kernel (kernels/cpu/adam.h) on threads of its own, with the hyperparameters
// it was made with. The engine builds one (engine.h) and the optimizer pipeline runs it on each
// tile of host- and NVMe-homed state, handing the kernel's own AdamTile over as the tile is
// stored, so no second description of a tile stands between the pipeline and the kernel.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "kernels/cpu/adam.h"
#include "optim/adam_optimizer.h"
#include "runtime/cpu_executor.h"

namespace strata::offload {

class CpuAdam {
 public:
  // Adam or AdamW per `settings`, on `threads` threads (0 = all). Errors: the kernel's (no SIMD
  // path here) and the executor's.
  static Result<std::unique_ptr<CpuAdam>> create(const optim::AdamSettings& settings, int threads);

  // "AdamW (avx2, 2 threads)".
  std::string description() const;
  // The hyperparameters it was made with (a device-side Adam uses the same).
  const optim::AdamSettings& settings() const { return settings_; }
  // One step over `tile` in place (and its copy-out when given), on this driver's threads.
  void update(const kernels::AdamParams& params, const kernels::AdamFusion& fusion,
              const kernels::AdamTile& tile);

 private:
  CpuAdam(kernels::AdamKernel kernel, std::unique_ptr<runtime::CpuExecutor> executor,
          const optim::AdamSettings& settings)
      : kernel_(kernel), executor_(std::move(executor)), settings_(settings) {}

  kernels::AdamKernel kernel_;
  std::unique_ptr<runtime::CpuExecutor> executor_;
  optim::AdamSettings settings_;
};

}  // namespace strata::offload
