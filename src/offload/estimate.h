// How many bytes each tier (device, pinned host, NVMe) needs per rank for a model under a run's
// plan settings: the items of the tier plan (plan.h) with the model runner's activations, for a
// model given by its shape or only by a parameter count. `strata estimate` prints it, with
// verdicts against the budgets (train::estimate turns a config into the settings).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "model/runner.h"
#include "offload/plan.h"
#include "offload/tier.h"

namespace strata::offload {

struct EstimateItem {
  Tier tier = Tier::kDevice;
  std::string what;  // "fp32 master weights (shard)", ...
  std::uint64_t bytes = 0;
};

struct Estimate {
  std::int64_t params = 0;
  std::int64_t world_size = 1;
  std::int64_t ranks_per_node = 1;
  std::int64_t largest_unit_params = 0;
  std::vector<EstimateItem> items;
  // The training state per tier and kind as stored (TierPlan::state_bytes), per rank, and the
  // parameters it is for (the rank's shard of them).
  std::uint64_t state_bytes[kTierCount][kSlotKinds] = {};
  double state_params = 0.0;
  std::vector<std::string> assumptions;  // one sentence each, printed with the numbers

  // Sum of the items of `tier`, per rank.
  std::uint64_t bytes(Tier tier) const;
  // Per node: a node's host memory and NVMe drives serve all of its ranks.
  std::uint64_t node_bytes(Tier tier) const { return bytes(tier) * ranks_per_node; }
  // Bytes of training state per parameter outside the device (host + NVMe) and on `tier`.
  double state_bytes_per_param() const;
  double state_bytes_per_param(Tier tier) const;
  double state_bytes_per_param(Tier tier, SlotKind kind) const;
};

struct EstimateInput {
  model::ModelShape shape;
  std::int64_t params = 0;     // total; may differ from the shape's count when given by the user
  bool shape_assumed = false;  // the shape was guessed from the count (printed as an assumption)
  std::int64_t ranks_per_node = 1;
  std::uint64_t device_budget_bytes = 0;  // decides how many prefetch frames fit (0: no limit)
  // The device is the CPU backend's (strata.backend cpu): device_optimizer auto keeps the
  // optimizer on the host there. Otherwise the estimate is for a GPU.
  bool device_is_host = false;
};

// A Llama-like shape with about `params` parameters (vocabulary 32000, depth ~ hidden/128), for
// estimates made from a bare parameter count.
model::ModelShape assumed_shape(std::int64_t params);

// Bytes per tier per rank for `input` with `settings` on `world` ranks and a runner made with
// `runner`: the items of the tier plan the trainer allocates, so the two agree
// (docs/estimate.md).
Estimate estimate(const PlanSettings& settings, int world, const model::RunnerOptions& runner,
                  const EstimateInput& input);

struct Budget {
  Tier tier = Tier::kDevice;
  std::uint64_t bytes = 0;  // per rank for the device, per node for host and NVMe
};

struct Verdict {
  Tier tier = Tier::kDevice;
  std::uint64_t needed_bytes = 0;
  std::uint64_t budget_bytes = 0;
  bool fits = true;
};

std::vector<Verdict> check_budgets(const Estimate& estimate, const std::vector<Budget>& budgets);

}  // namespace strata::offload
