// The tier plan: homes follow the offload settings, tiles are whole pages, frames follow the
// stage3 limits and the device budget, and a budget below the working set is refused. The
// settings come from a config through train::plan_settings, as in a run.
#include "offload/plan.h"

#include <gtest/gtest.h>

#include "model/model_spec.h"
#include "train/run_settings.h"

namespace strata::offload {
namespace {

struct Fixture {
  model::ModelShape shape;
  model::ModelLayout layout;
  config::Config config;
  Fixture() {
    config::ModelConfig m;
    m.vocab_size = 1000;
    m.max_seq_len = 64;
    m.hidden_size = 64;
    m.num_layers = 6;
    m.num_heads = 4;
    shape = model::resolve_shape(m).value();
    layout = model::build_layout(shape);
    config.bf16.enabled = true;
    config.zero_optimization.stage = 3;
    config.zero_optimization.stage3_param_persistence_threshold = 0;
    config.train_micro_batch_size_per_gpu = 1;
    config.strata.data.seq_len = 16;
  }
  PlanInput input(std::uint64_t device_budget = 0, bool device_is_host = false) const {
    PlanInput in;
    in.settings = train::plan_settings(config);
    in.layout = &layout;
    in.activation_device_bytes = 1 << 20;
    in.device_budget_bytes = device_budget;
    in.device_is_host = device_is_host;
    return in;
  }
  TierPlan plan(std::uint64_t device_budget = 0, bool device_is_host = false) const {
    return make_plan_unchecked(input(device_budget, device_is_host));
  }
};

TEST(TierPlan, HomesFollowTheOffloadDevices) {
  Fixture f;
  using config::OffloadDevice;
  f.config.zero_optimization.offload_param.max_in_cpu = 0;
  const struct {
    OffloadDevice param, optimizer;
    Tier param_home, optim_home;
  } cases[] = {
      {OffloadDevice::kNone, OffloadDevice::kNone, Tier::kDevice, Tier::kDevice},
      {OffloadDevice::kCpu, OffloadDevice::kCpu, Tier::kHost, Tier::kHost},
      {OffloadDevice::kNvme, OffloadDevice::kCpu, Tier::kNvme, Tier::kHost},
      {OffloadDevice::kNone, OffloadDevice::kNvme, Tier::kDevice, Tier::kNvme},
  };
  for (const auto& c : cases) {
    f.config.zero_optimization.offload_param.device = c.param;
    f.config.zero_optimization.offload_optimizer.device = c.optimizer;
    const TierPlan p = f.plan();
    for (std::size_t u = 0; u < p.units.size(); ++u) {
      EXPECT_EQ(p.units[u].param_home, c.param_home) << u;
      EXPECT_EQ(p.units[u].optim_home, c.optim_home) << u;
      EXPECT_EQ(p.units[u].framed, c.param_home != Tier::kDevice) << u;
    }
    EXPECT_EQ(p.bytes(Tier::kNvme) > 0, c.param_home == Tier::kNvme || c.optim_home == Tier::kNvme);
  }
}

std::uint64_t item_bytes(const TierPlan& p, Tier tier, const std::string& what) {
  std::uint64_t bytes = 0;
  for (const PlanItem& item : p.items) {
    if (item.tier == tier && item.what.find(what) != std::string::npos) bytes += item.bytes;
  }
  return bytes;
}

TEST(TierPlan, OptimizerNoneOnAGpuKeepsTheStateOnTheDeviceBesideTheParameters) {
  Fixture f;  // offload_optimizer none, ZeRO 3 on one rank, bf16
  const TierPlan p = f.plan();
  std::uint64_t shard = 0;
  for (const UnitPlan& u : p.units) {
    EXPECT_EQ(u.optim_home, Tier::kDevice);
    shard += static_cast<std::uint64_t>(u.shard_numel);
  }
  // 16 bytes per element of the shard: master, two moments and the gradient, all fp32.
  EXPECT_EQ(item_bytes(p, Tier::kDevice, "(device home)") -
                item_bytes(p, Tier::kDevice, "bf16 parameters"),
            16 * shard);
  EXPECT_EQ(item_bytes(p, Tier::kHost, "master"), 0u);
  EXPECT_TRUE(p.unit_scratch);        // checkpoints and loads go through it
  EXPECT_FALSE(p.pipeline_copy_out);  // device Adam writes the parameters itself
  EXPECT_EQ(p.grad_write_buffers, 0);
  EXPECT_TRUE(p.notes.empty());
  // The gradients never leave the device (rounded and added in place): their frames are fp32
  // alone, without the bf16 copy a leaving gradient needs, which the host optimizer's frames have.
  std::uint64_t frames = 0, with_copy = 0;
  f.config.strata.device_optimizer = config::DeviceOptimizer::kOff;
  const TierPlan host = f.plan();
  for (std::size_t k = 0; k < p.classes.size(); ++k) {
    EXPECT_FALSE(p.classes[k].grad_copy) << k;
    EXPECT_TRUE(host.classes[k].grad_copy) << k;
    frames += static_cast<std::uint64_t>(p.classes[k].grad_frames * p.classes[k].numel) * 4;
    with_copy +=
        static_cast<std::uint64_t>(host.classes[k].grad_frames * host.classes[k].numel) * 6;
  }
  EXPECT_EQ(item_bytes(p, Tier::kDevice, "gradient frames (fp32)"), frames);
  EXPECT_EQ(item_bytes(host, Tier::kDevice, "gradient frames (fp32, and the bf16 copy"), with_copy);
}

TEST(TierPlan, OptimizerNoneStaysOnTheHostWhereTheDeviceOptimizerIsNotWanted) {
  Fixture f;
  // The CPU backend (auto), strata.device_optimizer off, offloaded parameters: CPU Adam.
  EXPECT_EQ(f.plan(0, true).units[0].optim_home, Tier::kHost);
  f.config.strata.device_optimizer = config::DeviceOptimizer::kOff;
  EXPECT_EQ(f.plan().units[0].optim_home, Tier::kHost);
  f.config.strata.device_optimizer = config::DeviceOptimizer::kOn;
  EXPECT_EQ(f.plan(0, true).units[0].optim_home, Tier::kDevice);  // on: the CPU's arena too
  f.config.zero_optimization.offload_param.device = config::OffloadDevice::kCpu;
  const TierPlan offloaded = f.plan();
  EXPECT_EQ(offloaded.units[0].optim_home, Tier::kHost);
  ASSERT_EQ(offloaded.notes.size(), 1u);
  EXPECT_NE(offloaded.notes[0].find("offload_param"), std::string::npos);
}

TEST(TierPlan, OptimizerNoneThatDoesNotFitGoesToTheHostWithANoteOrIsAnErrorWhenOn) {
  Fixture f;
  const TierPlan on_device = f.plan();
  f.config.strata.device_optimizer = config::DeviceOptimizer::kOff;
  const TierPlan on_host = f.plan();
  // Room for the working set but not for the optimizer state beside it.
  const std::uint64_t budget = (on_host.device_minimum_bytes + on_device.device_minimum_bytes) / 2;
  f.config.strata.device_optimizer = config::DeviceOptimizer::kAuto;
  const TierPlan fallback = f.plan(budget);
  EXPECT_EQ(fallback.units[0].optim_home, Tier::kHost);
  ASSERT_EQ(fallback.notes.size(), 1u);
  EXPECT_NE(fallback.notes[0].find("does not fit"), std::string::npos) << fallback.notes[0];
  EXPECT_EQ(describe_plan(fallback, {}).back(), fallback.notes[0]);
  EXPECT_TRUE(make_plan(f.input(budget)).is_ok());
  f.config.strata.device_optimizer = config::DeviceOptimizer::kOn;
  Result<TierPlan> refused = make_plan(f.input(budget));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(refused.status().to_string().find("strata.device_bytes_max"), std::string::npos);
  EXPECT_NE(refused.status().to_string().find("offload_optimizer"), std::string::npos);
}

TEST(TierPlan, MaxInCpuKeepsTheFirstUnitsParametersOnTheHost) {
  Fixture f;
  f.config.zero_optimization.offload_param.device = config::OffloadDevice::kNvme;
  const std::int64_t first_two = f.layout.units[0].padded_numel + f.layout.units[1].padded_numel;
  f.config.zero_optimization.offload_param.max_in_cpu = static_cast<std::uint64_t>(first_two);
  const TierPlan p = f.plan();
  EXPECT_EQ(p.units[0].param_home, Tier::kHost);
  EXPECT_EQ(p.units[1].param_home, Tier::kHost);
  for (std::size_t u = 2; u < p.units.size(); ++u)
    EXPECT_EQ(p.units[u].param_home, Tier::kNvme) << u;
  // Staging for NVMe reads holds the largest NVMe-homed unit.
  EXPECT_EQ(p.param_staging_buffers, 5);
  EXPECT_GE(p.param_staging_elements, f.layout.units[2].padded_numel);
}

TEST(TierPlan, TilesAreWholePagesInEveryDtypeAndCoverEachShard) {
  Fixture f;
  f.config.zero_optimization.sub_group_size = 5000;  // rounded up to 6144 = 3 x 2048
  const TierPlan p = f.plan();
  EXPECT_EQ(p.tile_elements, 6144);
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    std::int64_t covered = 0;
    for (std::int64_t t = 0; t < p.units[u].tiles; ++t) {
      EXPECT_EQ(p.tile_begin(static_cast<int>(u), t), covered);
      const std::int64_t n = p.tile_numel(static_cast<int>(u), t);
      EXPECT_EQ(n * 2 % 4096, 0) << "bf16 tile of " << n;
      covered += n;
    }
    EXPECT_EQ(covered, p.units[u].shard_numel);
  }
}

TEST(TierPlan, SmallUnitsBelowThePersistenceThresholdGetFramesOfTheirOwn) {
  Fixture f;
  f.config.zero_optimization.offload_param.device = config::OffloadDevice::kCpu;
  f.config.zero_optimization.stage3_param_persistence_threshold = 10000;  // only the head
  const TierPlan p = f.plan();
  const std::size_t head = p.units.size() - 1;
  EXPECT_TRUE(p.units[head].persistent);
  EXPECT_FALSE(p.units[1].persistent);
  const SizeClass& head_class = p.classes[static_cast<std::size_t>(p.units[head].size_class)];
  EXPECT_EQ(head_class.param_frames, 0);  // its own frame is not a shared one
}

// Each block's norm weights and biases (GPT-2's: two LayerNorms, four biases) get a place in one
// device area apart from the compute copies, 16-byte aligned, in unit order, and the plan lists
// its bytes; the embedding (widened whole) and the tied head (a LayerNorm only, no matrices) get
// none; fp32 parameters (nothing to widen) and a device that is the host get no area at all.
TEST(TierPlan, NormWeightsAndBiasesGetAnAreaApartFromTheComputeCopies) {
  Fixture f;
  const TierPlan p = f.plan();
  std::int64_t at = 0;
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    const UnitRanges r = unit_ranges(f.layout.units[u]);
    if (f.layout.units[u].kind != model::UnitKind::kBlock) {
      EXPECT_EQ(p.units[u].apart_offset, -1) << u;
      continue;
    }
    EXPECT_EQ(p.units[u].apart_offset, at) << u;
    // ln_1 weight and bias, the qkv bias; the projection's bias, ln_2; fc's bias; its projection's.
    std::int64_t others = 0;
    for (const std::int64_t n : r.n)
      others += n;
    EXPECT_EQ(others, 4 * 64 + 3 * 64 + 64 + 4 * 64 + 64) << u;
    ASSERT_EQ(r.at.size(), r.n.size());
    for (std::size_t i = 0; i < r.at.size(); ++i)
      EXPECT_EQ(r.at[i] % 4, 0) << u;
    EXPECT_EQ(r.weights_n.size(), 4u) << u;
    at += r.apart_numel;
  }
  EXPECT_EQ(p.apart_numel, at);
  EXPECT_GT(at, 0);
  std::uint64_t listed = 0;
  for (const PlanItem& item : p.items) {
    if (item.what.find("kept apart") != std::string::npos) listed += item.bytes;
  }
  EXPECT_EQ(listed, static_cast<std::uint64_t>(at) * 4);
  EXPECT_EQ(f.plan(0, true).apart_numel, 0);  // the CPU backend reads copies widened whole
  f.config.bf16.enabled = false;
  const TierPlan fp32 = f.plan();
  EXPECT_EQ(fp32.apart_numel, 0);
  for (const UnitPlan& u : fp32.units)
    EXPECT_EQ(u.apart_offset, -1);
}

TEST(TierPlan, PrefetchFramesFollowTheBucketTheLiveCapAndTheBudget) {
  Fixture f;
  f.config.zero_optimization.offload_param.device = config::OffloadDevice::kCpu;
  const TierPlan base = f.plan();
  const SizeClass& blocks = base.classes[static_cast<std::size_t>(base.units[1].size_class)];
  ASSERT_EQ(blocks.units.size(), 6u);
  // Default bucket (5e7 elements) wants every block on the device.
  EXPECT_EQ(blocks.param_frames, 6);
  // A bucket of one block: the one in use plus one ahead.
  f.config.zero_optimization.stage3_prefetch_bucket_size = static_cast<std::uint64_t>(blocks.numel);
  EXPECT_EQ(f.plan().classes[static_cast<std::size_t>(base.units[1].size_class)].param_frames, 2);
  // The live cap holds it to the base frame.
  f.config.zero_optimization.stage3_prefetch_bucket_size = 50'000'000;
  f.config.zero_optimization.stage3_max_live_parameters = 1;
  EXPECT_EQ(f.plan().classes[static_cast<std::size_t>(base.units[1].size_class)].param_frames, 1);
  // A device budget between the minimum and the full plan: fewer frames, within the budget.
  f.config.zero_optimization.stage3_max_live_parameters = 1'000'000'000;
  const TierPlan full = f.plan();
  const std::uint64_t budget = (full.device_minimum_bytes + full.bytes(Tier::kDevice)) / 2;
  const TierPlan limited = f.plan(budget);
  EXPECT_LE(limited.bytes(Tier::kDevice), budget);
  EXPECT_LT(limited.bytes(Tier::kDevice), full.bytes(Tier::kDevice));
  EXPECT_GE(limited.bytes(Tier::kDevice), full.device_minimum_bytes);
}

TEST(TierPlan, ADeviceBudgetBelowTheWorkingSetIsRefusedNamingTheMinimum) {
  Fixture f;
  f.config.zero_optimization.offload_param.device = config::OffloadDevice::kCpu;
  PlanInput in;
  in.settings = train::plan_settings(f.config);
  in.layout = &f.layout;
  in.activation_device_bytes = 1 << 20;
  const std::uint64_t minimum = make_plan_unchecked(in).device_minimum_bytes;
  in.device_budget_bytes = minimum - 1;
  auto refused = make_plan(in);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(refused.status().context(), "strata.device_bytes_max");
  EXPECT_NE(refused.status().message().find(std::to_string(minimum)), std::string::npos);
  in.device_budget_bytes = minimum;
  EXPECT_TRUE(make_plan(in).is_ok());
}

}  // namespace
}  // namespace strata::offload
