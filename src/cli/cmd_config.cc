// `strata config check FILE`: parse, validate, fill in defaults, print the effective config.
#include <cstdio>

#include "cli/command.h"
#include "comm/launch.h"
#include "config/config.h"

namespace strata::cli {
namespace {

struct CheckOptions {
  std::string file;
  std::vector<std::string> overrides;
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
  auto loaded = config::load_config_file(options.file, options.overrides, load);
  if (!loaded.is_ok()) return report_error(loaded.status());
  if (!options.quiet) {
    for (const config::Note& note : loaded->notes) {
      std::fprintf(stderr, "strata: note: %s: %s\n", note.path.c_str(), note.message.c_str());
    }
    std::fprintf(stderr, "strata: note: world size %lld (batch sizes derived with it)\n",
                 static_cast<long long>(load.world_size));
  }
  std::fputs(config::to_json(loaded->config).c_str(), stdout);
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
      "JSON (notes about resolved \"auto\" values and ignored keys go to stderr)");
  check->add_option("FILE", options->file, "DeepSpeed-style JSON config (comments allowed)")
      ->required();
  add_set_option(check, &options->overrides);
  check
      ->add_option("--world-size", options->world_size,
                   "Data-parallel ranks used to derive batch sizes (default: WORLD_SIZE and "
                   "similar launcher variables, else 1)")
      ->check(CLI::PositiveNumber);
  check->add_flag("--quiet,-q", options->quiet, "Print only the effective configuration");
  registry.add(check, [options] { return run_check(*options); });
}

}  // namespace strata::cli
