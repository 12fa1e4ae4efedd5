// `strata train --config FILE [--set KEY.PATH=VALUE ...] [--trace FILE]`: trains a model as the
// config says and prints the summary as one JSON line on stdout (start-up notes and progress go to
// stderr).
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "cli/command.h"
#include "comm/world.h"
#include "config/config.h"
#include "train/trainer.h"

namespace strata::cli {
namespace {

struct TrainOptions {
  std::string config;
  std::vector<std::string> overrides;
  bool quiet = false;
  std::string trace;
};

int run_train(const TrainOptions& options) {
  config::LoadOptions load;
  Result<std::int64_t> world_size = comm::world_size_from_environment();
  if (!world_size.is_ok()) return report_error(world_size.status());
  load.world_size = *world_size;
  std::vector<std::string> overrides = options.overrides;
  if (!options.trace.empty()) overrides.push_back("strata.trace_file=" + options.trace);
  auto loaded = config::load_config_file(options.config, overrides, load);
  if (!loaded.is_ok()) return report_error(loaded.status());
  if (!options.quiet) {
    for (const config::Note& note : loaded->notes) {
      std::fprintf(stderr, "strata: note: %s: %s\n", note.path.c_str(), note.message.c_str());
    }
  }
  train::TrainerOptions trainer_options;
  trainer_options.progress_tty = ::isatty(STDERR_FILENO) == 1;
  trainer_options.quiet = options.quiet;
  // On several ranks, a rank that fails ends the others at once (MPI_Abort) instead of leaving
  // them to strata.comm_timeout_s.
  auto fail = [](const Status& status) {
    const int code = report_error(status);
    comm::abort_world_at_exit(code);
    return code;
  };
  auto trainer = train::Trainer::create(loaded->config, trainer_options);
  if (!trainer.is_ok()) return fail(trainer.status());
  const bool first_rank = (*trainer)->rank() == 0;
  if (first_rank) {
    // The values in effect, next to the metrics they produced.
    std::ofstream out(loaded->config.strata.output_dir + "/effective_config.json");
    out << config::to_json(loaded->config);
  }
  Status status = (*trainer)->run();
  if (!status.is_ok()) return fail(status);
  if (first_rank) std::printf("%s\n", train::MetricsLog::to_line((*trainer)->summary()).c_str());
  return 0;
}

}  // namespace

void register_train(CLI::App& root, Registry& registry) {
  auto options = std::make_shared<TrainOptions>();
  CLI::App* train =
      root.add_subcommand("train",
                          "Train a model as a DeepSpeed-style config describes; metrics go to "
                          "<output_dir>/metrics.jsonl, the final model to <output_dir>/final");
  train
      ->add_option("--config,-c", options->config,
                   "DeepSpeed-style JSON config with a strata section")
      ->required();
  add_set_option(train, &options->overrides);
  train->add_flag("--quiet,-q", options->quiet, "No start-up notes or progress on stderr");
  train->add_option("--trace", options->trace,
                    "Write a Chrome/Perfetto trace (compute, copies, NVMe, Adam) to this file "
                    "(same as --set strata.trace_file=FILE)");
  registry.add(train, [options] { return run_train(*options); });
}

}  // namespace strata::cli
