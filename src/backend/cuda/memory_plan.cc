// The CUDA backend's memory decisions (see memory_plan.h).
#include "backend/cuda/memory_plan.h"

#include <algorithm>

#include "kernels/cuda/launch_plan.h"

namespace strata::backend {

WorkspaceSizes plan_workspaces(std::uint64_t capacity, std::uint64_t cublas_max,
                               std::uint64_t reduce_max, std::uint64_t convert_max, bool converts) {
  auto page = [](std::uint64_t bytes) { return bytes / 4096 * 4096; };
  WorkspaceSizes w;
  w.cublas_bytes = page(std::min(cublas_max, capacity / 32));
  w.reduce_bytes = page(std::max(std::min(reduce_max, capacity / 32), kReduceScratchMinBytes));
  if (converts) {
    const std::uint64_t minimum =
        (static_cast<std::uint64_t>(cuda::kGemmWorkspaceMinElements) * 2 + 4095) / 4096 * 4096;
    w.convert_bytes = std::max(page(std::min(convert_max, capacity / 8)), minimum);
  }
  return w;
}

PinnedLimit pinned_limit(std::uint64_t host_budget_bytes, std::string_view host_budget_name,
                         std::optional<std::uint64_t> memlock_soft_bytes, bool can_lock_unlimited) {
  PinnedLimit limit{host_budget_bytes, std::string(host_budget_name)};
  if (!can_lock_unlimited && memlock_soft_bytes && *memlock_soft_bytes < host_budget_bytes) {
    limit.bytes = *memlock_soft_bytes;
    limit.reason = "ulimit -l";
  }
  return limit;
}

}  // namespace strata::backend
