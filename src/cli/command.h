// How `strata` subcommands plug into the program: each src/cli/cmd_*.cc file (and src/bench/ for
// `strata bench`) has a register_* function that adds its CLI11 subcommand and the function that
// runs it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "config/config.h"

namespace strata::cli {

// Runs a parsed command and returns the process exit code (0 ok, 1 runtime, 2 usage/config).
using RunFn = std::function<int()>;

class Registry {
 public:
  // Remembers that `run` executes when `app` was the subcommand given on the command line.
  void add(CLI::App* app, RunFn run) { commands_.push_back({app, std::move(run)}); }

  // Runs the deepest parsed subcommand; returns -1 when none was parsed.
  int run_parsed() const;

 private:
  struct Entry {
    CLI::App* app;
    RunFn run;
  };
  std::vector<Entry> commands_;
};

// Prints "strata: <kind>: <context>: <message>" to stderr and returns the status's exit code.
int report_error(const Status& status);

// Parses repeated `--set KEY.PATH=VALUE` options, shared by every command that reads a config.
void add_set_option(CLI::App* app, std::vector<std::string>* overrides);

// Adds the `strata train` flags (config/flags.h: --model, --data, --lr, --bf16, ...), shorthands
// of --set key paths; the ones given are appended to `flags` for config::LoadOptions.
void add_train_flags(CLI::App* app, std::vector<config::FlagValue>* flags);

void register_config(CLI::App& root, Registry& registry);
void register_report(CLI::App& root, Registry& registry);
void register_estimate(CLI::App& root, Registry& registry);
// `strata bench`: src/bench/ (bench.h) registers the family.
void register_bench(CLI::App& root, Registry& registry);
void register_train(CLI::App& root, Registry& registry);
void register_eval(CLI::App& root, Registry& registry);
void register_convert(CLI::App& root, Registry& registry);

}  // namespace strata::cli
