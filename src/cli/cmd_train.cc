// `strata train --config FILE [--model DIR --data FILE --lr LR --steps N --bf16 ...]
// [--set KEY.PATH=VALUE ...]`: trains a model as the config and the flags say and prints the
// summary as one JSON line on stdout (start-up notes and progress go to stderr). The flags are
// shorthands of --set key paths (config/flags.h); a config's problems and the flags' are
// reported together. SIGINT or SIGTERM ends the run after the step in flight, with a
// checkpoint, and exits 128 + the signal's number; a second one stops at once.
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include "cli/command.h"
#include "comm/world.h"
#include "config/config.h"
#include "config/flags.h"
#include "train/job.h"
#include "train/metrics.h"
#include "train/stop_signal.h"

namespace strata::cli {
namespace {

struct TrainOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::vector<config::FlagValue> flags;
  bool quiet = false;
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
  // From here a signal asks for a clean stop (stop_signal.h).
  const Status handlers = train::install_stop_handlers();
  if (!handlers.is_ok()) return report_error(handlers);
  train::JobOptions job;
  job.config_file = options.config;
  job.overrides = options.overrides;
  job.flags = options.flags;
  job.quiet = options.quiet;
  job.progress_tty = ::isatty(STDERR_FILENO) == 1;
  bool started = false;
  Result<train::JobOutcome> outcome = train::run_job(job, &started);
  if (!outcome.is_ok()) {
    const int code = report_error(outcome.status());
    // On several ranks, a rank that fails ends the others at once (MPI_Abort) instead of leaving
    // them to strata.comm_timeout_s.
    if (started) comm::abort_world_at_exit(code);
    return code;
  }
  const train::JobOutcome& o = *outcome;
  if (o.first_rank) print_summary(o.summary, o.output_dir);
  if (o.stopped == 0) return 0;
  if (o.first_rank) {
    std::fprintf(stderr,
                 "strata: stopped by %s after step %lld; checkpoint %s; continue with the same "
                 "command and --resume-from %s\n",
                 o.stopped > 0 ? train::signal_name(o.stopped) : "another rank's signal",
                 static_cast<long long>(o.step), o.last_checkpoint.c_str(),
                 o.last_checkpoint.c_str());
  }
  return 128 + (o.stopped > 0 ? o.stopped : SIGTERM);
}

}  // namespace

void add_train_flags(CLI::App* app, std::vector<config::FlagValue>* flags) {
  const std::string group = "Trainer flags (shorthands of --set; docs/trainer.md)";
  for (const config::TrainFlag& flag : config::train_flags()) {
    const std::string names(flag.names);
    const std::string name(config::canonical_name(flag));
    const std::string help(flag.help);
    if (flag.kind == config::FlagKind::kSwitch) {
      app->add_flag_callback(
             names,
             [flags, name] {
               flags->push_back({name, ""});
             },
             help)
          ->group(group);
    } else {
      app->add_option_function<std::string>(
             names,
             [flags, name](const std::string& value) {
               flags->push_back({name, value});
             },
             help)
          ->type_name(std::string(flag.value_name))
          ->group(group);
    }
  }
}

void register_train(CLI::App& root, Registry& registry) {
  auto options = std::make_shared<TrainOptions>();
  CLI::App* train =
      root.add_subcommand("train",
                          "Train a model as a DeepSpeed-style config and the flags describe; "
                          "metrics go to <output_dir>/metrics.jsonl, the final model to "
                          "<output_dir>/final");
  train
      ->add_option("--config,-c", options->config,
                   "DeepSpeed-style JSON config (the one you use with DeepSpeed, with or without "
                   "a strata section)")
      ->required();
  add_train_flags(train, &options->flags);
  add_set_option(train, &options->overrides);
  train->add_flag("--quiet,-q", options->quiet, "No start-up notes or progress on stderr");
  registry.add(train, [options] { return run_train(*options); });
}

}  // namespace strata::cli
