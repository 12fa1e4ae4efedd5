#include "train/estimate_report.h"

#include <fmt/format.h>

#include <optional>

#include "comm/launch.h"
#include "common/units.h"
#include "config/config.h"
#include "model/model_spec.h"
#include "train/run_settings.h"

namespace strata::train {
namespace {

Status usage(const std::string& option, const std::string& message) {
  return Status(ErrorCode::kUsage, message, option);
}

// A budget from the request, else from the config's strata.*_bytes_max (0 = none).
Result<std::uint64_t> budget_of(const std::string& name, const std::string& text,
                                std::uint64_t from_config) {
  if (text.empty()) return from_config;
  std::optional<std::uint64_t> bytes = parse_bytes(text);
  if (!bytes || *bytes == 0) {
    return usage(name,
                 fmt::format("'{}' is not a byte count; valid: e.g. 24GiB, 80e9, 512MiB", text));
  }
  return *bytes;
}

}  // namespace

Result<EstimateReport> estimate_report(const EstimateRequest& r) {
  if (!r.params.empty() && !r.model.empty()) {
    return usage(r.params_name + "/" + r.model_name,
                 fmt::format("give one of {} and {}, not both", r.params_name, r.model_name));
  }
  config::LoadOptions load;
  std::int64_t ranks_per_node = r.ranks_per_node;
  if (ranks_per_node <= 0) {
    STRATA_ASSIGN_OR_RETURN(ranks_per_node, comm::world_size_from_environment());
  }
  if (r.nodes <= 0) {
    return usage("nodes", fmt::format("{} nodes; valid: 1 or more", r.nodes));
  }
  load.world_size = ranks_per_node * r.nodes;
  STRATA_ASSIGN_OR_RETURN(config::Loaded loaded,
                          config::load_config_file(r.config_file, r.overrides, load));
  const config::Config& c = loaded.config;

  offload::EstimateInput input;
  input.ranks_per_node = ranks_per_node;
  if (!r.params.empty()) {
    std::optional<std::uint64_t> count = parse_count(r.params);
    if (!count || *count == 0 || *count > (1ull << 50)) {
      return usage(r.params_name, fmt::format("'{}' is not a parameter count; valid: e.g. 7e9, "
                                              "7B, 124M, 1300000000",
                                              r.params));
    }
    input.params = static_cast<std::int64_t>(*count);
    input.shape = offload::assumed_shape(input.params);
    input.shape_assumed = true;
  } else {
    config::ModelConfig model = c.strata.model;
    if (!r.model.empty()) {
      // Only the shape matters here: RoPE variants and attention patterns Strata cannot train are
      // still counted.
      STRATA_ASSIGN_OR_RETURN(model, model::read_hf_config(r.model, model::HfRead::kShapeOnly));
      model.activation_checkpointing = c.strata.model.activation_checkpointing;
      model.activation_offload = c.strata.model.activation_offload;
    }
    STRATA_ASSIGN_OR_RETURN(input.shape, model::shape_of(model, model::HfRead::kShapeOnly));
    input.params = model::total_params(input.shape);
  }

  EstimateReport report;
  std::vector<offload::Budget> budgets;
  STRATA_ASSIGN_OR_RETURN(std::uint64_t device, budget_of(r.device_bytes_name, r.device_bytes,
                                                          c.strata.device_bytes_max));
  input.device_budget_bytes = device;
  report.estimate = estimate(c, input);
  STRATA_ASSIGN_OR_RETURN(std::uint64_t host,
                          budget_of(r.host_bytes_name, r.host_bytes, c.strata.host_bytes_max));
  STRATA_ASSIGN_OR_RETURN(std::uint64_t nvme,
                          budget_of(r.nvme_bytes_name, r.nvme_bytes, c.strata.nvme_bytes_max));
  if (device > 0) budgets.push_back({offload::Tier::kDevice, device});
  if (host > 0) budgets.push_back({offload::Tier::kHost, host});
  if (nvme > 0) budgets.push_back({offload::Tier::kNvme, nvme});
  report.verdicts = offload::check_budgets(report.estimate, budgets);
  for (const offload::Verdict& v : report.verdicts)
    report.all_fit = report.all_fit && v.fits;
  return report;
}

Json::Value estimate_json(const EstimateReport& report) {
  using U = Json::UInt64;
  const offload::Estimate& e = report.estimate;
  Json::Value root(Json::objectValue);
  root["device_bytes"] = U{e.bytes(offload::Tier::kDevice)};
  root["host_bytes"] = U{e.bytes(offload::Tier::kHost)};
  root["nvme_bytes"] = U{e.bytes(offload::Tier::kNvme)};
  root["host_bytes_per_node"] = U{e.node_bytes(offload::Tier::kHost)};
  root["nvme_bytes_per_node"] = U{e.node_bytes(offload::Tier::kNvme)};
  root["params"] = Json::Int64{e.params};
  root["largest_unit_params"] = Json::Int64{e.largest_unit_params};
  root["world_size"] = Json::Int64{e.world_size};
  root["ranks_per_node"] = Json::Int64{e.ranks_per_node};
  // Training state per parameter outside the device, by tier and kind (as stored).
  Json::Value& state = root["state_bytes_per_param"] = Json::Value(Json::objectValue);
  state["off_device"] = e.state_bytes_per_param();
  for (int t = 0; t < offload::kTierCount; ++t) {
    const auto tier = static_cast<offload::Tier>(t);
    Json::Value& one = state[offload::to_string(tier)] = Json::Value(Json::objectValue);
    one["total"] = e.state_bytes_per_param(tier);
    for (int k = 0; k < offload::kSlotKinds; ++k) {
      const auto kind = static_cast<offload::SlotKind>(k);
      one[offload::to_string(kind)] = e.state_bytes_per_param(tier, kind);
    }
  }
  Json::Value& items = root["items"] = Json::Value(Json::arrayValue);
  for (const offload::EstimateItem& item : e.items) {
    Json::Value one;
    one["tier"] = offload::to_string(item.tier);
    one["what"] = item.what;
    one["bytes"] = U{item.bytes};
    items.append(one);
  }
  Json::Value& assumptions = root["assumptions"] = Json::Value(Json::arrayValue);
  for (const std::string& a : e.assumptions)
    assumptions.append(a);
  Json::Value& fits = root["verdicts"] = Json::Value(Json::arrayValue);
  for (const offload::Verdict& v : report.verdicts) {
    Json::Value one;
    one["tier"] = offload::to_string(v.tier);
    one["needed_bytes"] = U{v.needed_bytes};
    one["budget_bytes"] = U{v.budget_bytes};
    one["fits"] = v.fits;
    fits.append(one);
  }
  root["fits"] = report.all_fit;
  return root;
}

}  // namespace strata::train
