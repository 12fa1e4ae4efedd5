// `strata estimate`: bytes per tier per rank for a model under a config, and whether they fit the
// budgets (see offload/estimate.h and docs/estimate.md).
#include <json/writer.h>

#include <cstdio>

#include "cli/command.h"
#include "common/units.h"
#include "config/config.h"
#include "model/model_spec.h"
#include "offload/estimate.h"
#include "train/estimate_report.h"

namespace strata::cli {
namespace {

struct EstimateOptions {
  train::EstimateRequest request;
  bool json = false;
};

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
  std::printf(
      "training state outside the device: %.3f bytes per parameter (host %.3f, NVMe %.3f)\n",
      e.state_bytes_per_param(), e.state_bytes_per_param(offload::Tier::kHost),
      e.state_bytes_per_param(offload::Tier::kNvme));
  for (int k = 0; k < offload::kSlotKinds; ++k) {
    const auto kind = static_cast<offload::SlotKind>(k);
    const double host = e.state_bytes_per_param(offload::Tier::kHost, kind);
    const double nvme = e.state_bytes_per_param(offload::Tier::kNvme, kind);
    if (host + nvme > 0.0) {
      std::printf("  %-11s %.3f (host %.3f, NVMe %.3f)\n", offload::to_string(kind), host + nvme,
                  host, nvme);
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

Status run(const EstimateOptions& o, bool* all_fit) {
  STRATA_ASSIGN_OR_RETURN(train::EstimateReport report, train::estimate_report(o.request));
  *all_fit = report.all_fit;
  if (o.json) {
    Json::StreamWriterBuilder writer;
    writer["indentation"] = "  ";
    std::printf("%s\n", Json::writeString(writer, train::estimate_json(report)).c_str());
  } else {
    print_text(report.estimate, report.verdicts);
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
  cmd->add_option("--config", o->request.config_file, "DeepSpeed-style JSON config")->required();
  cmd->add_option("--params", o->request.params,
                  "Total parameter count (7e9, 7B, 124M); the unit shape is assumed Llama-like");
  cmd->add_option("--model", o->request.model,
                  "Hugging Face config.json or model directory (default: the config's "
                  "strata.model)");
  cmd->add_option("--gpus", o->request.ranks_per_node,
                  "Ranks (GPUs) per node (default: WORLD_SIZE and similar launcher variables, "
                  "else 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--nodes", o->request.nodes, "Nodes (default 1)")->check(CLI::PositiveNumber);
  cmd->add_option("--device-bytes", o->request.device_bytes,
                  "Device budget per rank (default: strata.device_bytes_max when set)");
  cmd->add_option("--host-bytes", o->request.host_bytes,
                  "Host memory budget per node (default: strata.host_bytes_max when set)");
  cmd->add_option("--nvme-bytes", o->request.nvme_bytes,
                  "NVMe budget per node (default: strata.nvme_bytes_max when set)");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  add_set_option(cmd, &o->request.overrides);
  registry.add(cmd, [o] {
    bool all_fit = true;
    Status status = run(*o, &all_fit);
    if (!status.is_ok()) return report_error(status);
    return all_fit ? 0 : 1;
  });
}

}  // namespace strata::cli
