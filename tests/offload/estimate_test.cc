#include "offload/estimate.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "model/layout.h"
#include "train/run_settings.h"

namespace strata::offload {
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
  c.zero_optimization.stage3_param_persistence_threshold = 0;  // every unit is small here
  return c;
}

std::uint64_t item_bytes(const Estimate& e, Tier tier, const std::string& prefix) {
  std::uint64_t sum = 0;
  for (const EstimateItem& item : e.items) {
    if (item.tier == tier && item.what.rfind(prefix, 0) == 0) sum += item.bytes;
  }
  return sum;
}

// Units are padded to 2048 elements (shards x 2048 from ZeRO stage 1 on several ranks); the
// estimate counts what is allocated.
std::uint64_t padded(const EstimateInput& in, int shards = 1) {
  return static_cast<std::uint64_t>(model::build_layout(in.shape, shards).padded_numel());
}
std::uint64_t units(const EstimateInput& in) {
  return model::build_layout(in.shape).units.size();
}
// Sum over units of one rank's shard of `world` equal shards.
std::uint64_t sharded(const EstimateInput& in, int world) {
  return padded(in, world) / static_cast<std::uint64_t>(world);
}

TEST(Estimate, WithoutOffloadParametersStayOnTheDeviceAndAdamStateOnTheHost) {
  // Strata's optimizer runs on the CPU: without offload the fp32 master, moments and gradient
  // accumulator live in host memory (each array 4 KiB-staggered), the parameters on the device.
  EstimateInput in = small_model();
  const std::uint64_t p = padded(in), n = units(in);
  Estimate e = train::estimate(bf16_config(0, 1), in);
  EXPECT_EQ(item_bytes(e, Tier::kDevice, "bf16 parameters (device home)"), 2 * p);
  EXPECT_EQ(item_bytes(e, Tier::kHost, "fp32 master"), 4 * p + 4096 * n);
  EXPECT_EQ(item_bytes(e, Tier::kHost, "Adam exp_avg"), 8 * p + 2 * 4096 * n);
  EXPECT_EQ(item_bytes(e, Tier::kHost, "fp32 accumulated"), 4 * p + 4096 * n);
  EXPECT_EQ(item_bytes(e, Tier::kDevice, "fp32 master"), 0u);
  EXPECT_EQ(e.bytes(Tier::kNvme), 0u);
  EXPECT_GT(item_bytes(e, Tier::kDevice, "gradient frames"), 0u);
  EXPECT_GT(item_bytes(e, Tier::kDevice, "activations"), 0u);
}

TEST(Estimate, ZeroStagesPartitionStateAcrossRanks) {
  EstimateInput in = small_model();
  const std::uint64_t p = padded(in, 4), n = units(in);
  const std::uint64_t shard = sharded(in, 4);
  Estimate s1 = train::estimate(bf16_config(1, 4), in);
  EXPECT_EQ(item_bytes(s1, Tier::kHost, "fp32 master"), 4 * shard + 4096 * n);
  // Gradients leave the device reduce-scattered from stage 1 on (docs/multi-gpu.md), so the
  // accumulator holds only the shard at stage 1 too.
  EXPECT_EQ(item_bytes(s1, Tier::kHost, "fp32 accumulated"), 4 * shard + 4096 * n);
  EXPECT_EQ(item_bytes(s1, Tier::kDevice, "bf16 parameters"), 2 * p);
  Estimate s2 = train::estimate(bf16_config(2, 4), in);
  EXPECT_EQ(item_bytes(s2, Tier::kHost, "fp32 accumulated"), 4 * shard + 4096 * n);
  EXPECT_EQ(item_bytes(s2, Tier::kDevice, "bf16 parameters"), 2 * p);
  Estimate s3 = train::estimate(bf16_config(3, 4), in);
  EXPECT_EQ(item_bytes(s3, Tier::kDevice, "bf16 parameters"), 2 * shard);
  // Each rank holds its shard; whole units are gathered into frames.
  EXPECT_GT(item_bytes(s3, Tier::kDevice, "parameter frames"), 0u);
}

TEST(Estimate, OffloadMovesStateToItsHomeTier) {
  EstimateInput in = small_model();
  const std::uint64_t p = padded(in), n = units(in);
  config::Config c = bf16_config(3, 1);
  c.zero_optimization.offload_optimizer.device = config::OffloadDevice::kCpu;
  c.zero_optimization.offload_param.device = config::OffloadDevice::kNvme;
  c.zero_optimization.offload_param.max_in_cpu = 0;
  Estimate e = train::estimate(c, in);
  EXPECT_EQ(item_bytes(e, Tier::kHost, "fp32 master"), 4 * p + 4096 * n);
  EXPECT_EQ(item_bytes(e, Tier::kNvme, "bf16 parameters"), 2 * p);
  EXPECT_EQ(item_bytes(e, Tier::kDevice, "bf16 parameters"), 0u);
  EXPECT_GT(item_bytes(e, Tier::kHost, "parameter staging"), 0u);
  EXPECT_GT(item_bytes(e, Tier::kDevice, "parameter frames"), 0u);

  // With the default max_in_cpu (1e9 elements) DeepSpeed keeps parameters in host memory.
  c.zero_optimization.offload_param.max_in_cpu = 1'000'000'000;
  e = train::estimate(c, in);
  EXPECT_EQ(item_bytes(e, Tier::kHost, "bf16 parameters (host home)"), 2 * p);
  EXPECT_EQ(item_bytes(e, Tier::kNvme, "bf16 parameters"), 0u);

  c.zero_optimization.offload_param.max_in_cpu = 0;
  c.zero_optimization.offload_optimizer.device = config::OffloadDevice::kNvme;
  c.zero_optimization.sub_group_size = 1 << 20;  // more than any unit: one tile per unit
  e = train::estimate(c, in);
  // Data, plus one 4 KiB checksum block per tile and slot (five slots per unit).
  EXPECT_EQ(e.bytes(Tier::kNvme), 2 * p + 16 * p + 5 * 4096 * n);
  // strata.optimizer_pipeline_depth stages (default 5) x (4 fp32 arrays + a bf16 copy-out) of
  // the largest tile (here the largest unit), each followed by a 4 KiB stagger, on a 2 MiB
  // boundary.
  std::uint64_t largest = 0;
  for (const model::UnitLayout& u : model::build_layout(in.shape).units)
    largest = std::max<std::uint64_t>(largest, u.padded_numel);
  EXPECT_EQ(item_bytes(e, Tier::kHost, "optimizer pipeline"),
            5 * (4 * (4 * largest + 4096) + (2 * largest + 4096)) + (2u << 20) - 4096);
  c.strata.optimizer_pipeline_depth = 3;
  e = train::estimate(c, in);
  EXPECT_EQ(item_bytes(e, Tier::kHost, "optimizer pipeline"),
            3 * (4 * (4 * largest + 4096) + (2 * largest + 4096)) + (2u << 20) - 4096);
}

TEST(Estimate, OffloadRatioKeepsTheFirstUnitsOnTheHost) {
  EstimateInput in = small_model();
  config::Config c = bf16_config(2, 1);
  c.zero_optimization.offload_optimizer.device = config::OffloadDevice::kNvme;
  c.zero_optimization.offload_optimizer.ratio = 0.5;
  Estimate e = train::estimate(c, in);
  const std::uint64_t nvme = item_bytes(e, Tier::kNvme, "Adam exp_avg_sq");
  const std::uint64_t host = item_bytes(e, Tier::kHost, "Adam exp_avg_sq");
  EXPECT_GT(nvme, 0u);
  EXPECT_GT(host, 0u);
  // Whole units move: the split is at a unit boundary near the ratio.
  const double p = static_cast<double>(padded(in)) * 4;
  EXPECT_NEAR(static_cast<double>(nvme) / p, 0.5, 0.35);
}

TEST(Estimate, Fp32TrainingKeepsAMasterCopyBesideTheParameters) {
  EstimateInput in = small_model();
  config::Config c = bf16_config(0, 1);
  c.bf16.enabled = false;
  Estimate e = train::estimate(c, in);
  EXPECT_EQ(item_bytes(e, Tier::kDevice, "fp32 parameters (device home)"), 4u * padded(in));
  EXPECT_GT(item_bytes(e, Tier::kHost, "fp32 master"), 0u);
  EXPECT_EQ(item_bytes(e, Tier::kDevice, "fp32 compute copies"), 0u);  // nothing to widen
}

TEST(Estimate, CheckpointingShrinksActivationsAndOffloadMovesThemToTheHost) {
  EstimateInput in = small_model();
  config::Config c = bf16_config(0, 1);
  const std::uint64_t full = train::estimate(c, in).bytes(Tier::kDevice);
  c.strata.model.activation_checkpointing = true;
  const std::uint64_t checkpointed = train::estimate(c, in).bytes(Tier::kDevice);
  EXPECT_LT(checkpointed, full);
  c.strata.model.activation_offload = true;
  Estimate offloaded = train::estimate(c, in);
  EXPECT_LT(offloaded.bytes(Tier::kDevice), checkpointed);
  // blocks x batch x sequence x hidden x fp32, in whole pages
  EXPECT_EQ(item_bytes(offloaded, Tier::kHost, "activation checkpoints"),
            (4u * 2 * 32 * 64 * 4 + 4095) / 4096 * 4096);
}

TEST(Estimate, MorePrefetchFramesWhenTheDeviceBudgetAllows) {
  EstimateInput in = small_model();
  config::Config c = bf16_config(3, 1);
  c.zero_optimization.offload_param.device = config::OffloadDevice::kCpu;
  const std::uint64_t unlimited =
      item_bytes(train::estimate(c, in), Tier::kDevice, "parameter frames");
  in.device_budget_bytes = train::estimate(c, in).bytes(Tier::kDevice) - unlimited / 2;
  const std::uint64_t limited =
      item_bytes(train::estimate(c, in), Tier::kDevice, "parameter frames");
  EXPECT_LT(limited, unlimited);
  EXPECT_LE(train::estimate(c, in).bytes(Tier::kDevice), in.device_budget_bytes);
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
  Estimate e = train::estimate(c, in);
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
}  // namespace strata::offload
