// The offload engine's one builder (see engine.h).
#include "offload/engine.h"

#include <fmt/format.h>

namespace strata::offload {

int adam_threads(int requested, const TierPlan& plan, const backend::Backend& backend) {
  if (requested > 0) return requested;
  int threads = backend.compute_threads();
  if (plan.uses(SlotKind::kMaster, Tier::kNvme) && threads > 1) --threads;
  return threads;
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineSpec& spec) {
  STRATA_ASSERT(spec.backend != nullptr && spec.layout != nullptr);
  const bool model = spec.kind == EngineKind::kModel;
  std::unique_ptr<Engine> e(new Engine());
  e->kind_ = spec.kind;
  e->backend_ = spec.backend;
  // The budget the user set, else the backend's arena: the one resolution of "auto".
  e->device_budget_bytes_ = spec.device_budget_bytes > 0 ? spec.device_budget_bytes
                                                         : spec.backend->device_memory().bytes_max;
  PlanInput in;
  in.settings = spec.settings;
  in.layout = spec.layout;
  in.rank = spec.rank;
  in.world = spec.world;
  in.optimizer_only = !model;
  in.rounding_ids = spec.rounding_ids;
  in.activation_device_bytes = model ? spec.activation_device_bytes : 0;
  in.activation_host_bytes = model ? spec.activation_host_bytes : 0;
  in.device_budget_bytes = e->device_budget_bytes_;
  in.device_is_host = spec.backend->device_memory_is_host();
  STRATA_ASSIGN_OR_RETURN(TierPlan plan, make_plan(in));
  STRATA_ASSIGN_OR_RETURN(
      e->adam_, CpuAdam::create(spec.adam, adam_threads(spec.adam_threads, plan, *spec.backend)));
  STRATA_ASSIGN_OR_RETURN(e->tiers_, TierManager::create(*spec.backend, *spec.layout,
                                                         std::move(plan), spec.tier_options));
  STRATA_ASSIGN_OR_RETURN(e->pipeline_, OptimizerPipeline::create(*e->tiers_, *e->adam_));
  e->sharding_ = std::make_unique<Sharding>(*e->tiers_, spec.comm);
  if (model) {
    STRATA_ASSIGN_OR_RETURN(e->store_,
                            OffloadStore::create(*e->tiers_, *e->pipeline_, *e->sharding_));
  }
  return e;
}

std::string Engine::optimizer_description() {
  const TierPlan& p = plan();
  const bool device = p.uses(SlotKind::kMaster, Tier::kDevice);
  const bool cpu = p.uses(SlotKind::kMaster, Tier::kHost) || p.uses(SlotKind::kMaster, Tier::kNvme);
  const std::string on_device = fmt::format(
      "{} on the device ({})", adam_->settings().adamw ? "AdamW" : "Adam", backend_->name());
  if (!device) return adam_->description();
  if (!cpu) return on_device;
  return fmt::format("{} and {}", adam_->description(), on_device);
}

OffloadStore& Engine::store() {
  STRATA_ASSERT_MSG(store_ != nullptr, "an optimizer-only engine has no model store");
  return *store_;
}

}  // namespace strata::offload
