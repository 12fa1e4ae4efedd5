#include "tier/estimate.h"

#include <gtest/gtest.h>

namespace strata::tier {
namespace {

// A small GPT-2 shape: 4 blocks, hidden 64, vocabulary 1000, 128 positions.
EstimateInput small_model() {
  config::ModelConfig m;
  m.vocab_size = 1000;
  m.max_seq_len = 128;
  m.hidden_size = 64;
  m.num_layers = 4;
  m.num_heads = 4;
  EstimateInput in;
  in.shape = model::resolve_shape(m).value();
  in.params = model::total_params(in.shape);
  return in;
}

config::Config bf16_config(int stage, int world_size) {
  config::Config c;
  c.bf16.enabled = true;
  c.zero_optimization.stage = stage;
  c.world_size = world_size;
  c.train_micro_batch_size_per_gpu = 2;
  c.strata.data.seq_len = 32;
  return c;
}

std::uint64_t item_bytes(const Estimate& e, Tier tier, const std::string& prefix) {
  std::uint64_t sum = 0;
  for (const EstimateItem& item : e.items) {
    if (item.tier == tier && item.what.rfind(prefix, 0) == 0) sum += item.bytes;
  }
  return sum;
}

TEST(Estimate, StageZeroKeepsSixteenBytesPerParameterOnTheDevice) {
  EstimateInput in = small_model();
  const std::uint64_t p = in.params;
  Estimate e = estimate(bf16_config(0, 1), in);
  EXPECT_EQ(item_bytes(e, Tier::kDevice, "bf16 parameters"), 2 * p);
  EXPECT_EQ(item_bytes(e, Tier::kDevice, "fp32 master"), 4 * p);
  EXPECT_EQ(item_bytes(e, Tier::kDevice, "Adam exp_avg"), 8 * p);  // exp_avg + exp_avg_sq
  EXPECT_EQ(item_bytes(e, Tier::kDevice, "fp32 accumulated"), 4 * p);
  EXPECT_EQ(e.bytes(Tier::kHost), 0u);
  EXPECT_EQ(e.bytes(Tier::kNvme), 0u);
}

TEST(Estimate, ZeroStagesPartitionStateAcrossRanks) {
  EstimateInput in = small_model();
  const std::uint64_t p = in.params;
  const std::uint64_t shard = (p + 3) / 4;
  Estimate s1 = estimate(bf16_config(1, 4), in);
  EXPECT_EQ(item_bytes(s1, Tier::kDevice, "fp32 master"), 4 * shard);
  EXPECT_EQ(item_bytes(s1, Tier::kDevice, "fp32 accumulated"), 4 * p);
  EXPECT_EQ(item_bytes(s1, Tier::kDevice, "bf16 parameters"), 2 * p);
  Estimate s2 = estimate(bf16_config(2, 4), in);
  EXPECT_EQ(item_bytes(s2, Tier::kDevice, "fp32 accumulated"), 4 * shard);
  EXPECT_EQ(item_bytes(s2, Tier::kDevice, "bf16 parameters"), 2 * p);
  Estimate s3 = estimate(bf16_config(3, 4), in);
  EXPECT_EQ(item_bytes(s3, Tier::kDevice, "bf16 parameters"), 2 * shard);
  EXPECT_GT(item_bytes(s3, Tier::kDevice, "gathered units"), 0u);
}

TEST(Estimate, OffloadMovesStateToItsHomeTier) {
  EstimateInput in = small_model();
  const std::uint64_t p = in.params;
  config::Config c = bf16_config(3, 1);
  c.zero_optimization.offload_optimizer.device = config::OffloadDevice::kCpu;
  c.zero_optimization.offload_param.device = config::OffloadDevice::kNvme;
  Estimate e = estimate(c, in);
  EXPECT_EQ(item_bytes(e, Tier::kHost, "fp32 master"), 4 * p);
  EXPECT_EQ(item_bytes(e, Tier::kHost, "Adam"), 8 * p);
  EXPECT_EQ(item_bytes(e, Tier::kNvme, "bf16 parameters"), 2 * p);
  EXPECT_EQ(item_bytes(e, Tier::kDevice, "fp32 master"), 0u);
  EXPECT_GT(item_bytes(e, Tier::kHost, "parameter staging"), 0u);

  c.zero_optimization.offload_optimizer.device = config::OffloadDevice::kNvme;
  e = estimate(c, in);
  EXPECT_EQ(e.bytes(Tier::kNvme), 2 * p + 16 * p);
  // The optimizer pipeline holds 3 stages of 4 fp32 arrays of one tile (here the whole shard).
  EXPECT_EQ(item_bytes(e, Tier::kHost, "optimizer pipeline"), 3 * 4 * 4 * p);
}

TEST(Estimate, OffloadRatioKeepsTheRestOnTheDevice) {
  EstimateInput in = small_model();
  config::Config c = bf16_config(2, 1);
  c.zero_optimization.offload_optimizer.device = config::OffloadDevice::kCpu;
  c.zero_optimization.offload_optimizer.ratio = 0.25;
  Estimate e = estimate(c, in);
  const std::uint64_t host = item_bytes(e, Tier::kHost, "Adam exp_avg_sq");
  const std::uint64_t device = item_bytes(e, Tier::kDevice, "Adam exp_avg_sq");
  EXPECT_EQ(host + device, 4u * in.params);
  EXPECT_NEAR(static_cast<double>(host) / (host + device), 0.25, 1e-6);
}

TEST(Estimate, Fp32TrainingHasNoSeparateMasterCopy) {
  EstimateInput in = small_model();
  config::Config c = bf16_config(0, 1);
  c.bf16.enabled = false;
  Estimate e = estimate(c, in);
  EXPECT_EQ(item_bytes(e, Tier::kDevice, "fp32 master"), 0u);
  EXPECT_EQ(item_bytes(e, Tier::kDevice, "fp32 parameters"), 4u * in.params);
}

TEST(Estimate, CheckpointingShrinksActivationsAndOffloadMovesThemToTheHost) {
  EstimateInput in = small_model();
  config::Config c = bf16_config(0, 1);
  const std::uint64_t full = estimate(c, in).bytes(Tier::kDevice);
  c.strata.model.activation_checkpointing = true;
  const std::uint64_t checkpointed = estimate(c, in).bytes(Tier::kDevice);
  EXPECT_LT(checkpointed, full);
  c.strata.model.activation_offload = true;
  Estimate offloaded = estimate(c, in);
  EXPECT_LT(offloaded.bytes(Tier::kDevice), checkpointed);
  EXPECT_EQ(item_bytes(offloaded, Tier::kHost, "activation checkpoints"),
            4u * 2 * 32 * 64 * 2);  // blocks x batch x sequence x hidden x bf16
}

TEST(Estimate, AssumedShapeMatchesTheCount) {
  for (std::int64_t p : {125'000'000LL, 1'300'000'000LL, 7'000'000'000LL, 70'000'000'000LL}) {
    model::ModelShape s = assumed_shape(p);
    const double ratio = static_cast<double>(model::total_params(s)) / p;
    EXPECT_NEAR(ratio, 1.0, 0.15) << p;
  }
  EXPECT_EQ(assumed_shape(7'000'000'000).hidden_size, 4096);
}

TEST(Estimate, BudgetsCompareHostAndNvmePerNode) {
  EstimateInput in = small_model();
  in.ranks_per_node = 2;
  config::Config c = bf16_config(2, 2);
  c.zero_optimization.offload_optimizer.device = config::OffloadDevice::kCpu;
  Estimate e = estimate(c, in);
  const std::uint64_t host = e.bytes(Tier::kHost);
  auto verdicts = check_budgets(e, {{Tier::kHost, 2 * host}, {Tier::kDevice, 1}});
  ASSERT_EQ(verdicts.size(), 2u);
  EXPECT_TRUE(verdicts[0].fits);
  EXPECT_EQ(verdicts[0].needed_bytes, 2 * host);
  EXPECT_FALSE(verdicts[1].fits);
  verdicts = check_budgets(e, {{Tier::kHost, 2 * host - 1}});
  EXPECT_FALSE(verdicts[0].fits);
}

}  // namespace
}  // namespace strata::tier
