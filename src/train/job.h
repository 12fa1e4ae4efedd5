// A training job as the `strata train` command runs it, as a library function: load and check the
// config (the notes and "auto" choices to stderr), create the trainer, write the effective config
// next to the metrics, train. The CLI (src/cli/cmd_train.cc) and the Python package
// (strata.train) are thin callers; signal handling stays with the caller.
#pragma once

#include <json/value.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "config/config.h"
#include "config/flags.h"

namespace strata::train {

struct JobOptions {
  std::string config_file;
  std::vector<std::string> overrides;    // "dotted.key=VALUE", applied after the flags
  std::vector<config::FlagValue> flags;  // `strata train` flags (config/flags.h)
  bool quiet = false;                    // no start-up notes or progress on stderr
  bool progress_tty = false;             // progress redrawn in place (a terminal)
};

struct JobOutcome {
  Json::Value summary;     // the run's summary (the last line of metrics.jsonl)
  bool first_rank = true;  // rank 0 prints and writes the run's files
  int stopped = 0;         // the signal that stopped the run early (-1: another rank's), or 0
  std::int64_t step = 0;   // steps done
  std::string last_checkpoint;
  std::string output_dir;
};

// What "auto" precision means on this machine: bf16, unless a GPU here has none (then fp16).
std::pair<config::Precision, std::string> auto_precision_here();

// Runs the job. `*started` becomes true once the trainer is being created (a failure from then
// on concerns the whole world of ranks, see comm::abort_world_at_exit).
Result<JobOutcome> run_job(const JobOptions& options, bool* started);

}  // namespace strata::train
