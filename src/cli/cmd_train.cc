// `strata train --config FILE [--set KEY.PATH=VALUE ...] [--trace FILE] [--overwrite]`: trains a
// model as the config says and prints the summary as one JSON line on stdout (start-up notes and
// progress go to stderr). SIGINT or SIGTERM ends the run after the step in flight, with a
// checkpoint, and exits 128 + the signal's number; a second one stops at once.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>

#include "cli/command.h"
#include "comm/world.h"
#include "config/config.h"
#include "train/stop_signal.h"
#include "train/trainer.h"

namespace strata::cli {
namespace {

struct TrainOptions {
  std::string config;
  std::vector<std::string> overrides;
  bool quiet = false;
  bool overwrite = false;
  std::string trace;
};

// Prints the summary line; a closed stdout loses only this copy of it (metrics.jsonl has it).
void print_summary(const Json::Value& summary, const std::string& output_dir) {
  const std::string line = train::MetricsLog::to_line(summary) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), stdout) != line.size() || std::fflush(stdout) != 0) {
    std::fprintf(stderr,
                 "strata: warning: cannot print the summary on standard output (closed?); it is "
                 "the last line of %s/metrics.jsonl\n",
                 output_dir.c_str());
  }
}

int run_train(const TrainOptions& options) {
  config::LoadOptions load;
  Result<std::int64_t> world_size = config::world_size_from_environment();
  if (!world_size.is_ok()) return report_error(world_size.status());
  load.world_size = *world_size;
  std::vector<std::string> overrides = options.overrides;
  if (!options.trace.empty()) overrides.push_back("strata.trace_file=" + options.trace);
  if (options.overwrite) overrides.push_back("strata.overwrite_output_dir=true");
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
  // From here a signal asks for a clean stop (stop_signal.h).
  const Status handlers = train::install_stop_handlers();
  if (!handlers.is_ok()) return report_error(handlers);
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
  const std::string& output_dir = loaded->config.strata.output_dir;
  if (first_rank) print_summary((*trainer)->summary(), output_dir);
  const int stopped = (*trainer)->stopped();
  if (stopped == 0) return 0;
  if (first_rank) {
    const std::string& checkpoint = (*trainer)->last_checkpoint();
    std::fprintf(stderr,
                 "strata: stopped by %s after step %lld; checkpoint %s; continue with the same "
                 "command and --set strata.resume_from=%s\n",
                 stopped > 0 ? train::signal_name(stopped) : "another rank's signal",
                 static_cast<long long>((*trainer)->counters().step), checkpoint.c_str(),
                 checkpoint.c_str());
  }
  return 128 + (stopped > 0 ? stopped : SIGTERM);
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
  train->add_flag("--overwrite", options->overwrite,
                  "Let a fresh run replace another run in output_dir (its checkpoints, metrics and "
                  "final model); same as --set strata.overwrite_output_dir=true");
  train->add_option("--trace", options->trace,
                    "Write a Chrome/Perfetto trace (compute, copies, NVMe, Adam) to this file "
                    "(same as --set strata.trace_file=FILE)");
  registry.add(train, [options] { return run_train(*options); });
}

}  // namespace strata::cli
