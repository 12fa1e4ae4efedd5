// `strata estimate`: bytes per tier per rank for a model under a config, and whether they fit the
// budgets (see offload/estimate.h and docs/estimate.md).
#include <json/writer.h>

#include <cstdio>

#include "cli/command.h"
#include "comm/launch.h"
#include "common/units.h"
#include "config/config.h"
#include "model/model_spec.h"
#include "offload/estimate.h"
#include "train/run_settings.h"

namespace strata::cli {
namespace {

struct EstimateOptions {
  std::string config_file;
  std::vector<std::string> overrides;
  std::string params;
  std::string model;
  std::int64_t gpus = 0;
  std::int64_t nodes = 1;
  std::string device_bytes;
  std::string host_bytes;
  std::string nvme_bytes;
  bool json = false;
};

Status usage(const std::string& option, const std::string& message) {
  return Status(ErrorCode::kUsage, message, option);
}

// A budget from the command line, else from the config's strata.*_bytes_max (0 = none).
Result<std::uint64_t> budget_of(const std::string& flag, const std::string& text,
                                std::uint64_t from_config) {
  if (text.empty()) return from_config;
  std::optional<std::uint64_t> bytes = parse_bytes(text);
  if (!bytes || *bytes == 0) {
    return usage(flag,
                 fmt::format("'{}' is not a byte count; valid: e.g. 24GiB, 80e9, 512MiB", text));
  }
  return *bytes;
}

void print_text(const offload::Estimate& e, const std::vector<offload::Verdict>& verdicts) {
  for (int t = 0; t < offload::kTierCount; ++t) {
    const auto tier = static_cast<offload::Tier>(t);
    std::printf("%s: %s per rank", offload::to_string(tier), format_bytes(e.bytes(tier)).c_str());
    if (tier != offload::Tier::kDevice && e.ranks_per_node > 1) {
      std::printf(", %s per node (%lld ranks)", format_bytes(e.node_bytes(tier)).c_str(),
                  static_cast<long long>(e.ranks_per_node));
    }
    std::printf("\n");
    for (const offload::EstimateItem& item : e.items) {
      if (item.tier == tier) {
        std::printf("  %12s  %s\n", format_bytes(item.bytes).c_str(), item.what.c_str());
      }
    }
  }
  std::printf("assumptions:\n");
  for (const std::string& a : e.assumptions)
    std::printf("  - %s\n", a.c_str());
  for (const offload::Verdict& v : verdicts) {
    const char* scope = v.tier == offload::Tier::kDevice ? "per rank" : "per node";
    if (v.fits) {
      std::printf("fits: %s needs %s %s of its %s budget\n", offload::to_string(v.tier),
                  format_bytes(v.needed_bytes).c_str(), scope,
                  format_bytes(v.budget_bytes).c_str());
    } else {
      std::printf("DOES NOT FIT: %s needs %s %s but the budget is %s (%s short)\n",
                  offload::to_string(v.tier), format_bytes(v.needed_bytes).c_str(), scope,
                  format_bytes(v.budget_bytes).c_str(),
                  format_bytes(v.needed_bytes - v.budget_bytes).c_str());
    }
  }
}

void print_json(const offload::Estimate& e, const std::vector<offload::Verdict>& verdicts) {
  using U = Json::UInt64;
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
  for (const offload::Verdict& v : verdicts) {
    Json::Value one;
    one["tier"] = offload::to_string(v.tier);
    one["needed_bytes"] = U{v.needed_bytes};
    one["budget_bytes"] = U{v.budget_bytes};
    one["fits"] = v.fits;
    fits.append(one);
  }
  Json::StreamWriterBuilder writer;
  writer["indentation"] = "  ";
  std::printf("%s\n", Json::writeString(writer, root).c_str());
}

Status run(const EstimateOptions& o, bool* all_fit) {
  if (!o.params.empty() && !o.model.empty()) {
    return usage("--params/--model", "give one of --params and --model, not both");
  }
  config::LoadOptions load;
  std::int64_t ranks_per_node = o.gpus;
  if (ranks_per_node <= 0) {
    STRATA_ASSIGN_OR_RETURN(ranks_per_node, comm::world_size_from_environment());
  }
  load.world_size = ranks_per_node * o.nodes;
  STRATA_ASSIGN_OR_RETURN(config::Loaded loaded,
                          config::load_config_file(o.config_file, o.overrides, load));
  const config::Config& c = loaded.config;

  offload::EstimateInput input;
  input.ranks_per_node = ranks_per_node;
  if (!o.params.empty()) {
    std::optional<std::uint64_t> count = parse_count(o.params);
    if (!count || *count == 0 || *count > (1ull << 50)) {
      return usage("--params", fmt::format("'{}' is not a parameter count; valid: e.g. 7e9, 7B, "
                                           "124M, 1300000000",
                                           o.params));
    }
    input.params = static_cast<std::int64_t>(*count);
    input.shape = offload::assumed_shape(input.params);
    input.shape_assumed = true;
  } else {
    config::ModelConfig model = c.strata.model;
    if (!o.model.empty()) {
      // Only the shape matters here: RoPE variants and attention patterns Strata cannot train are
      // still counted.
      STRATA_ASSIGN_OR_RETURN(model, model::read_hf_config(o.model, model::HfRead::kShapeOnly));
      model.activation_checkpointing = c.strata.model.activation_checkpointing;
      model.activation_offload = c.strata.model.activation_offload;
    }
    STRATA_ASSIGN_OR_RETURN(input.shape, model::shape_of(model, model::HfRead::kShapeOnly));
    input.params = model::total_params(input.shape);
  }

  std::vector<offload::Budget> budgets;
  STRATA_ASSIGN_OR_RETURN(std::uint64_t device,
                          budget_of("--device-bytes", o.device_bytes, c.strata.device_bytes_max));
  input.device_budget_bytes = device;
  offload::Estimate estimate = train::estimate(c, input);
  STRATA_ASSIGN_OR_RETURN(std::uint64_t host,
                          budget_of("--host-bytes", o.host_bytes, c.strata.host_bytes_max));
  STRATA_ASSIGN_OR_RETURN(std::uint64_t nvme,
                          budget_of("--nvme-bytes", o.nvme_bytes, c.strata.nvme_bytes_max));
  if (device > 0) budgets.push_back({offload::Tier::kDevice, device});
  if (host > 0) budgets.push_back({offload::Tier::kHost, host});
  if (nvme > 0) budgets.push_back({offload::Tier::kNvme, nvme});
  std::vector<offload::Verdict> verdicts = offload::check_budgets(estimate, budgets);
  for (const offload::Verdict& v : verdicts)
    *all_fit = *all_fit && v.fits;
  if (o.json) {
    print_json(estimate, verdicts);
  } else {
    print_text(estimate, verdicts);
  }
  return Status::ok();
}

}  // namespace

void register_estimate(CLI::App& root, Registry& registry) {
  auto o = std::make_shared<EstimateOptions>();
  CLI::App* cmd = root.add_subcommand(
      "estimate",
      "Bytes each tier (device, pinned host, NVMe) needs per rank for a model under a config, "
      "and whether they fit the budgets. Exit code 1 when a tier does not fit.");
  cmd->add_option("--config", o->config_file, "DeepSpeed-style JSON config")->required();
  cmd->add_option("--params", o->params,
                  "Total parameter count (7e9, 7B, 124M); the unit shape is assumed Llama-like");
  cmd->add_option("--model", o->model,
                  "Hugging Face config.json or model directory (default: the config's "
                  "strata.model)");
  cmd->add_option("--gpus", o->gpus,
                  "Ranks (GPUs) per node (default: WORLD_SIZE and similar launcher variables, "
                  "else 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--nodes", o->nodes, "Nodes (default 1)")->check(CLI::PositiveNumber);
  cmd->add_option("--device-bytes", o->device_bytes,
                  "Device budget per rank (default: strata.device_bytes_max when set)");
  cmd->add_option("--host-bytes", o->host_bytes,
                  "Host memory budget per node (default: strata.host_bytes_max when set)");
  cmd->add_option("--nvme-bytes", o->nvme_bytes,
                  "NVMe budget per node (default: strata.nvme_bytes_max when set)");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  add_set_option(cmd, &o->overrides);
  registry.add(cmd, [o] {
    bool all_fit = true;
    Status status = run(*o, &all_fit);
    if (!status.is_ok()) return report_error(status);
    return all_fit ? 0 : 1;
  });
}

}  // namespace strata::cli
