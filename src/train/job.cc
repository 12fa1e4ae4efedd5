#include "train/job.h"

#include <fmt/format.h>

#include <cstdio>
#include <fstream>

#include "comm/launch.h"
#include "config/report.h"
#include "sys/gpu.h"
#include "train/trainer.h"

namespace strata::train {

std::pair<config::Precision, std::string> auto_precision_here() {
  const sys::CudaProbe probe = sys::probe_cuda();
  if (probe.gpus.empty()) {
    return {config::Precision::kBf16,
            "no GPU here, so the CPU backend: bf16 halves the memory and needs no loss scaling"};
  }
  for (const sys::GpuInfo& gpu : probe.gpus) {
    if (gpu.compute_major < 8) {
      return {config::Precision::kFp16,
              fmt::format("GPU {} ({}, compute capability {}.{}) has no bf16, so fp16 with loss "
                          "scaling",
                          gpu.index, gpu.name, gpu.compute_major, gpu.compute_minor)};
    }
  }
  return {config::Precision::kBf16,
          fmt::format("GPU {} ({}) computes in bf16, which needs no loss scaling",
                      probe.gpus[0].index, probe.gpus[0].name)};
}

Result<JobOutcome> run_job(const JobOptions& options, bool* started) {
  *started = false;
  config::LoadOptions load;
  STRATA_ASSIGN_OR_RETURN(load.world_size, comm::world_size_from_environment());
  load.purpose = config::Purpose::kTrain;
  load.flags = options.flags;
  load.auto_precision = auto_precision_here;
  config::Checked checked = config::check_config_file(options.config_file, options.overrides, load);
  if (!options.quiet) {
    std::fputs(config::format_notes(checked.loaded).c_str(), stderr);
    if (checked.status.is_ok()) std::fputs(config::format_autos(checked.loaded).c_str(), stderr);
  }
  STRATA_TRY(checked.status);
  const config::Config& config = checked.loaded.config;
  TrainerOptions trainer_options;
  trainer_options.progress_tty = options.progress_tty;
  trainer_options.quiet = options.quiet;
  *started = true;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                          Trainer::create(config, trainer_options));
  JobOutcome outcome;
  outcome.first_rank = trainer->rank() == 0;
  outcome.output_dir = config.strata.output_dir;
  if (outcome.first_rank) {
    // The values in effect, next to the metrics they produced.
    std::ofstream out(config.strata.output_dir + "/effective_config.json");
    out << config::to_json(config);
  }
  STRATA_TRY(trainer->run());
  outcome.summary = trainer->summary();
  outcome.stopped = trainer->stopped();
  outcome.step = trainer->counters().step;
  outcome.last_checkpoint = trainer->last_checkpoint();
  return outcome;
}

}  // namespace strata::train
