// The CUDA backend's memory decisions (backend/cuda/memory_plan.h), tested without a GPU: the
// pinned limit names what binds, and the backend's own workspaces keep most of a small arena.
#include "backend/cuda/memory_plan.h"

#include <gtest/gtest.h>

#include "kernels/cuda/launch_plan.h"

namespace strata::backend {
namespace {

TEST(PinnedLimit, TheLockLimitBindsWhenItIsBelowTheBudget) {
  const PinnedLimit l = pinned_limit(8ull << 30, "strata.host_bytes_max", 64ull << 20, false);
  EXPECT_EQ(l.bytes, 64ull << 20);
  EXPECT_EQ(l.reason, "ulimit -l");
}

TEST(PinnedLimit, TheBudgetBindsWhenLockingIsUnlimitedOrPrivileged) {
  EXPECT_EQ(pinned_limit(8ull << 30, "strata.host_bytes_max", std::nullopt, false).reason,
            "strata.host_bytes_max");
  const PinnedLimit privileged = pinned_limit(8ull << 30, "strata.host_bytes_max", 1 << 16, true);
  EXPECT_EQ(privileged.bytes, 8ull << 30);
  EXPECT_EQ(privileged.reason, "strata.host_bytes_max");
}

TEST(Workspaces, LargeBudgetsGetTheConfiguredSizes) {
  const WorkspaceSizes w = plan_workspaces(80ull << 30, 32 << 20, 16 << 20, 128 << 20, true);
  EXPECT_EQ(w.cublas_bytes, 32u << 20);
  EXPECT_EQ(w.reduce_bytes, 16u << 20);
  EXPECT_EQ(w.convert_bytes, 128u << 20);
  EXPECT_EQ(plan_workspaces(80ull << 30, 32 << 20, 16 << 20, 128 << 20, false).convert_bytes, 0u);
}

TEST(Workspaces, SmallBudgetsKeepMostOfTheArena) {
  // The demo's 64 MiB device budget.
  const WorkspaceSizes w = plan_workspaces(64 << 20, 32 << 20, 16 << 20, 128 << 20, true);
  EXPECT_LE(w.total(), (64u << 20) / 4);
  EXPECT_GE(w.reduce_bytes, kReduceScratchMinBytes);
  EXPECT_GE(w.convert_bytes / 2, static_cast<std::uint64_t>(cuda::kGemmWorkspaceMinElements));
  EXPECT_EQ(w.cublas_bytes % 4096, 0u);
  EXPECT_EQ(w.convert_bytes % 4096, 0u);
}

TEST(Workspaces, TheConversionWorkspaceNeverFallsBelowItsMinimum) {
  const WorkspaceSizes w = plan_workspaces(64 << 20, 0, 0, 1, true);
  EXPECT_GE(w.convert_bytes / 2, static_cast<std::uint64_t>(cuda::kGemmWorkspaceMinElements));
  EXPECT_EQ(w.cublas_bytes, 0u);
  EXPECT_EQ(w.reduce_bytes, kReduceScratchMinBytes);
}

}  // namespace
}  // namespace strata::backend
