// DeepSpeed's dynamic loss scaling, gradient clipping and the three learning-rate schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"

namespace strata::optim {
namespace {

config::Config fp16_config(std::int64_t power, std::int64_t window, std::int64_t hysteresis) {
  config::Config c;
  c.fp16.enabled = true;
  c.fp16.initial_scale_power = power;
  c.fp16.loss_scale_window = window;
  c.fp16.hysteresis = hysteresis;
  c.fp16.min_loss_scale = 1.0;
  return c;
}

TEST(LossScaler, HysteresisThenHalvingThenGrowthAfterTheWindow) {
  LossScaler scaler(fp16_config(4, 3, 2));
  ASSERT_TRUE(scaler.dynamic());
  EXPECT_EQ(scaler.scale(), 16.0);
  // O O C C C C C C C O: the first overflow uses up hysteresis, the second halves; growth comes
  // on the third clean iteration after the stable interval starts counting.
  const std::vector<bool> overflow = {true,  true,  false, false, false,
                                      false, false, false, false, true};
  const std::vector<double> expected = {16, 8, 8, 8, 8, 16, 16, 16, 32, 32};
  for (std::size_t i = 0; i < overflow.size(); ++i) {
    ASSERT_TRUE(scaler.update(overflow[i]).is_ok());
    EXPECT_EQ(scaler.scale(), expected[i]) << "after iteration " << i;
  }
  EXPECT_EQ(scaler.state().hysteresis, 1);
  EXPECT_EQ(scaler.state().last_overflow_iteration, 9);
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  config::Config c = fp16_config(3, 100, 2);
  c.fp16.consecutive_hysteresis = true;
  LossScaler scaler(c);
  ASSERT_TRUE(scaler.update(true).is_ok());   // hysteresis 2 -> 1
  ASSERT_TRUE(scaler.update(false).is_ok());  // refilled to 2
  ASSERT_TRUE(scaler.update(true).is_ok());   // 2 -> 1 again, scale kept
  EXPECT_EQ(scaler.scale(), 8.0);
}

TEST(LossScaler, OverflowAtTheMinimumIsAnError) {
  config::Config c = fp16_config(1, 1000, 1);
  LossScaler scaler(c);
  ASSERT_TRUE(scaler.update(true).is_ok());
  EXPECT_EQ(scaler.scale(), 1.0);
  Status s = scaler.update(true);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("minimum"), std::string::npos);
}

TEST(LossScaler, StaticAndBf16ScalesNeverMove) {
  config::Config c;
  c.fp16.enabled = true;
  c.fp16.loss_scale = 128.0;
  LossScaler fixed(c);
  EXPECT_FALSE(fixed.dynamic());
  ASSERT_TRUE(fixed.update(true).is_ok());
  EXPECT_EQ(fixed.scale(), 128.0);
  config::Config b;
  b.bf16.enabled = true;
  LossScaler bf16(b);
  EXPECT_EQ(bf16.scale(), 1.0);
  EXPECT_FALSE(bf16.dynamic());
}

TEST(GradientMultiplier, UnscalesAndClipsLikeDeepSpeed) {
  EXPECT_DOUBLE_EQ(gradient_multiplier(100.0, 64.0, 0.0), 1.0 / 64.0);
  // norm 100/64 < clip 2: no clipping.
  EXPECT_DOUBLE_EQ(gradient_multiplier(100.0, 64.0, 2.0), 1.0 / 64.0);
  // norm 640/64 = 10 > clip 2: gradients end with norm ~2.
  const double m = gradient_multiplier(640.0, 64.0, 2.0);
  EXPECT_DOUBLE_EQ(m, 1.0 / (((10.0 + 1e-6) / 2.0) * 64.0));
  EXPECT_NEAR(640.0 * m, 2.0, 1e-6);
}

config::Config scheduled(config::SchedulerType type, config::WarmupType warmup) {
  config::Config c;
  c.optimizer.params.lr = 0.5;
  c.scheduler.type = type;
  c.scheduler.params.warmup_min_lr = 0.1;
  c.scheduler.params.warmup_max_lr = 0.9;
  c.scheduler.params.warmup_num_steps = 10;
  c.scheduler.params.warmup_type = warmup;
  c.scheduler.params.total_num_steps = 50;
  c.scheduler.params.warmup_min_ratio = 0.2;
  c.scheduler.params.cos_min_ratio = 0.05;
  return c;
}

TEST(LrSchedule, WarmupLrLinearAndLog) {
  LrSchedule linear(scheduled(config::SchedulerType::kWarmupLR, config::WarmupType::kLinear));
  EXPECT_DOUBLE_EQ(linear.lr(), 0.1);  // the first step runs at iteration -1
  EXPECT_DOUBLE_EQ(linear.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(linear.lr_at(5), 0.1 + 0.8 * 0.5);
  EXPECT_DOUBLE_EQ(linear.lr_at(10), 0.9);
  EXPECT_DOUBLE_EQ(linear.lr_at(1000), 0.9);
  LrSchedule log(scheduled(config::SchedulerType::kWarmupLR, config::WarmupType::kLog));
  EXPECT_DOUBLE_EQ(log.lr_at(4), 0.1 + 0.8 * std::log(5.0) / std::log(10.0));
  EXPECT_DOUBLE_EQ(log.lr_at(9), 0.9);
  log.step();
  log.step();
  EXPECT_EQ(log.last_batch_iteration(), 1);
  EXPECT_DOUBLE_EQ(log.lr(), log.lr_at(1));
}

TEST(LrSchedule, WarmupDecayLrFallsLinearlyToTheMinimum) {
  LrSchedule s(scheduled(config::SchedulerType::kWarmupDecayLR, config::WarmupType::kLinear));
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.1 + 0.8 * 40.0 / 40.0);
  EXPECT_DOUBLE_EQ(s.lr_at(30), 0.1 + 0.8 * 20.0 / 40.0);
  EXPECT_DOUBLE_EQ(s.lr_at(50), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(70), 0.1);
}

TEST(LrSchedule, WarmupCosineLrScalesTheOptimizerLr) {
  LrSchedule s(scheduled(config::SchedulerType::kWarmupCosineLR, config::WarmupType::kLinear));
  EXPECT_DOUBLE_EQ(s.lr(), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.5 * 0.2);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.5 * (0.2 + 0.5 * 0.8));
  // Halfway through the decay: i - W + 1 = 20 of N - W = 40.
  EXPECT_NEAR(s.lr_at(29), 0.5 * (0.05 + 0.95 * 0.5), 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(49), 0.5 * 0.05);
  EXPECT_DOUBLE_EQ(s.lr_at(500), 0.5 * 0.05);  // clamped, never oscillates back up
}

TEST(LrSchedule, NoSchedulerIsTheOptimizerLr) {
  config::Config c;
  c.optimizer.params.lr = 3e-4;
  LrSchedule s(c);
  EXPECT_DOUBLE_EQ(s.lr(), 3e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(12345), 3e-4);
}

}  // namespace
}  // namespace strata::optim
