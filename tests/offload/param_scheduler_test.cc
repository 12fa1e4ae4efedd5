// The prefetch scheduler over the tier manager (CPU backend, the I/O twin): whatever order the
// runner uses units in — the recorded one, one that deviates, units it never used before — every
// acquire returns that unit's current parameters, frames never exceed the plan, and nothing hangs.
#include "offload/param_scheduler.h"

#include <gtest/gtest.h>

#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "common/fault_points.h"
#include "io/sim/sim_engine.h"
#include "kernels/cpu/float16.h"
#include "model/model_spec.h"
#include "offload/use_order.h"
#include "support/run_strata.h"
#include "train/run_settings.h"

namespace strata::offload {
namespace {

TEST(UseOrder, RecordsThenFollowsAndPatchesADivergence) {
  UseOrder order(5, 32);
  order.begin(Pass::kTrain);
  EXPECT_FALSE(order.planned());
  for (int u : {0, 1, 2, 3, 0, 2, 1})
    EXPECT_TRUE(order.use(u));
  order.end();
  order.begin(Pass::kTrain);
  EXPECT_TRUE(order.planned());
  EXPECT_TRUE(order.use(0));
  EXPECT_EQ(order.next_use(2, order.cursor()), 2);
  EXPECT_FALSE(order.use(3));  // skipped 1 and 2: jumps to 3's planned use
  EXPECT_EQ(order.cursor(), 4);
  EXPECT_FALSE(order.use(4));  // never planned: cursor stays
  EXPECT_EQ(order.cursor(), 4);
  order.end();  // the diverged pass becomes the plan
  order.begin(Pass::kTrain);
  for (int u : {0, 3, 4})
    EXPECT_TRUE(order.use(u));
  EXPECT_EQ(order.divergences(), 2u);
  // Evaluation passes have a plan of their own.
  order.end();
  order.begin(Pass::kEval);
  EXPECT_FALSE(order.planned());
}

class SchedulerTest : public ::testing::Test {
 protected:
  void build(std::uint64_t bucket) {
    config::ModelConfig m;
    m.vocab_size = 64;
    m.max_seq_len = 16;
    m.hidden_size = 32;
    m.num_layers = 4;
    m.num_heads = 4;
    shape_ = model::resolve_shape(m).value();
    layout_ = model::build_layout(shape_);
    config_.bf16.enabled = true;
    config_.zero_optimization.stage = 3;
    config_.zero_optimization.offload_param.device = config::OffloadDevice::kNvme;
    config_.zero_optimization.offload_param.nvme_path = {dir_.path()};
    config_.zero_optimization.offload_param.max_in_cpu = 0;
    config_.zero_optimization.offload_param.buffer_count = 2;
    config_.zero_optimization.offload_param.buffer_size = 1024;
    config_.zero_optimization.offload_optimizer.device = config::OffloadDevice::kCpu;
    config_.zero_optimization.stage3_param_persistence_threshold = 0;
    config_.zero_optimization.stage3_prefetch_bucket_size = bucket;
    config_.zero_optimization.sub_group_size = 4096;  // several tiles per block
    backend::CpuBackendOptions bo;
    bo.device_bytes_max = 16 << 20;
    bo.host_bytes_max = 64 << 20;
    backend_ = backend::make_cpu_backend(bo).value();
    PlanInput in;
    in.settings = train::plan_settings(config_);
    in.layout = &layout_;
    in.device_budget_bytes = 16 << 20;
    TierOptions options;
    options.engine_factory = [](const io::EngineOptions& eo) {
      io::SimOptions so;
      so.capacity_bytes = 64 << 20;
      return io::make_sim_engine(eo, so);
    };
    auto tiers = TierManager::create(*backend_, layout_, make_plan(in).value(), options);
    ASSERT_TRUE(tiers.is_ok()) << tiers.status().to_string();
    tiers_ = std::move(*tiers);
    auto s = ParamScheduler::create(*tiers_);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    scheduler_ = std::move(*s);
    set_version(1);
  }

  // Writes parameters that say which unit and version they are (exact in bf16).
  void set_version(int version) {
    version_ = version;
    for (int u = 0; u < tiers_->units(); ++u) {
      float* master = tiers_->host_state(u, SlotKind::kMaster);
      const std::int64_t n = layout_.units[static_cast<std::size_t>(u)].padded_numel;
      for (std::int64_t i = 0; i < n; ++i)
        master[i] = static_cast<float>(version * 16 + u) + 0.5f * static_cast<float>(i % 3);
      ASSERT_TRUE(tiers_->refresh_params(u).is_ok());
      scheduler_->invalidate(u);
    }
  }

  void use(int unit) {
    auto p = scheduler_->acquire(unit);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    // The store's progress driver moves fetches along at every acquire (progress.h).
    ASSERT_TRUE(scheduler_->poll().is_ok());
    const auto* bits = static_cast<const std::uint16_t*>(*p);
    const std::int64_t n = layout_.units[static_cast<std::size_t>(unit)].padded_numel;
    for (std::int64_t i = 0; i < n; ++i) {
      const float want =
          static_cast<float>(version_ * 16 + unit) + 0.5f * static_cast<float>(i % 3);
      ASSERT_EQ(kernels::bf16_to_float(bits[i]), want) << "unit " << unit << " element " << i;
    }
    scheduler_->release(unit);
  }

  void pass(const std::vector<int>& units) {
    scheduler_->begin_pass(Pass::kTrain);
    for (int u : units)
      use(u);
    scheduler_->end_pass();
  }

  testing::TempDir dir_;
  config::Config config_;
  model::ModelShape shape_;
  model::ModelLayout layout_;
  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<TierManager> tiers_;
  std::unique_ptr<ParamScheduler> scheduler_;
  int version_ = 0;
};

// The runner's order for a tied GPT-2: forward 0..5 with 0 again at the head, backward 4..1.
const std::vector<int> kRunnerOrder = {0, 1, 2, 3, 4, 5, 0, 4, 3, 2, 1};

TEST_F(SchedulerTest, PrefetchesTheRecordedOrder) {
  build(20000);
  pass(kRunnerOrder);
  const SchedulerStats first = scheduler_->stats();
  EXPECT_GT(first.demand_fetches, 0u);
  EXPECT_EQ(first.prefetches, 0u);  // nothing to follow yet
  pass(kRunnerOrder);
  pass(kRunnerOrder);
  const SchedulerStats later = scheduler_->stats();
  EXPECT_GT(later.prefetches, 0u);
  EXPECT_EQ(later.demand_fetches, first.demand_fetches) << "every use after the first pass is "
                                                           "prefetched or still cached";
  EXPECT_EQ(scheduler_->order().divergences(), 0u);
}

TEST_F(SchedulerTest, ADeviatingOrderStillGetsTheRightParameters) {
  build(20000);
  pass(kRunnerOrder);
  pass(kRunnerOrder);
  // Skips, repeats, reverses, uses units out of the plan: correct data every time, no hang.
  pass({0, 3, 1, 1, 5, 2, 4, 0, 0, 2});
  EXPECT_GT(scheduler_->order().divergences(), 0u);
  pass({5, 4, 3, 2, 1, 0});
  pass(kRunnerOrder);
  pass(kRunnerOrder);
  ASSERT_TRUE(scheduler_->drain().is_ok());
}

TEST_F(SchedulerTest, NewParametersInTheHomeReplaceTheDeviceCopies) {
  build(20000);
  pass(kRunnerOrder);
  pass(kRunnerOrder);
  ASSERT_TRUE(scheduler_->drain().is_ok());
  set_version(2);
  pass(kRunnerOrder);
}

TEST_F(SchedulerTest, WithoutAPrefetchBucketEveryFetchIsOnDemand) {
  build(0);
  pass(kRunnerOrder);
  pass(kRunnerOrder);
  EXPECT_EQ(scheduler_->stats().prefetches, 0u);
  EXPECT_GT(scheduler_->stats().demand_fetches, 0u);
}

// A corrupt parameter extent fails the fetch that reads it; the fetch is abandoned (frame and
// staging freed), so draining and teardown end, and the error is not lost: every later call that
// can report returns it.
TEST_F(SchedulerTest, FaultCorruptParameterExtentFailsTheFetchAndDrainEnds) {
  build(20000);
  pass(kRunnerOrder);
  pass(kRunnerOrder);
  ASSERT_TRUE(scheduler_->drain().is_ok());
  set_swap_corruption(SwapCorruption{"param", 1});  // unit 0's first tile, written next
  set_version(2);
  set_swap_corruption(std::nullopt);
  scheduler_->begin_pass(Pass::kTrain);  // prefetches unit 0 and those after it
  auto p = scheduler_->acquire(0);
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), ErrorCode::kCorrupt) << p.status().to_string();
  EXPECT_NE(p.status().to_string().find("checksum mismatch"), std::string::npos)
      << p.status().to_string();
  EXPECT_NE(p.status().to_string().find("strata-param-r0.swp"), std::string::npos)
      << p.status().to_string();
  scheduler_->end_pass();
  Status drained = scheduler_->drain();  // ends: the failed fetch is no longer in flight
  EXPECT_EQ(drained.code(), ErrorCode::kCorrupt) << drained.to_string();
  EXPECT_EQ(scheduler_->first_error().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(scheduler_->poll().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(scheduler_->acquire(1).status().code(), ErrorCode::kCorrupt);
  scheduler_.reset();  // teardown drains too, and ends
}

}  // namespace
}  // namespace strata::offload
