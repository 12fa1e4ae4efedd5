// The `strata` program: parses the command line and dispatches to a subcommand.
#include <csignal>
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "strata/build_info.h"

namespace strata::cli {

int Registry::run_parsed() const {
  // The deepest parsed subcommand wins: `strata bench adam` runs adam, not bench.
  const Entry* chosen = nullptr;
  int chosen_depth = -1;
  for (const Entry& entry : commands_) {
    if (!entry.app->parsed()) continue;
    int depth = 0;
    for (const CLI::App* p = entry.app->get_parent(); p != nullptr; p = p->get_parent())
      ++depth;
    if (depth > chosen_depth) {
      chosen = &entry;
      chosen_depth = depth;
    }
  }
  return chosen == nullptr ? -1 : chosen->run();
}

int report_error(const Status& status) {
  std::fprintf(stderr, "strata: %s: %s\n", error_code_name(status.code()),
               status.to_string().c_str());
  return status.exit_code();
}

void add_set_option(CLI::App* app, std::vector<std::string>* overrides) {
  app->add_option("--set", *overrides,
                  "Override a config key by its dotted path, e.g. "
                  "--set zero_optimization.stage=3 (repeatable; VALUE is JSON or a bare string)")
      ->take_all()
      ->allow_extra_args(false)
      ->type_name("KEY.PATH=VALUE");
}

}  // namespace strata::cli

int main(int argc, char** argv) {
  using namespace strata::cli;
  CLI::App app{"strata: train transformer models whose state is larger than GPU memory"};
  app.name("strata");
  app.set_version_flag("--version", fmt::format("strata {} ({})", strata::build::kVersion,
                                                strata::build::kGitCommit));
  app.require_subcommand(1);
  app.fallthrough(false);

  Registry registry;
  register_config(app, registry);
  register_report(app, registry);
  register_estimate(app, registry);
  register_bench(app, registry);
  register_train(app, registry);
  register_eval(app, registry);
  register_convert(app, registry);

  // CLI11 reports an unknown command as "a subcommand is required"; name it instead.
  if (argc > 1 && argv[1][0] != '-') {
    std::string valid;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      valid += (valid.empty() ? "" : ", ") + sub->get_name();
      known = known || sub->check_name(argv[1]);
    }
    if (!known) {
      std::fprintf(stderr, "strata: usage error: unknown command '%s'; valid commands: %s\n",
                   argv[1], valid.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;  // usage error
  }
  // A closed stdout (`strata ... | head`) is an error on the write, which the commands handle,
  // not a SIGPIPE that ends a run that has done its work.
  std::signal(SIGPIPE, SIG_IGN);
  int rc = 0;
  try {
    rc = registry.run_parsed();
  } catch (const std::exception& e) {
    // No exception should get here (module boundaries return Status); if one does, it is a bug,
    // and it is named instead of aborting.
    std::fprintf(stderr,
                 "strata: internal error: uncaught exception: %s (a bug; please report it)\n",
                 e.what());
    return 1;
  }
  if (rc < 0) {
    std::fprintf(stderr, "strata: usage error: no command given; see strata --help\n");
    return 2;
  }
  return rc;
}
