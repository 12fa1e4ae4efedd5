// The CUDA backend's memory decisions, kept free of CUDA so that they build and are tested on every
// machine (CMake builds *_plan.cc everywhere): how large its own device workspaces are, and how
// many bytes it may pin. The kernels' launch decisions are in kernels/cuda/launch_plan.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata::backend {

// ---- the backend's own device workspaces ---------------------------------------------------
// Taken from the arena at creation, each at most its configured size and at most a fraction of the
// budget (cuBLASLt 1/32, reductions 1/32, 16-bit operands 1/8), so small budgets still leave most
// of the arena to the model. Sizes are multiples of 4 KiB.
struct WorkspaceSizes {
  std::uint64_t cublas_bytes = 0;
  std::uint64_t reduce_bytes = 0;   // at least kReduceScratchMinBytes
  std::uint64_t convert_bytes = 0;  // 0 unless the GEMMs convert; else at least the minimum
  std::uint64_t total() const { return cublas_bytes + reduce_bytes + convert_bytes; }
};
inline constexpr std::uint64_t kReduceScratchMinBytes = 1ull << 20;
WorkspaceSizes plan_workspaces(std::uint64_t capacity, std::uint64_t cublas_max,
                               std::uint64_t reduce_max, std::uint64_t convert_max, bool converts);

// ---- pinned memory ------------------------------------------------------------------------------
struct PinnedLimit {
  std::uint64_t bytes = 0;  // most pinned bytes allowed at once
  std::string reason;       // which limit binds, for errors: the budget key or "ulimit -l"
};
// min(host budget, RLIMIT_MEMLOCK soft limit); the lock limit does not apply when it is unlimited
// or the process may lock without limit (CAP_IPC_LOCK).
PinnedLimit pinned_limit(std::uint64_t host_budget_bytes, std::string_view host_budget_name,
                         std::optional<std::uint64_t> memlock_soft_bytes, bool can_lock_unlimited);

}  // namespace strata::backend
