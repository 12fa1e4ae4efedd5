// Helpers for the checkpoint tests: the offload::OffloadStore one rank of a data-parallel run holds
// (its plan made for rank r of world W, the layout padded for W), built in-process without MPI, and
// filled with values that say which unit, kind and element they are. Errors are values (no gtest
// macros), so the MPI helper program (checkpoint_mpi_helper.cc) uses the same code.
#pragma once

#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "checkpoint/manifest.h"
#include "config/config.h"
#include "io/sim/sim_engine.h"
#include "model/layout.h"
#include "offload/offload_store.h"
#include "offload/plan.h"
#include "optim/adam_optimizer.h"
#include "tests/train/offload_support.h"
#include "train/run_settings.h"

namespace strata::testing {

struct RankState {
  config::Config config;
  model::ModelShape shape;
  model::ModelLayout layout;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<offload::Engine> engine;
  offload::OffloadStore* state = nullptr;  // engine->store()
};

// Rank `rank` of `world` at ZeRO `stage` for the tiny model of offload_support.h. `optimizer`
// "nvme" homes the optimizer state on the seeded I/O twin (streamed through the unit scratch).
inline Result<std::unique_ptr<RankState>> make_rank_state(const std::string& family, int stage,
                                                          int rank, int world,
                                                          const std::string& optimizer = "none",
                                                          const std::string& nvme = "/tmp") {
  auto r = std::make_unique<RankState>();
  Tiers t;
  t.stage = stage;
  t.optimizer = optimizer;
  STRATA_ASSIGN_OR_RETURN(
      config::Loaded loaded,
      config::load_config_text(tiny_config(family, "fp32", t, "/tmp/unused", nvme, 1),
                               "rank state config", {}));
  r->config = loaded.config;
  STRATA_ASSIGN_OR_RETURN(r->shape, model::shape_of(r->config.strata.model));
  r->layout = model::build_layout(r->shape, world);
  backend::CpuBackendOptions bo;
  bo.device_bytes_max = 64 << 20;
  bo.host_bytes_max = 256 << 20;
  bo.threads = 1;
  STRATA_ASSIGN_OR_RETURN(r->backend, backend::make_cpu_backend(bo));
  offload::EngineSpec spec = train::engine_spec(r->config);
  spec.backend = r->backend.get();
  spec.layout = &r->layout;
  spec.rank = rank;
  spec.world = world;
  spec.adam_threads = 1;
  static int states = 0;  // swap folders of live states must differ
  spec.tier_options.swap_tag = "rank" + std::to_string(rank) + "-" + std::to_string(states++);
  spec.tier_options.engine_factory = [](const io::EngineOptions& eo) {
    io::SimOptions so;
    so.capacity_bytes = 64 << 20;
    return io::make_sim_engine(eo, so);
  };
  STRATA_ASSIGN_OR_RETURN(r->engine, offload::Engine::create(spec));
  r->state = &r->engine->store();
  return r;
}

// Counters as a trainer has them after `step` steps of which `skipped` were skipped (the manifest
// checks these invariants: checkpoint_manifest.h).
inline checkpoint::TrainerCounters counters_after(std::int64_t step, std::int64_t skipped = 0) {
  checkpoint::TrainerCounters c;
  c.step = step;
  c.skipped_steps = skipped;
  c.adam_step = step - skipped;
  c.scheduler_iteration = c.adam_step - 1;
  c.scaler.iteration = step;
  return c;
}

inline constexpr offload::SlotKind kOptimizerKinds[3] = {
    offload::SlotKind::kMaster, offload::SlotKind::kExpAvg, offload::SlotKind::kExpAvgSq};

// The value of element `i` of unit `u`'s `kind` (exact in fp32; 0 in the padding). `salt`
// distinguishes one test state from another.
inline float known_value(const model::UnitLayout& unit, offload::SlotKind kind, std::int64_t i,
                         int salt = 0) {
  if (i >= unit.numel) return 0.0f;
  const int k = static_cast<int>(kind);
  return static_cast<float>((((unit.index * 4 + k) * 4 + salt) << 14) + i) * 0.5f;
}

// Fills this rank's shard of every unit's master and moments with known_value.
inline Status fill_known(RankState& r, int salt = 0) {
  const offload::TierPlan& plan = r.state->tiers().plan();
  for (int u = 0; u < r.state->units(); ++u) {
    const offload::UnitPlan& up = plan.units[static_cast<std::size_t>(u)];
    const model::UnitLayout& unit = r.layout.units[static_cast<std::size_t>(u)];
    for (offload::SlotKind kind : kOptimizerKinds) {
      float* buffer = r.state->fill_buffer(kind, u);
      for (std::int64_t j = 0; j < up.shard_numel; ++j)
        buffer[j] = known_value(unit, kind, up.shard_begin + j, salt);
      STRATA_TRY(r.state->store(kind, u, buffer));
    }
  }
  return Status::ok();
}

// Elements of this rank's shards that differ from known_value (0 when all equal).
inline Result<std::int64_t> count_unknown(RankState& r, int salt = 0) {
  const offload::TierPlan& plan = r.state->tiers().plan();
  std::int64_t wrong = 0;
  for (int u = 0; u < r.state->units(); ++u) {
    const offload::UnitPlan& up = plan.units[static_cast<std::size_t>(u)];
    const model::UnitLayout& unit = r.layout.units[static_cast<std::size_t>(u)];
    for (offload::SlotKind kind : kOptimizerKinds) {
      STRATA_ASSIGN_OR_RETURN(const float* view, r.state->view(kind, u));
      for (std::int64_t j = 0; j < up.shard_numel; ++j)
        wrong += view[j] != known_value(unit, kind, up.shard_begin + j, salt) ? 1 : 0;
    }
  }
  return wrong;
}

}  // namespace strata::testing
