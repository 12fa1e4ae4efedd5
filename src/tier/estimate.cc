#include "tier/estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/assert.h"
#include "common/units.h"

namespace strata::tier {
namespace {

using config::OffloadDevice;

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return (a + b - 1) / b;
}

// Elements per token a transformer block keeps for its backward pass: the norm inputs and
// outputs, q/k/v, the attention output, the residuals, and the MLP's hidden activations
// (GPT-2: fc output and GELU output; Llama: gate, up and SiLU(gate)). Attention is blocked, so
// no sequence x sequence matrix is kept.
std::uint64_t block_activation_elements(const model::ModelShape& s) {
  const std::uint64_t h = s.hidden_size;
  const std::uint64_t q = s.num_heads * s.head_dim;
  const std::uint64_t kv = s.num_kv_heads * s.head_dim;
  const std::uint64_t mlp =
      s.family == config::ModelFamily::kGpt2 ? 2 * s.intermediate_size : 3 * s.intermediate_size;
  return 5 * h + 2 * q + 2 * kv + mlp;
}

}  // namespace

const char* to_string(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kNvme:
      return "nvme";
  }
  return "unknown";
}

Tier home_tier(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kNone:
      return Tier::kDevice;
    case OffloadDevice::kCpu:
      return Tier::kHost;
    case OffloadDevice::kNvme:
      return Tier::kNvme;
  }
  return Tier::kDevice;
}

std::uint64_t Estimate::bytes(Tier tier) const {
  std::uint64_t sum = 0;
  for (const EstimateItem& item : items) {
    if (item.tier == tier) sum += item.bytes;
  }
  return sum;
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

Estimate estimate(const config::Config& c, const EstimateInput& in) {
  const config::ZeroConfig& z = c.zero_optimization;
  Estimate e;
  e.params = in.params;
  e.world_size = c.world_size;
  e.ranks_per_node = in.ranks_per_node;
  const std::uint64_t p = static_cast<std::uint64_t>(in.params);
  const std::uint64_t w = static_cast<std::uint64_t>(c.world_size);
  const bool half = c.precision() != config::Precision::kFp32;
  const std::uint64_t compute_bytes = half ? 2 : 4;
  const std::string dtype = config::to_string(c.precision());

  std::vector<model::UnitSpec> units = model::units(in.shape);
  std::uint64_t largest = 0;
  for (const model::UnitSpec& u : units)
    largest = std::max<std::uint64_t>(largest, u.params);
  // When the user gave the count, scale the shape's units to it.
  const std::int64_t shape_params = model::total_params(in.shape);
  if (shape_params > 0 && shape_params != in.params) {
    largest = static_cast<std::uint64_t>(static_cast<double>(largest) * in.params / shape_params);
  }
  largest = std::min(largest, p);
  e.largest_unit_params = static_cast<std::int64_t>(largest);

  auto add = [&e](Tier tier, std::string what, std::uint64_t bytes) {
    if (bytes > 0) e.items.push_back({tier, std::move(what), bytes});
  };
  const std::uint64_t param_count = z.stage >= 3 ? ceil_div(p, w) : p;
  const std::uint64_t grad_count = z.stage >= 2 ? ceil_div(p, w) : p;
  const std::uint64_t optim_count = z.stage >= 1 ? ceil_div(p, w) : p;
  const char* param_scope = z.stage >= 3 ? "this rank's shard" : "full replica";
  const char* grad_scope = z.stage >= 2 ? "this rank's shard" : "full replica";
  const char* optim_scope = z.stage >= 1 ? "this rank's shard" : "full replica";

  // Parameters: the compute copy lives in offload_param's tier (stage 3 only).
  const Tier param_tier = z.stage >= 3 ? home_tier(z.offload_param.device) : Tier::kDevice;
  add(param_tier, fmt::format("{} parameters ({})", dtype, param_scope),
      compute_bytes * param_count);
  if (param_tier == Tier::kNvme) {
    const std::uint64_t buffer = std::max(z.offload_param.buffer_size, ceil_div(largest, w));
    add(Tier::kHost,
        fmt::format("parameter staging, pinned ({} buffers x {} elements)",
                    z.offload_param.buffer_count, buffer),
        compute_bytes * static_cast<std::uint64_t>(z.offload_param.buffer_count) * buffer);
    add(Tier::kHost, "parameters cached in host memory (max_in_cpu)",
        compute_bytes * std::min(z.offload_param.max_in_cpu, param_count));
    if (z.offload_param.buffer_size < ceil_div(largest, w)) {
      e.assumptions.push_back(fmt::format(
          "offload_param.buffer_size ({}) is below the largest unit shard ({} elements); the "
          "staging buffers are sized to the unit shard",
          z.offload_param.buffer_size, ceil_div(largest, w)));
    }
  }
  if (z.stage >= 3 || param_tier != Tier::kDevice) {
    // Gathered units in flight: the one in use and the prefetched ones, within the prefetch
    // bucket and the live-parameter cap; small units stay resident (persistence threshold).
    const std::uint64_t prefetch =
        std::min(std::max<std::uint64_t>(z.stage3_prefetch_bucket_size, largest), p - largest);
    std::uint64_t live = std::min<std::uint64_t>(largest + prefetch,
                                                 std::max(z.stage3_max_live_parameters, largest));
    add(Tier::kDevice, "gathered units in flight (in use + prefetched)", compute_bytes * live);
    std::uint64_t persistent = 0;
    for (const model::UnitSpec& u : units) {
      if (static_cast<std::uint64_t>(u.params) < z.stage3_param_persistence_threshold)
        persistent += u.params;
    }
    add(Tier::kDevice, "persistent small units (below stage3_param_persistence_threshold)",
        compute_bytes * persistent);
  }

  // Optimizer state and accumulated gradients: offload_optimizer's tier; with ratio < 1 the rest
  // stays on the device.
  const Tier optim_tier = home_tier(z.offload_optimizer.device);
  const double offloaded = optim_tier == Tier::kDevice ? 1.0 : z.offload_optimizer.ratio;
  auto add_split = [&](const std::string& what, std::uint64_t bytes) {
    const auto away = static_cast<std::uint64_t>(std::llround(bytes * offloaded));
    add(optim_tier, what, away);
    if (optim_tier != Tier::kDevice)
      add(Tier::kDevice, what + " (not offloaded: ratio)", bytes - away);
  };
  if (half) add_split(fmt::format("fp32 master weights ({})", optim_scope), 4 * optim_count);
  add_split(fmt::format("Adam exp_avg ({})", optim_scope), 4 * optim_count);
  add_split(fmt::format("Adam exp_avg_sq ({})", optim_scope), 4 * optim_count);
  add_split(fmt::format("fp32 accumulated gradients ({})", grad_scope), 4 * grad_count);
  add(Tier::kDevice, fmt::format("{} gradient of the unit in backward", dtype),
      compute_bytes * largest);
  if (optim_tier != Tier::kDevice) {
    add(Tier::kHost, "gradient staging, pinned (one unit shard, device to host)",
        compute_bytes * ceil_div(largest, w));
  }
  if (optim_tier == Tier::kNvme) {
    const std::uint64_t tile = std::min(z.sub_group_size, optim_count);
    add(Tier::kHost,
        fmt::format("optimizer pipeline, pinned (3 stages x 4 fp32 arrays x {} elements)", tile),
        3 * 4 * 4 * tile);
  }

  // Activations for one micro-batch.
  const config::ModelConfig& m = c.strata.model;
  const std::uint64_t b = c.train_micro_batch_size_per_gpu;
  const std::uint64_t s = std::min<std::uint64_t>(c.strata.data.seq_len, in.shape.max_seq_len);
  const std::uint64_t act_bytes = c.strata.backend == config::Backend::kCpu ? 4 : compute_bytes;
  const std::uint64_t per_block = b * s * block_activation_elements(in.shape) * act_bytes;
  const std::uint64_t layers = in.shape.num_layers;
  if (m.activation_checkpointing) {
    add(m.activation_offload ? Tier::kHost : Tier::kDevice,
        fmt::format("activation checkpoints ({} blocks x micro-batch x sequence x hidden)", layers),
        layers * b * s * in.shape.hidden_size * act_bytes);
    add(Tier::kDevice, "activations of the block being recomputed, and their gradients",
        2 * per_block);
  } else {
    add(Tier::kDevice, fmt::format("activations of {} blocks (no checkpointing)", layers),
        layers * per_block);
    add(Tier::kDevice, "activation gradients of one block", per_block);
  }
  add(Tier::kDevice, "fp32 logits (their gradient is written in place)",
      4 * b * s * in.shape.vocab_size);

  e.assumptions.push_back(fmt::format(
      "{} parameters, largest unit {} ({}); world size {} ({} per node), ZeRO stage {}", in.params,
      largest, in.shape_assumed ? "from an assumed shape" : "from the model shape", c.world_size,
      in.ranks_per_node, z.stage));
  if (in.shape_assumed) {
    e.assumptions.push_back(fmt::format(
        "shape assumed from the count: Llama-like, hidden {}, {} blocks, vocabulary {}; give "
        "--model config.json for exact units and activations",
        in.shape.hidden_size, in.shape.num_layers, in.shape.vocab_size));
  }
  e.assumptions.push_back(fmt::format(
      "activations for micro-batch {} x sequence {} in {} bytes per element ({}activation "
      "checkpointing{})",
      b, s, act_bytes, m.activation_checkpointing ? "" : "no ",
      m.activation_offload ? ", checkpoints on the host" : ""));
  e.assumptions.push_back(
      "not counted: the backend's own workspace (cuBLAS, BLAS threads) and allocator "
      "fragmentation; keep ~10% of the device free");
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

}  // namespace strata::tier
