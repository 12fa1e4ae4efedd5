// The offload engine without a model: a plan for a few flat units (parameter groups, as a binding
// would have them), a tier manager on the CPU backend and the I/O fault twin, and values that say
// which unit, kind and element they are. The optimizer pipeline and gradient path tests build on
// it; nothing here knows the config or the model runner.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/units.h"
#include "io/sim/sim_engine.h"
#include "model/layout.h"
#include "offload/cpu_adam.h"
#include "offload/plan.h"
#include "offload/tier_manager.h"
#include "support/run_strata.h"

namespace strata::offload::testing {

// Units of `numels` elements each (padded to 2048), one tensor each, untied.
inline model::ModelLayout flat_layout(const std::vector<std::int64_t>& numels) {
  model::ModelLayout layout;
  for (std::size_t i = 0; i < numels.size(); ++i) {
    model::UnitLayout u;
    u.kind = model::UnitKind::kBlock;
    u.index = static_cast<int>(i);
    u.layer = static_cast<int>(i);
    u.name = "group." + std::to_string(i);
    u.numel = numels[i];
    u.padded_numel = static_cast<std::int64_t>(
        align_up(static_cast<std::uint64_t>(numels[i]), model::kUnitPadElements));
    u.tensors.push_back({"weight", {numels[i]}, 0, numels[i]});
    layout.units.push_back(u);
  }
  return layout;
}

// Plan settings for the flat units: tiles of 2048 elements, the given homes, swap files in `dir`.
inline PlanSettings flat_settings(kernels::DType storage, Tier param_tier, Tier optim_tier,
                                  const std::string& dir, int depth = 3) {
  PlanSettings s;
  s.storage = storage;
  s.param_tier = param_tier;
  s.param_staging_buffers = 2;
  s.optim_tier = optim_tier;
  s.tile_elements = 2048;
  s.pipeline_depth = depth;
  s.swap.param_dirs = {dir};
  s.swap.optim_dirs = {dir};
  s.swap.checksum = true;
  s.swap.engine.block_size_bytes = 4096;
  return s;
}

// A CPU backend, the fault twin and a tier manager for a plan of `layout` under `settings`.
struct FlatTiers {
  ::strata::testing::TempDir dir;
  model::ModelLayout layout;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<TierManager> tiers;
  io::SimControl* sim = nullptr;  // the twin's controls (faults, pause)

  // `rounding_ids`: the units' ids in their stochastic-rounding keys (empty: their indices).
  Status build(const std::vector<std::int64_t>& numels, PlanSettings settings,
               std::vector<int> rounding_ids = {}) {
    layout = flat_layout(numels);
    backend::CpuBackendOptions bo;
    bo.device_bytes_max = 16 << 20;
    bo.host_bytes_max = 64 << 20;
    bo.threads = 1;
    STRATA_ASSIGN_OR_RETURN(backend, backend::make_cpu_backend(bo));
    PlanInput in;
    in.settings = std::move(settings);
    in.layout = &layout;
    in.rounding_ids = std::move(rounding_ids);
    STRATA_ASSIGN_OR_RETURN(TierPlan plan, make_plan(in));
    TierOptions options;
    options.engine_factory =
        [this](const io::EngineOptions& eo) -> Result<std::unique_ptr<io::IoEngine>> {
      io::SimOptions so;
      so.seed = 5;
      so.capacity_bytes = 64 << 20;
      STRATA_ASSIGN_OR_RETURN(std::unique_ptr<io::IoEngine> engine, io::make_sim_engine(eo, so));
      sim = io::sim_control(engine.get());
      return engine;
    };
    STRATA_ASSIGN_OR_RETURN(tiers, TierManager::create(*backend, layout, std::move(plan), options));
    return Status::ok();
  }
  const TierPlan& plan() const { return tiers->plan(); }
};

// The value of element `i` of unit `u`'s `kind` at `version`: small, exact in bf16, and different
// for every unit, kind and version.
inline float known_value(int unit, SlotKind kind, std::int64_t i, int version = 0) {
  const int k = static_cast<int>(kind);
  const float base = kind == SlotKind::kExpAvgSq ? 0.25f : 0.0f;  // exp_avg_sq stays positive
  return base + static_cast<float>(((unit * 8 + k) * 4 + version) % 29) * 0.0625f +
         static_cast<float>(i % 13) * 0.015625f * (kind == SlotKind::kExpAvgSq ? 1.0f : -1.0f);
}

// Fills unit u's fp32 shard of `kind` (any home) with known_value.
inline Status fill(TierManager& tiers, int unit, SlotKind kind, int version = 0) {
  const std::int64_t n = tiers.plan().units[static_cast<std::size_t>(unit)].shard_numel;
  std::vector<float> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    values[static_cast<std::size_t>(i)] = known_value(unit, kind, i, version);
  if (home_of(tiers.plan(), unit, kind) == Tier::kHost) {
    std::memcpy(tiers.host_state(unit, kind), values.data(), values.size() * 4);
    return Status::ok();
  }
  std::memcpy(tiers.unit_scratch(), values.data(), values.size() * 4);
  return tiers.write_slot(kind, unit, tiers.unit_scratch());
}

// Unit u's fp32 shard of `kind` (any home), copied out.
inline Result<std::vector<float>> read(TierManager& tiers, int unit, SlotKind kind) {
  const std::int64_t n = tiers.plan().units[static_cast<std::size_t>(unit)].shard_numel;
  std::vector<float> out(static_cast<std::size_t>(n));
  if (home_of(tiers.plan(), unit, kind) == Tier::kHost) {
    std::memcpy(out.data(), tiers.host_state(unit, kind), out.size() * 4);
    return out;
  }
  STRATA_TRY(tiers.read_slot(kind, unit, tiers.unit_scratch()));
  std::memcpy(out.data(), tiers.unit_scratch(), out.size() * 4);
  return out;
}

// Unit u's parameters in the storage type (any home), as raw bytes.
inline Result<std::vector<std::uint8_t>> read_params(TierManager& tiers, int unit) {
  const TierPlan& p = tiers.plan();
  const UnitPlan& up = p.units[static_cast<std::size_t>(unit)];
  const std::uint64_t bytes = static_cast<std::uint64_t>(up.param_numel) * p.storage_bytes;
  std::vector<std::uint8_t> out(bytes);
  if (up.param_home == Tier::kHost) {
    std::memcpy(out.data(), tiers.host_param(unit), bytes);
  } else if (up.param_home == Tier::kDevice) {
    STRATA_TRY(tiers.backend().copy_async(backend::StreamKind::kDeviceToHost, out.data(),
                                          tiers.device_param(unit), bytes));
    STRATA_TRY(tiers.backend().synchronize(backend::StreamKind::kDeviceToHost));
  } else {
    auto* scratch = reinterpret_cast<std::uint8_t*>(tiers.unit_scratch());
    for (std::int64_t t = 0; t < up.tiles; ++t) {
      const std::uint64_t at = static_cast<std::uint64_t>(p.tile_begin(unit, t)) * p.storage_bytes;
      STRATA_ASSIGN_OR_RETURN(
          io::SwapHandle h,
          tiers.read_tile(SlotKind::kParam, unit, t, scratch + at, io::Priority::kDemand));
      STRATA_TRY(tiers.wait(SlotKind::kParam, h));
    }
    std::memcpy(out.data(), scratch, bytes);
  }
  return out;
}

// AdamW with weight decay 0.1 (the lr comes with each step).
inline optim::AdamSettings adamw_settings() {
  optim::AdamSettings s;
  s.adamw = true;
  s.weight_decay = 0.1;
  return s;
}

inline std::unique_ptr<CpuAdam> adamw() {
  auto adam = CpuAdam::create(adamw_settings(), 1);
  EXPECT_TRUE(adam.is_ok()) << adam.status().to_string();
  return adam.is_ok() ? std::move(*adam) : nullptr;
}

}  // namespace strata::offload::testing
