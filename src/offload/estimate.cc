// The per-tier estimate (see estimate.h).
#include "offload/estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/assert.h"
#include "common/units.h"
#include "model/layout.h"
#include "offload/sharding.h"

namespace strata::offload {

std::uint64_t Estimate::bytes(Tier tier) const {
  std::uint64_t sum = 0;
  for (const EstimateItem& item : items) {
    if (item.tier == tier) sum += item.bytes;
  }
  return sum;
}

double Estimate::state_bytes_per_param(Tier tier, SlotKind kind) const {
  if (state_params <= 0.0) return 0.0;
  return static_cast<double>(state_bytes[static_cast<int>(tier)][static_cast<int>(kind)]) /
         state_params;
}

double Estimate::state_bytes_per_param(Tier tier) const {
  double sum = 0.0;
  for (int k = 0; k < kSlotKinds; ++k)
    sum += state_bytes_per_param(tier, static_cast<SlotKind>(k));
  return sum;
}

double Estimate::state_bytes_per_param() const {
  return state_bytes_per_param(Tier::kHost) + state_bytes_per_param(Tier::kNvme);
}

model::ModelShape assumed_shape(std::int64_t params) {
  STRATA_ASSERT(params > 0);
  model::ModelShape s;
  s.family = config::ModelFamily::kLlama;
  s.vocab_size = 32000;
  s.max_seq_len = 4096;
  // A Llama block holds about 12 h^2 parameters and Llama models have about h/128 blocks, so
  // 12 h^2 * h/128 ~ params. Hidden sizes are multiples of 256 (at least 256).
  double hidden = std::cbrt(static_cast<double>(params) * 128.0 / 12.0);
  s.hidden_size = std::max<std::int64_t>(256, std::llround(hidden / 256.0) * 256);
  s.num_heads = s.hidden_size / 128;
  s.num_kv_heads = s.num_heads;
  s.head_dim = 128;
  s.intermediate_size = model::llama_intermediate_size(s.hidden_size);
  s.tie_word_embeddings = false;
  const double per_block =
      4.0 * s.hidden_size * s.hidden_size + 3.0 * s.hidden_size * s.intermediate_size;
  const double rest = static_cast<double>(params) - 2.0 * s.vocab_size * s.hidden_size;
  s.num_layers = std::max<std::int64_t>(1, std::llround(rest / per_block));
  return s;
}

Estimate estimate(const PlanSettings& settings, int world, const model::RunnerOptions& runner,
                  const EstimateInput& in) {
  Estimate e;
  e.params = in.params;
  e.world_size = world;
  e.ranks_per_node = in.ranks_per_node;

  // The same plan the trainer allocates, for rank 0, with the runner's exact activation buffers.
  const model::ModelLayout layout =
      model::build_layout(in.shape, layout_shards(settings.zero_stage, world));
  model::RunnerMemory activations = model::ModelRunner<float>::memory_needed(in.shape, runner);
  PlanInput plan_input;
  plan_input.settings = settings;
  plan_input.layout = &layout;
  plan_input.world = world;
  plan_input.activation_device_bytes = activations.device_bytes;
  plan_input.activation_host_bytes = activations.host_bytes;
  plan_input.device_budget_bytes = in.device_budget_bytes;
  plan_input.device_is_host = in.device_is_host;
  TierPlan plan = make_plan_unchecked(plan_input);
  if (runner.narrow_companions && in.device_budget_bytes > 0 &&
      plan.device_minimum_bytes > in.device_budget_bytes) {
    // As the trainer does: the activations' 16-bit companions go first when the working set does
    // not fit (the GEMMs then convert their activations).
    const model::WithoutCompanions without = model::without_companions(in.shape, runner);
    e.assumptions.push_back(without.note);
    activations = without.memory;
    plan_input.activation_device_bytes = activations.device_bytes;
    plan_input.activation_host_bytes = activations.host_bytes;
    plan = make_plan_unchecked(plan_input);
  }
  for (const PlanItem& item : plan.items)
    e.items.push_back({item.tier, item.what, item.bytes});
  std::int64_t largest = 0;
  for (const model::UnitLayout& u : layout.units)
    largest = std::max(largest, u.numel);
  for (int t = 0; t < kTierCount; ++t) {
    for (int k = 0; k < kSlotKinds; ++k)
      e.state_bytes[t][k] = plan.state_bytes(static_cast<Tier>(t), static_cast<SlotKind>(k));
  }
  // The rank's share of the parameters the layout holds: its shard of each (padded) unit.
  double shard = 0.0, padded = 0.0, numel = 0.0;
  for (std::size_t i = 0; i < plan.units.size(); ++i) {
    shard += static_cast<double>(plan.units[i].shard_numel);
    padded += static_cast<double>(plan.units[i].padded_numel);
    numel += static_cast<double>(layout.units[i].numel);
  }
  e.state_params = padded > 0.0 ? numel * shard / padded : 0.0;
  e.largest_unit_params = largest;

  e.assumptions.push_back(fmt::format(
      "{} parameters, largest unit {} ({}); world size {} ({} per node), ZeRO stage {}", in.params,
      largest, in.shape_assumed ? "from an assumed shape" : "from the model shape", world,
      in.ranks_per_node, settings.zero_stage));
  if (in.shape_assumed) {
    e.assumptions.push_back(fmt::format(
        "shape assumed from the count: Llama-like, hidden {}, {} blocks, vocabulary {} ({} "
        "parameters); give --model config.json for exact units and activations",
        in.shape.hidden_size, in.shape.num_layers, in.shape.vocab_size,
        model::total_params(in.shape)));
  }
  e.assumptions.push_back(
      "units are padded to 2048 elements (4 KiB pages), so bytes are a little above params x "
      "bytes per element");
  if (plan.uses(SlotKind::kMaster, Tier::kDevice)) {
    e.assumptions.push_back(
        "offload_optimizer none on a GPU: the optimizer state stays on the device and Adam runs "
        "there (strata.device_optimizer auto; off keeps it in host memory)");
  }
  if (plan.state.compressed()) {
    e.assumptions.push_back(fmt::format(
        "strata.optimizer_state: {} master weights, {} Adam moments{}, {} accumulated gradients "
        "(docs/adam.md: what each choice does to the loss)",
        kernels::to_string(plan.state.master), kernels::to_string(plan.state.moments),
        plan.state.moments == kernels::MomentFormat::kQ8
            ? fmt::format(" with an fp32 absmax per block of {}", plan.state.block)
            : std::string(),
        kernels::to_string(plan.state.grad)));
  }
  for (const std::string& note : plan.notes)
    e.assumptions.push_back(note);
  e.assumptions.push_back(fmt::format(
      "activations for micro-batch {} x sequence {} in fp32 (the compute type; {}activation "
      "checkpointing{})",
      runner.batch, runner.seq_len, runner.activation_checkpointing ? "" : "no ",
      runner.activation_offload ? ", checkpoints on the host" : ""));
  if (!plan.uses(SlotKind::kMaster, Tier::kDevice)) {
    e.assumptions.push_back(
        "the optimizer runs on the CPU (CPU Adam), so master weights, moments and accumulated "
        "gradients live in host memory unless offload_optimizer says nvme");
  }
  if (in.device_budget_bytes == 0) {
    e.assumptions.push_back(
        "no device budget given: parameter frames as stage3_prefetch_bucket_size and "
        "stage3_max_live_parameters ask (with a budget, fewer prefetch frames may fit)");
  }
  e.assumptions.push_back(
      "not counted: the backend's own workspace (cuBLAS, BLAS threads); keep ~10% of the device "
      "free on a GPU");
  return e;
}

std::vector<Verdict> check_budgets(const Estimate& estimate, const std::vector<Budget>& budgets) {
  std::vector<Verdict> out;
  for (const Budget& budget : budgets) {
    Verdict v;
    v.tier = budget.tier;
    v.needed_bytes = budget.tier == Tier::kDevice ? estimate.bytes(budget.tier)
                                                  : estimate.node_bytes(budget.tier);
    v.budget_bytes = budget.bytes;
    v.fits = v.needed_bytes <= budget.bytes;
    out.push_back(v);
  }
  return out;
}

}  // namespace strata::offload
