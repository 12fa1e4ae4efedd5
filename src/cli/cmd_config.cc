// `strata config check FILE`: parse, validate, fill in defaults, print the effective config, and
// end with the migration report: each key of the file and what Strata does with it.
#include <cstdio>

#include "cli/command.h"
#include "comm/launch.h"
#include "config/config.h"
#include "config/report.h"
#include "train/job.h"

namespace strata::cli {
namespace {

struct CheckOptions {
  std::string file;
  std::vector<std::string> overrides;
  std::vector<config::FlagValue> flags;
  std::int64_t world_size = 0;
  bool quiet = false;
};

int run_check(const CheckOptions& options) {
  config::LoadOptions load;
  if (options.world_size > 0) {
    load.world_size = options.world_size;
  } else {
    Result<std::int64_t> world_size = comm::world_size_from_environment();
    if (!world_size.is_ok()) return report_error(world_size.status());
    load.world_size = *world_size;
  }
  load.flags = options.flags;
  load.auto_precision = train::auto_precision_here;
  config::Checked checked = config::check_config_file(options.file, options.overrides, load);
  if (!options.quiet) {
    std::fputs(config::format_notes(checked.loaded).c_str(), stderr);
    std::fputs(config::format_autos(checked.loaded).c_str(), stderr);
    if (checked.status.is_ok()) {
      std::fprintf(stderr, "strata: note: world size %lld (batch sizes derived with it)\n",
                   static_cast<long long>(load.world_size));
    }
    if (!checked.loaded.keys.empty()) {
      std::fputs(config::format_key_report(checked.loaded, options.file).c_str(), stderr);
    }
  }
  if (!checked.status.is_ok()) return report_error(checked.status);
  std::fputs(config::to_json(checked.loaded.config).c_str(), stdout);
  return 0;
}

}  // namespace

void register_config(CLI::App& root, Registry& registry) {
  CLI::App* config = root.add_subcommand("config", "Work with DeepSpeed-style config files");
  config->require_subcommand(1);

  auto options = std::make_shared<CheckOptions>();
  CLI::App* check = config->add_subcommand(
      "check",
      "Parse and validate a config, fill in defaults, and print the effective configuration as "
      "JSON on stdout; on stderr: notes (\"auto\" resolved, keys with no effect, old names) and a "
      "table of each key of the file and whether Strata uses it, accepts it with no effect, or "
      "refuses it");
  check->add_option("FILE", options->file, "DeepSpeed-style JSON config (comments allowed)")
      ->required();
  add_set_option(check, &options->overrides);
  add_train_flags(check, &options->flags);
  check
      ->add_option("--world-size", options->world_size,
                   "Data-parallel ranks used to derive batch sizes (default: WORLD_SIZE and "
                   "similar launcher variables, else 1)")
      ->check(CLI::PositiveNumber);
  check->add_flag("--quiet,-q", options->quiet, "Print only the effective configuration");
  registry.add(check, [options] { return run_check(*options); });
}

}  // namespace strata::cli
