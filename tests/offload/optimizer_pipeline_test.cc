// The optimizer pipeline on its own, over flat units and the I/O fault twin (no model, no
// trainer): every tile gets exactly Adam's arithmetic whatever the homes; an offered frame is
// filled whole or refused; at full depth a stalled drive holds the reads; an I/O error stops the
// step, names the tile and stays reported; and the preload done before the norm is known leaves
// the gradient to the step; and a unit's stochastic rounding follows its rounding id, not its
// position, so a process holding some of the units gets the bits of one holding them all.
#include "offload/optimizer_pipeline.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <regex>
#include <thread>

#include "offload/unit_state.h"
#include "offload_fixture.h"

namespace strata::offload {
namespace {

using testing::FlatTiers;

// Three units: two of three tiles (the last one short) and one of one tile.
const std::vector<std::int64_t> kUnits = {5000, 2048, 6000};
constexpr SlotKind kOptimKinds[4] = {SlotKind::kMaster, SlotKind::kExpAvg, SlotKind::kExpAvgSq,
                                     SlotKind::kGrad};

PipelineStep step_of(double multiplier = 0.5) {
  PipelineStep s;
  s.lr = 1e-2;
  s.grad_multiplier = multiplier;
  s.step = 3;
  return s;
}

void fill_all(FlatTiers& f, int version = 0) {
  for (int u = 0; u < f.tiers->units(); ++u) {
    for (SlotKind k : kOptimKinds)
      ASSERT_TRUE(testing::fill(*f.tiers, u, k, version).is_ok());
  }
}

// What the pipeline must produce for unit u: Adam on each tile of the known values.
struct Expected {
  std::vector<float> master, exp_avg, exp_avg_sq;
  std::vector<std::uint8_t> params;
};

Expected reference(const TierPlan& plan, CpuAdam& adam, int unit, const PipelineStep& step,
                   int version = 0) {
  const UnitPlan& up = plan.units[static_cast<std::size_t>(unit)];
  const auto n = static_cast<std::size_t>(up.shard_numel);
  Expected e;
  e.master.resize(n);
  e.exp_avg.resize(n);
  e.exp_avg_sq.resize(n);
  std::vector<float> grad(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto j = static_cast<std::int64_t>(i);
    e.master[i] = testing::known_value(unit, SlotKind::kMaster, j, version);
    e.exp_avg[i] = testing::known_value(unit, SlotKind::kExpAvg, j, version);
    e.exp_avg_sq[i] = testing::known_value(unit, SlotKind::kExpAvgSq, j, version);
    grad[i] = testing::known_value(unit, SlotKind::kGrad, j, version);
  }
  e.params.resize(n * plan.storage_bytes);
  for (std::int64_t t = 0; t < up.tiles; ++t) {
    const std::int64_t b = plan.tile_begin(unit, t);
    kernels::AdamTile a;
    a.master = e.master.data() + b;
    a.exp_avg = e.exp_avg.data() + b;
    a.exp_avg_sq = e.exp_avg_sq.data() + b;
    a.grad = grad.data() + b;
    a.n = static_cast<std::size_t>(plan.tile_numel(unit, t));
    a.copy_out = plan.storage == kernels::DType::kF32
                     ? nullptr
                     : e.params.data() + static_cast<std::size_t>(b) * plan.storage_bytes;
    a.copy_dtype = plan.storage;
    adam.update(optim::adam_params(adam.settings(), step.lr, step.step),
                optim::adam_fusion(step.grad_multiplier), a);
  }
  if (plan.storage == kernels::DType::kF32) std::memcpy(e.params.data(), e.master.data(), n * 4);
  return e;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

void expect_updated(FlatTiers& f, CpuAdam& adam, const PipelineStep& step,
                    const std::string& what) {
  for (int u = 0; u < f.tiers->units(); ++u) {
    const Expected e = reference(f.plan(), adam, u, step);
    auto master = testing::read(*f.tiers, u, SlotKind::kMaster);
    auto m = testing::read(*f.tiers, u, SlotKind::kExpAvg);
    auto v = testing::read(*f.tiers, u, SlotKind::kExpAvgSq);
    auto params = testing::read_params(*f.tiers, u);
    ASSERT_TRUE(master.is_ok() && m.is_ok() && v.is_ok() && params.is_ok()) << what;
    EXPECT_TRUE(same_bits(*master, e.master)) << what << " unit " << u << " master";
    EXPECT_TRUE(same_bits(*m, e.exp_avg)) << what << " unit " << u << " exp_avg";
    EXPECT_TRUE(same_bits(*v, e.exp_avg_sq)) << what << " unit " << u << " exp_avg_sq";
    EXPECT_EQ(*params, e.params) << what << " unit " << u << " parameters";
  }
}

// Flat units with known values in their homes, Adam, and a pipeline over them (destroyed in
// reverse: the pipeline first).
struct Fixture {
  FlatTiers f;
  std::unique_ptr<CpuAdam> adam;
  std::unique_ptr<OptimizerPipeline> pipeline;

  void make(kernels::DType storage, Tier param, Tier optim) {
    ASSERT_TRUE(
        f.build(kUnits, testing::flat_settings(storage, param, optim, f.dir.path())).is_ok());
    fill_all(f);
    adam = testing::adamw();
    auto made = OptimizerPipeline::create(*f.tiers, *adam);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    pipeline = std::move(*made);
  }
  void expect_updated(const PipelineStep& step, const std::string& what) {
    ::strata::offload::expect_updated(f, *adam, step, what);
  }
};

TEST(OptimizerPipeline, EveryHomeGetsAdamsArithmeticTileByTile) {
  const struct {
    const char* name;
    kernels::DType storage;
    Tier param, optim;
  } cases[] = {
      {"host state, device params, fp32", kernels::DType::kF32, Tier::kDevice, Tier::kHost},
      {"host state, host params, bf16", kernels::DType::kBF16, Tier::kHost, Tier::kHost},
      {"nvme state, device params, bf16", kernels::DType::kBF16, Tier::kDevice, Tier::kNvme},
      {"nvme state, nvme params, fp16", kernels::DType::kF16, Tier::kNvme, Tier::kNvme},
  };
  for (const auto& c : cases) {
    Fixture x;
    ASSERT_NO_FATAL_FAILURE(x.make(c.storage, c.param, c.optim)) << c.name;
    ASSERT_TRUE(x.pipeline->start(step_of()).is_ok()) << c.name;
    ASSERT_TRUE(x.pipeline->finish().is_ok()) << c.name;
    for (int u = 0; u < x.f.tiers->units(); ++u) {
      EXPECT_TRUE(x.pipeline->params_ready(u));
      EXPECT_TRUE(x.pipeline->unit_done(u));
    }
    x.expect_updated(step_of(), c.name);
  }
}

TEST(OptimizerPipeline, AnOfferedFrameGetsTheNewParametersWholeOrIsRefused) {
  Fixture x;
  ASSERT_NO_FATAL_FAILURE(x.make(kernels::DType::kBF16, Tier::kNvme, Tier::kNvme));
  FlatTiers& f = x.f;
  OptimizerPipeline* pipeline = x.pipeline.get();
  const int last = f.tiers->units() - 1;
  const std::int64_t n = f.plan().units[static_cast<std::size_t>(last)].shard_numel;
  std::vector<std::uint16_t> frame(static_cast<std::size_t>(n), 0);
  EXPECT_FALSE(pipeline->offer_frame(last, frame.data())) << "no step in flight";

  // The drive holds every read, so the worker cannot have begun the last unit: the offer is taken.
  f.sim->set_paused(true);
  ASSERT_TRUE(pipeline->start(step_of()).is_ok());
  EXPECT_FALSE(pipeline->params_ready(last));
  EXPECT_TRUE(pipeline->offer_frame(last, frame.data()));
  EXPECT_FALSE(pipeline->handed_off(last));
  f.sim->set_paused(false);
  ASSERT_TRUE(pipeline->wait_for_params(0).is_ok());
  EXPECT_FALSE(pipeline->offer_frame(0, frame.data())) << "unit 0 has begun: too late";
  ASSERT_TRUE(pipeline->wait_for_params(last).is_ok());
  EXPECT_TRUE(pipeline->handed_off(last));
  EXPECT_FALSE(pipeline->handed_off(0));
  ASSERT_TRUE(pipeline->finish().is_ok());
  const Expected e = reference(f.plan(), *x.adam, last, step_of());
  ASSERT_EQ(e.params.size(), frame.size() * 2);
  EXPECT_EQ(std::memcmp(frame.data(), e.params.data(), e.params.size()), 0);
  x.expect_updated(step_of(), "after the hand-off");
}

TEST(OptimizerPipeline, AtFullDepthAStalledDriveHoldsTheReads) {
  Fixture x;
  ASSERT_NO_FATAL_FAILURE(x.make(kernels::DType::kBF16, Tier::kDevice, Tier::kNvme));
  FlatTiers& f = x.f;
  OptimizerPipeline* pipeline = x.pipeline.get();
  ASSERT_GT(f.plan().units[0].tiles + f.plan().units[1].tiles + f.plan().units[2].tiles, 3);
  f.sim->set_paused(true);
  const IoCounters before = f.tiers->io_counters();
  ASSERT_TRUE(pipeline->start(step_of()).is_ok());
  // The worker fills its three stages (three tiles of four reads each), then can go no further.
  auto reads = [&] { return f.tiers->io_counters().reads - before.reads; };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (reads() < 3u * 4u && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(reads(), 3u * 4u);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(reads(), 3u * 4u);
  EXPECT_EQ(f.tiers->io_counters().writes - before.writes, 0u);
  EXPECT_FALSE(pipeline->params_ready(0));
  f.sim->set_paused(false);
  ASSERT_TRUE(pipeline->finish().is_ok());
  x.expect_updated(step_of(), "after the stall");
}

TEST(OptimizerPipeline, AnIoErrorMidTileStopsTheStepNamesTheTileAndStaysReported) {
  Fixture x;
  ASSERT_NO_FATAL_FAILURE(x.make(kernels::DType::kBF16, Tier::kNvme, Tier::kNvme));
  FlatTiers& f = x.f;
  OptimizerPipeline* pipeline = x.pipeline.get();
  // Reads succeed and Adam runs, then the tile's writes fail: the error comes in the middle of a
  // tile, with its other writes (and the next tiles' reads) in flight. Every write fails, and the
  // later tiles' writes may be in flight beside the first's: the step reports the first failure it
  // sees, usually tile 0's, but where the stream jitter delays the completions, another of the 3
  // tiles' (each named with its extent).
  io::SimFaults faults;
  faults.enospc_rate = 1.0;
  f.sim->set_faults(faults);
  ASSERT_TRUE(pipeline->start(step_of()).is_ok());
  Status s = pipeline->finish();
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), ErrorCode::kNoSpace) << s.to_string();
  EXPECT_TRUE(
      std::regex_search(s.to_string(), std::regex("optimizer step, group\\.0 tile [0-2]: extent ")))
      << s.to_string();
  EXPECT_NE(s.to_string().find("strata-"), std::string::npos) << "names the swap file";
  EXPECT_TRUE(pipeline->failed());
  EXPECT_FALSE(pipeline->active());
  // The state on NVMe is now partly updated: every later step and wait reports the same error.
  f.sim->set_faults({});
  Status again = pipeline->start(step_of());
  EXPECT_EQ(again.code(), ErrorCode::kNoSpace);
  EXPECT_EQ(again.message(), s.message());
  EXPECT_EQ(pipeline->wait_for_params(2).code(), ErrorCode::kNoSpace);
}

TEST(OptimizerPipeline, ThePreloadLeavesTheGradientToTheStepAndTheLateNorm) {
  Fixture x;
  ASSERT_NO_FATAL_FAILURE(x.make(kernels::DType::kBF16, Tier::kDevice, Tier::kNvme));
  FlatTiers& f = x.f;
  OptimizerPipeline* pipeline = x.pipeline.get();
  // During the last backward: masters and moments are final, the gradients are not (they hold
  // what an earlier micro-batch left, version 1).
  for (int u = 0; u < f.tiers->units(); ++u)
    ASSERT_TRUE(testing::fill(*f.tiers, u, SlotKind::kGrad, /*version=*/1).is_ok());
  const IoCounters before = f.tiers->io_counters();
  ASSERT_TRUE(pipeline->preload().is_ok());
  const IoCounters preloaded = f.tiers->io_counters();
  EXPECT_EQ(preloaded.reads - before.reads, 3u * 3u) << "master and moments of 3 tiles";
  EXPECT_EQ(preloaded.read_bytes[static_cast<int>(SlotKind::kGrad)],
            before.read_bytes[static_cast<int>(SlotKind::kGrad)]);
  // Then the final gradients arrive, and with them the norm (the step's multiplier).
  for (int u = 0; u < f.tiers->units(); ++u)
    ASSERT_TRUE(testing::fill(*f.tiers, u, SlotKind::kGrad, /*version=*/0).is_ok());
  ASSERT_TRUE(pipeline->start(step_of(0.25)).is_ok());
  ASSERT_TRUE(pipeline->finish().is_ok());
  x.expect_updated(step_of(0.25), "preloaded");
}

TEST(OptimizerPipeline, ASkippedStepDropsThePreload) {
  Fixture x;
  ASSERT_NO_FATAL_FAILURE(x.make(kernels::DType::kBF16, Tier::kDevice, Tier::kNvme));
  OptimizerPipeline* pipeline = x.pipeline.get();
  ASSERT_TRUE(pipeline->preload().is_ok());
  ASSERT_TRUE(pipeline->cancel_preload().is_ok());
  ASSERT_TRUE(pipeline->start(step_of()).is_ok());
  ASSERT_TRUE(pipeline->finish().is_ok());
  x.expect_updated(step_of(), "after a dropped preload");
}

TEST(OptimizerPipeline, AStepSplitIntoPartsInAnyOrderGivesTheWholeStepsBits) {
  const struct {
    const char* name;
    kernels::DType storage;
    Tier param, optim;
  } cases[] = {
      {"host state, host params, bf16", kernels::DType::kBF16, Tier::kHost, Tier::kHost},
      {"nvme state, host params, fp32", kernels::DType::kF32, Tier::kHost, Tier::kNvme},
      {"nvme state, device params, bf16", kernels::DType::kBF16, Tier::kDevice, Tier::kNvme},
  };
  for (const auto& c : cases) {
    Fixture x;
    ASSERT_NO_FATAL_FAILURE(x.make(c.storage, c.param, c.optim)) << c.name;
    OptimizerPipeline* pipeline = x.pipeline.get();
    // A preload of the whole step's first tiles is discarded by a partial start.
    ASSERT_TRUE(pipeline->preload().is_ok()) << c.name;
    // The units as a backward hands them over: the last one first, then the other two.
    ASSERT_TRUE(pipeline->start(step_of(), {2}).is_ok()) << c.name;
    EXPECT_TRUE(pipeline->params_ready(0)) << "a unit left out counts as ready";
    EXPECT_TRUE(pipeline->unit_done(1));
    ASSERT_TRUE(pipeline->wait_for_params(2).is_ok()) << c.name;
    ASSERT_TRUE(pipeline->finish().is_ok()) << c.name;
    ASSERT_TRUE(pipeline->start(step_of(), {1, 0}).is_ok()) << c.name;
    ASSERT_TRUE(pipeline->finish().is_ok()) << c.name;
    x.expect_updated(step_of(), c.name);
    // A whole step (with a preload) runs every unit again afterwards.
    ASSERT_TRUE(pipeline->preload().is_ok());
    ASSERT_TRUE(pipeline->start(step_of()).is_ok());
    ASSERT_TRUE(pipeline->finish().is_ok());
  }
}

TEST(OptimizerPipeline, APartialStepRefusesUnknownAndRepeatedUnits) {
  Fixture x;
  ASSERT_NO_FATAL_FAILURE(x.make(kernels::DType::kBF16, Tier::kHost, Tier::kHost));
  Status bad = x.pipeline->start(step_of(), {3});
  EXPECT_EQ(bad.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.to_string().find("unit 3 is not a unit; valid: 0 to 2"), std::string::npos)
      << bad.to_string();
  bad = x.pipeline->start(step_of(), {1, 1});
  EXPECT_NE(bad.to_string().find("unit 1 is listed twice"), std::string::npos) << bad.to_string();
  EXPECT_FALSE(x.pipeline->active());
  ASSERT_TRUE(x.pipeline->start(step_of(), {}).is_ok()) << "an empty part is a no-op";
  ASSERT_TRUE(x.pipeline->finish().is_ok());
}

// Compressed state (8-bit moments, bf16 master and gradients, stochastically rounded) for the
// units `numels`, whose ids among all units are `ids`: the unit with id g starts from
// known_value(g, ...) and gets gradient known_value(g, kGrad, i, step) at each of 3 steps. Returns
// each unit's stored master, moments and parameters, as raw bytes.
std::vector<std::vector<std::uint8_t>> three_compressed_steps(
    const std::vector<std::int64_t>& numels, const std::vector<int>& ids, bool pass_ids) {
  FlatTiers f;
  PlanSettings settings =
      testing::flat_settings(kernels::DType::kBF16, Tier::kHost, Tier::kHost, f.dir.path());
  settings.state.master = kernels::DType::kBF16;
  settings.state.moments = kernels::MomentFormat::kQ8;
  settings.state.grad = kernels::DType::kBF16;
  settings.rounding_seed = 0x5eed1234abcdULL;
  EXPECT_TRUE(f.build(numels, settings, pass_ids ? ids : std::vector<int>{}).is_ok());
  auto write = [&](int u, SlotKind kind, int version) {
    const std::int64_t n = f.plan().units[static_cast<std::size_t>(u)].shard_numel;
    std::vector<float> values(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      values[static_cast<std::size_t>(i)] =
          testing::known_value(ids[static_cast<std::size_t>(u)], kind, i, version);
    }
    EXPECT_TRUE(write_unit_state(*f.tiers, kind, u, values.data()).is_ok());
  };
  for (int u = 0; u < f.tiers->units(); ++u) {
    for (SlotKind k : {SlotKind::kMaster, SlotKind::kExpAvg, SlotKind::kExpAvgSq})
      write(u, k, 0);
  }
  std::unique_ptr<CpuAdam> adam = testing::adamw();
  auto pipeline = OptimizerPipeline::create(*f.tiers, *adam);
  EXPECT_TRUE(pipeline.is_ok()) << pipeline.status().to_string();
  for (int t = 1; t <= 3; ++t) {
    for (int u = 0; u < f.tiers->units(); ++u)
      write(u, SlotKind::kGrad, t);
    PipelineStep s = step_of();
    s.step = t;
    EXPECT_TRUE((*pipeline)->start(s).is_ok());
    EXPECT_TRUE((*pipeline)->finish().is_ok());
  }
  std::vector<std::vector<std::uint8_t>> out;
  for (int u = 0; u < f.tiers->units(); ++u) {
    EXPECT_EQ(f.plan().units[static_cast<std::size_t>(u)].rounding_id,
              pass_ids ? ids[static_cast<std::size_t>(u)] : u);
    std::vector<std::uint8_t> bytes;
    for (SlotKind k : {SlotKind::kMaster, SlotKind::kExpAvg, SlotKind::kExpAvgSq}) {
      const auto* home = static_cast<const std::uint8_t*>(f.tiers->host_slot(u, k));
      bytes.insert(bytes.end(), home, home + f.plan().shard_bytes(k, u));
    }
    auto params = testing::read_params(*f.tiers, u);
    EXPECT_TRUE(params.is_ok());
    if (params.is_ok()) bytes.insert(bytes.end(), params->begin(), params->end());
    out.push_back(std::move(bytes));
  }
  return out;
}

TEST(OptimizerPipeline, AUnitHeldAloneWithItsRoundingIdGetsTheBitsOfAllUnitsTogether) {
  // Units A, B, C (B of three tiles), and B alone as a rank of a sharded optimizer holds it.
  const std::vector<std::int64_t> all = {3000, 5000, 2500};
  const auto together = three_compressed_steps(all, {0, 1, 2}, /*pass_ids=*/false);
  const auto alone = three_compressed_steps({all[1]}, {1}, /*pass_ids=*/true);
  ASSERT_EQ(together.size(), 3u);
  ASSERT_EQ(alone.size(), 1u);
  ASSERT_FALSE(together[1].empty());
  EXPECT_EQ(alone[0], together[1]) << "B keyed by its id 1 rounds as among A, B and C";
  // Keyed by its position instead (id 0, the default), B rounds differently: the id matters.
  const auto as_first = three_compressed_steps({all[1]}, {1}, /*pass_ids=*/false);
  ASSERT_EQ(as_first.size(), 1u);
  EXPECT_NE(as_first[0], together[1]);
}

}  // namespace
}  // namespace strata::offload
