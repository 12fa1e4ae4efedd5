// The gradient path on its own, over flat units and the I/O fault twin: micro-batches accumulate
// in fp32 in every home (the first overwrites what was there), the norm is the tile sums in
// order, more units than frames and staging buffers wait for them instead of failing, and a
// failed gradient write is reported.
#include "offload/grad_path.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/cpu/float16.h"
#include "kernels/cpu/nn_ops.h"
#include "offload_fixture.h"

namespace strata::offload {
namespace {

using testing::FlatTiers;

// The gradient of micro-batch m for element i of unit u, exact in bf16 and fp16.
float grad_value(int unit, int micro_batch, std::int64_t i) {
  return testing::known_value(unit, SlotKind::kGrad, i, micro_batch) - 0.5f;
}

// Runs `micro_batches` micro-batches whose backward visits the units last to first, as the
// runner does.
Status run_backward(GradPath& grads, TierManager& tiers, int micro_batches) {
  const TierPlan& plan = tiers.plan();
  const int units = static_cast<int>(plan.units.size());
  for (int m = 0; m < micro_batches; ++m) {
    grads.begin_micro_batch(m == 0, m == micro_batches - 1);
    for (int u = units - 1; u >= 0; --u) {
      STRATA_ASSIGN_OR_RETURN(float* frame, grads.acquire(u));
      // The host stands in for a kernel: it writes the frame once the stream has zeroed it.
      STRATA_TRY(tiers.backend().synchronize(backend::StreamKind::kCompute));
      const std::int64_t n = plan.units[static_cast<std::size_t>(u)].padded_numel;
      for (std::int64_t i = 0; i < n; ++i)
        frame[i] += grad_value(u, m, i);
      STRATA_TRY(grads.ready(u));
    }
    STRATA_TRY(grads.poll());
  }
  return grads.drain();
}

// The accumulator and norm the path must produce: fp32 sums in micro-batch order, and the sum of
// each tile's sum of squares in (unit, tile) order.
std::vector<float> expected_sum(int unit, std::int64_t n, int micro_batches) {
  std::vector<float> acc(static_cast<std::size_t>(n), 0.0f);
  for (int m = 0; m < micro_batches; ++m) {
    for (std::int64_t i = 0; i < n; ++i)
      acc[static_cast<std::size_t>(i)] += grad_value(unit, m, i);
  }
  return acc;
}

TEST(GradPath, MicroBatchesAccumulateInFp32InEveryHome) {
  const struct {
    const char* name;
    kernels::DType storage;
    Tier optim;
  } cases[] = {
      {"bf16, host", kernels::DType::kBF16, Tier::kHost},
      {"bf16, nvme", kernels::DType::kBF16, Tier::kNvme},
      {"fp16, nvme", kernels::DType::kF16, Tier::kNvme},
      {"fp32, host", kernels::DType::kF32, Tier::kHost},
  };
  constexpr int kMicroBatches = 3;
  for (const auto& c : cases) {
    FlatTiers f;
    ASSERT_TRUE(f.build({5000, 2048, 6000},
                        testing::flat_settings(c.storage, Tier::kDevice, c.optim, f.dir.path()))
                    .is_ok())
        << c.name;
    // What an earlier step left in the accumulators: the first micro-batch overwrites it.
    for (int u = 0; u < f.tiers->units(); ++u)
      ASSERT_TRUE(testing::fill(*f.tiers, u, SlotKind::kGrad, 3).is_ok());
    auto grads = GradPath::create(*f.tiers);
    ASSERT_TRUE(grads.is_ok()) << c.name;
    Status s = run_backward(**grads, *f.tiers, kMicroBatches);
    ASSERT_TRUE(s.is_ok()) << c.name << ": " << s.to_string();
    double norm = 0.0;
    for (int u = 0; u < f.tiers->units(); ++u) {
      const UnitPlan& up = f.plan().units[static_cast<std::size_t>(u)];
      const std::vector<float> want = expected_sum(u, up.shard_numel, kMicroBatches);
      auto got = testing::read(*f.tiers, u, SlotKind::kGrad);
      ASSERT_TRUE(got.is_ok()) << c.name;
      EXPECT_EQ(*got, want) << c.name << " unit " << u;
      for (std::int64_t t = 0; t < up.tiles; ++t)
        norm += kernels::sum_squares(want.data() + f.plan().tile_begin(u, t),
                                     f.plan().tile_numel(u, t));
    }
    EXPECT_EQ((*grads)->sum_squares(), norm) << c.name;
  }
}

TEST(GradPath, MoreUnitsThanFramesAndStagingBuffersWaitForThem) {
  FlatTiers f;
  // Six units of one size: at most two gradient frames and two staging buffers serve them.
  ASSERT_TRUE(f.build({4096, 4096, 4096, 4096, 4096, 4096},
                      testing::flat_settings(kernels::DType::kBF16, Tier::kDevice, Tier::kNvme,
                                             f.dir.path()))
                  .is_ok());
  ASSERT_EQ(f.plan().classes.size(), 1u);
  ASSERT_LE(f.plan().classes[0].grad_frames, 2);
  ASSERT_EQ(f.plan().grad_staging_buffers, 2);
  auto grads = GradPath::create(*f.tiers).value();
  ASSERT_TRUE(run_backward(*grads, *f.tiers, 2).is_ok());
  for (int u = 0; u < f.tiers->units(); ++u) {
    auto got = testing::read(*f.tiers, u, SlotKind::kGrad);
    ASSERT_TRUE(got.is_ok());
    EXPECT_EQ(*got, expected_sum(u, 4096, 2)) << "unit " << u;
  }
  EXPECT_GE(grads->wait_ms(), 0.0);
}

TEST(GradPath, ANonFiniteGradientMakesTheNormNonFinite) {
  FlatTiers f;
  ASSERT_TRUE(f.build({5000, 2048}, testing::flat_settings(kernels::DType::kF16, Tier::kDevice,
                                                           Tier::kHost, f.dir.path()))
                  .is_ok());
  auto grads = GradPath::create(*f.tiers).value();
  grads->begin_micro_batch(true, true);
  for (int u = 1; u >= 0; --u) {
    float* frame = grads->acquire(u).value();
    ASSERT_TRUE(f.tiers->backend().synchronize(backend::StreamKind::kCompute).is_ok());
    frame[7] = u == 0 ? 1e6f : 1.0f;  // beyond fp16's range: infinity once it leaves the device
    ASSERT_TRUE(grads->ready(u).is_ok());
  }
  ASSERT_TRUE(grads->drain().is_ok());
  EXPECT_FALSE(std::isfinite(grads->sum_squares()));
}

TEST(GradPath, AFailedGradientWriteIsReportedNamingTheSwapFile) {
  FlatTiers f;
  ASSERT_TRUE(
      f.build({5000, 2048, 6000}, testing::flat_settings(kernels::DType::kBF16, Tier::kDevice,
                                                         Tier::kNvme, f.dir.path()))
          .is_ok());
  auto grads = GradPath::create(*f.tiers).value();
  io::SimFaults faults;
  faults.enospc_rate = 1.0;
  f.sim->set_faults(faults);
  Status s = run_backward(*grads, *f.tiers, 1);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), ErrorCode::kNoSpace) << s.to_string();
  EXPECT_NE(s.to_string().find("strata-"), std::string::npos) << s.to_string();
  f.sim->set_faults({});
}

}  // namespace
}  // namespace strata::offload
