// Helpers for the checkpoint tests: the TrainState one rank of a data-parallel run holds (its
// plan made for rank r of world W, the layout padded for W), built in-process without MPI, and
// filled with values that say which unit, kind and element they are.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend/cpu_backend.h"
#include "config/config.h"
#include "io/sim/sim_engine.h"
#include "model/layout.h"
#include "optim/adam_optimizer.h"
#include "tests/train/offload_support.h"
#include "tier/plan.h"
#include "train/train_state.h"

namespace strata::testing {

struct RankState {
  config::Config config;
  model::ModelShape shape;
  model::ModelLayout layout;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<optim::AdamOptimizer> adam;
  std::unique_ptr<train::TrainState> state;
};

// Rank `rank` of `world` at ZeRO `stage` for the tiny model of offload_support.h. `optimizer`
// "nvme" homes the optimizer state on the seeded I/O twin (streamed through the unit scratch).
inline std::unique_ptr<RankState> make_rank_state(const std::string& family, int stage, int rank,
                                                  int world, const std::string& optimizer = "none",
                                                  const std::string& nvme = "/tmp") {
  auto r = std::make_unique<RankState>();
  Tiers t;
  t.stage = stage;
  t.optimizer = optimizer;
  r->config = load(tiny_config(family, "fp32", t, "/tmp/unused", nvme, 1));
  auto shape = model::shape_of(r->config.strata.model);
  EXPECT_TRUE(shape.is_ok()) << shape.status().to_string();
  if (!shape.is_ok()) return nullptr;
  r->shape = *shape;
  r->layout = model::build_layout(r->shape, world);
  backend::CpuBackendOptions bo;
  bo.device_bytes_max = 64 << 20;
  bo.host_bytes_max = 256 << 20;
  bo.threads = 1;
  r->backend = backend::make_cpu_backend(bo).value();
  r->adam = optim::AdamOptimizer::create(r->config.optimizer, 1).value();
  tier::PlanInput in;
  in.config = &r->config;
  in.layout = &r->layout;
  in.rank = rank;
  in.world = world;
  in.device_budget_bytes = 64 << 20;
  auto plan = tier::make_plan(in);
  EXPECT_TRUE(plan.is_ok()) << plan.status().to_string();
  if (!plan.is_ok()) return nullptr;
  tier::TierOptions options;
  static int states = 0;  // swap folders of live states must differ
  options.swap_tag = "rank" + std::to_string(rank) + "-" + std::to_string(states++);
  options.engine_factory = [](const io::EngineOptions& eo) {
    io::SimOptions so;
    so.capacity_bytes = 64 << 20;
    return io::make_sim_engine(eo, so);
  };
  auto state = train::TrainState::create(*r->backend, r->config, r->layout, std::move(*plan),
                                         *r->adam, options);
  EXPECT_TRUE(state.is_ok()) << state.status().to_string();
  if (!state.is_ok()) return nullptr;
  r->state = std::move(*state);
  return r;
}

inline constexpr tier::SlotKind kOptimizerKinds[3] = {
    tier::SlotKind::kMaster, tier::SlotKind::kExpAvg, tier::SlotKind::kExpAvgSq};

// The value of element `i` of unit `u`'s `kind` (exact in fp32; 0 in the padding). `salt`
// distinguishes one test state from another.
inline float known_value(const model::UnitLayout& unit, tier::SlotKind kind, std::int64_t i,
                         int salt = 0) {
  if (i >= unit.numel) return 0.0f;
  const int k = static_cast<int>(kind);
  return static_cast<float>((((unit.index * 4 + k) * 4 + salt) << 14) + i) * 0.5f;
}

// Fills this rank's shard of every unit's master and moments with known_value.
inline void fill_known(RankState& r, int salt = 0) {
  const tier::TierPlan& plan = r.state->tiers().plan();
  for (int u = 0; u < r.state->units(); ++u) {
    const tier::UnitPlan& up = plan.units[static_cast<std::size_t>(u)];
    const model::UnitLayout& unit = r.layout.units[static_cast<std::size_t>(u)];
    for (tier::SlotKind kind : kOptimizerKinds) {
      float* buffer = r.state->fill_buffer(kind, u);
      for (std::int64_t j = 0; j < up.shard_numel; ++j)
        buffer[j] = known_value(unit, kind, up.shard_begin + j, salt);
      ASSERT_TRUE(r.state->store(kind, u, buffer).is_ok());
    }
  }
}

// Elements of this rank's shards that differ from known_value (0 when all equal).
inline std::int64_t count_unknown(RankState& r, int salt = 0) {
  const tier::TierPlan& plan = r.state->tiers().plan();
  std::int64_t wrong = 0;
  for (int u = 0; u < r.state->units(); ++u) {
    const tier::UnitPlan& up = plan.units[static_cast<std::size_t>(u)];
    const model::UnitLayout& unit = r.layout.units[static_cast<std::size_t>(u)];
    for (tier::SlotKind kind : kOptimizerKinds) {
      auto view = r.state->view(kind, u);
      EXPECT_TRUE(view.is_ok()) << view.status().to_string();
      if (!view.is_ok()) return -1;
      for (std::int64_t j = 0; j < up.shard_numel; ++j)
        wrong += (*view)[j] != known_value(unit, kind, up.shard_begin + j, salt) ? 1 : 0;
    }
  }
  return wrong;
}

}  // namespace strata::testing
