// The offload engine, built one way. Engine::create is the only place where the engine for a set
// of units is put together — for a model (the trainer, and the benchmarks through it) and for
// caller-owned parameters (the Python optimizer) — so what is decided once is decided here:
//   - the device budget: the one the caller was given (strata.device_bytes_max), else the
//     backend's own arena (the CPU backend's default, or the GPU's free memory);
//   - Adam's threads: EngineSpec::adam_threads (strata.optimizer_threads), else the backend's host
//     threads, one fewer when the optimizer state is on NVMe (the kernel's completion of its
//     writes needs a core, docs/tiers.md);
//   - every slot's tier: the plan (plan.h), model or optimizer-only, made once and never edited.
// Then it builds, in this order (destroyed in reverse): the Adam driver, the tier manager (which
// allocates exactly what the plan lists), the optimizer pipeline, the sharding module and, for a
// model, the store with its gradient path, prefetch scheduler and progress driver.
//
//   kind       what is built                        used through
//   kModel     all of the above                     store() (the runner's UnitStore), sharding()
//   kOptimizer tiers, Adam, pipeline, sharding      tiers() (homes, swap), pipeline() (the step)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/comm.h"
#include "model/layout.h"
#include "offload/cpu_adam.h"
#include "offload/offload_store.h"
#include "offload/optimizer_pipeline.h"
#include "offload/plan.h"
#include "offload/sharding.h"
#include "offload/tier_manager.h"

namespace strata::offload {

enum class EngineKind : std::uint8_t {
  kModel,          // a model's units, trained through the model runner
  kOptimizerOnly,  // caller-owned parameters: the optimizer's state and step only
};

struct EngineSpec {
  EngineKind kind = EngineKind::kModel;
  backend::Backend* backend = nullptr;
  const model::ModelLayout* layout = nullptr;  // the units (copied; the caller may drop it)
  PlanSettings settings;                       // train::plan_settings(config), or the caller's
  int rank = 0;                                // this rank of `world` data-parallel ranks
  int world = 1;
  // Each unit's id in the stochastic-rounding keys (PlanInput::rounding_ids); empty: its index.
  std::vector<int> rounding_ids;
  comm::Comm* comm = nullptr;  // the ranks (needed to train when world > 1)
  // What the model runner allocates (kModel), counted in the plan.
  std::uint64_t activation_device_bytes = 0;
  std::uint64_t activation_host_bytes = 0;
  // The device budget the caller was given; 0: the backend's arena (the resolved "auto").
  std::uint64_t device_budget_bytes = 0;
  optim::AdamSettings adam;
  int adam_threads = 0;      // 0: the rule in the header comment
  TierOptions tier_options;  // the I/O engine factory, trace, swap folder tag
};

class Engine {
 public:
  // Resolves and builds (see the header comment). Errors: the plan's (kOutOfMemory naming
  // strata.device_bytes_max), the tier manager's (budgets, swap folders), Adam's.
  static Result<std::unique_ptr<Engine>> create(const EngineSpec& spec);
  ~Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  EngineKind kind() const { return kind_; }
  const TierPlan& plan() const { return tiers_->plan(); }
  TierManager& tiers() { return *tiers_; }
  OptimizerPipeline& pipeline() { return *pipeline_; }
  Sharding& sharding() { return *sharding_; }
  CpuAdam& adam() { return *adam_; }
  // The device budget the plan was made for (resolved).
  std::uint64_t device_budget_bytes() const { return device_budget_bytes_; }
  // The model's store (kModel only).
  OffloadStore& store();
  // Where AdamW runs, for the start-up log: "AdamW (avx512, 8 threads)" (CPU Adam), "AdamW on the
  // device (cuda:0)", or both when the plan splits the units.
  std::string optimizer_description();

 private:
  Engine() = default;

  EngineKind kind_ = EngineKind::kModel;
  backend::Backend* backend_ = nullptr;
  std::uint64_t device_budget_bytes_ = 0;
  // In order of construction; destroyed in reverse: the store (scheduler, gradient path) before
  // the pipeline it uses as its update gate, the pipeline before the memory and files it works
  // on, Adam last.
  std::unique_ptr<CpuAdam> adam_;
  std::unique_ptr<TierManager> tiers_;
  std::unique_ptr<OptimizerPipeline> pipeline_;
  std::unique_ptr<Sharding> sharding_;
  std::unique_ptr<OffloadStore> store_;
};

// Adam's threads for a plan (the rule of the header comment).
int adam_threads(int requested, const TierPlan& plan, const backend::Backend& backend);

}  // namespace strata::offload
