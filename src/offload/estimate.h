// How many bytes each tier (device, pinned host, NVMe) needs per rank for a model under a config:
// the static side of the tier plan. `strata estimate` prints it; the trainer checks it against
// the budgets and the free space on the nvme_path file systems before it starts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/model_spec.h"

namespace strata::offload {

enum class Tier { kDevice = 0, kHost = 1, kNvme = 2 };
inline constexpr int kTierCount = 3;

const char* to_string(Tier tier);

// The tier that `offload_*.device` names: none keeps the state on the device.
Tier home_tier(config::OffloadDevice device);

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
  std::vector<std::string> assumptions;  // one sentence each, printed with the numbers

  // Sum of the items of `tier`, per rank.
  std::uint64_t bytes(Tier tier) const;
  // Per node: a node's host memory and NVMe drives serve all of its ranks.
  std::uint64_t node_bytes(Tier tier) const { return bytes(tier) * ranks_per_node; }
};

struct EstimateInput {
  model::ModelShape shape;
  std::int64_t params = 0;     // total; may differ from the shape's count when given by the user
  bool shape_assumed = false;  // the shape was guessed from the count (printed as an assumption)
  std::int64_t ranks_per_node = 1;
  std::uint64_t device_budget_bytes = 0;  // decides how many prefetch frames fit (0: no limit)
};

// A Llama-like shape with about `params` parameters (vocabulary 32000, depth ~ hidden/128), for
// estimates made from a bare parameter count.
model::ModelShape assumed_shape(std::int64_t params);

// Bytes per tier per rank for `input` under `config` (whose world_size is used): the items of
// the tier plan (tier/plan.h) the trainer allocates, so the two agree (docs/estimate.md).
Estimate estimate(const config::Config& config, const EstimateInput& input);

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
