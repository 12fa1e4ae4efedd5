// CPU Adam (see cpu_adam.h).
#include "offload/cpu_adam.h"

#include <fmt/format.h>

namespace strata::offload {

Result<std::unique_ptr<CpuAdam>> CpuAdam::create(const optim::AdamSettings& settings, int threads) {
  STRATA_ASSIGN_OR_RETURN(kernels::AdamKernel kernel, kernels::AdamKernel::create());
  runtime::CpuExecutor::Options options;
  options.threads = threads;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<runtime::CpuExecutor> executor,
                          runtime::CpuExecutor::create(options));
  return std::unique_ptr<CpuAdam>(new CpuAdam(kernel, std::move(executor), settings));
}

std::string CpuAdam::description() const {
  return fmt::format("{} ({}, {} threads)", settings_.adamw ? "AdamW" : "Adam",
                     sys::to_string(kernel_.simd()), executor_->threads());
}

void CpuAdam::update(const kernels::AdamParams& params, const kernels::AdamFusion& fusion,
                     const kernels::AdamTile& tile) {
  kernel_.step(params, fusion, tile, executor_.get());
}

}  // namespace strata::offload
