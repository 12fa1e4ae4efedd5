// `strata estimate` as a library function: the bytes each tier needs per rank for a model under a
// config, with verdicts against the budgets. The CLI prints the report (src/cli/cmd_estimate.cc);
// the Python package returns it as a dict (python/, strata.estimate).
#pragma once

#include <json/value.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "offload/estimate.h"

namespace strata::train {

struct EstimateRequest {
  std::string config_file;             // DeepSpeed-style JSON config (required)
  std::vector<std::string> overrides;  // "dotted.key=VALUE"
  std::string params;                  // a parameter count ("7B"), or
  std::string model;                   // a Hugging Face config.json or model directory, or neither
                                       // (the config's strata.model)
  std::int64_t ranks_per_node = 0;     // 0: WORLD_SIZE and similar launcher variables, else 1
  std::int64_t nodes = 1;
  std::string device_bytes, host_bytes, nvme_bytes;  // budgets ("24GiB"); "" = the config's
  // How the request's fields are named in errors (the CLI's options, or a binding's arguments).
  std::string params_name = "--params", model_name = "--model";
  std::string device_bytes_name = "--device-bytes", host_bytes_name = "--host-bytes",
              nvme_bytes_name = "--nvme-bytes";
};

struct EstimateReport {
  offload::Estimate estimate;
  std::vector<offload::Verdict> verdicts;
  bool all_fit = true;
};

// kUsage naming the field at fault for a bad count or budget, kConfig for the config's problems.
Result<EstimateReport> estimate_report(const EstimateRequest& request);

// The report as one JSON object (`strata estimate --json`): bytes per tier, items, assumptions,
// verdicts.
Json::Value estimate_json(const EstimateReport& report);

}  // namespace strata::train
