// The `strata train` flags a Hugging Face Trainer user expects (--model, --data, --lr, --steps,
// --bf16, ...): each is a shorthand for one or more --set key paths, listed in one table here.
// `strata train --help`, `strata config check` and docs/trainer.md show the same table, and the
// loader applies the flags before the --set overrides (config.cc), so a flag's problems are
// reported with the config's, naming the flag.
#pragma once

#include <string_view>
#include <vector>

namespace strata::config {

enum class FlagKind {
  kText,    // a path or name, taken as it is
  kNumber,  // a number (2e-5)
  kWhole,   // a whole number >= 0
  kSwitch,  // no value: sets fixed values
};

// Only set this key when the config's scheduler has a warmup_max_lr (WarmupLR, WarmupDecayLR).
enum class FlagWhen { kAlways, kWarmupMaxLr };

struct FlagTarget {
  FlagTarget(std::string_view path_in, std::string_view fixed_in = {},
             FlagWhen when_in = FlagWhen::kAlways)
      : path(path_in), fixed(fixed_in), when(when_in) {}
  std::string_view path;
  std::string_view fixed;  // kSwitch: the JSON value set; otherwise empty (the flag's value)
  FlagWhen when = FlagWhen::kAlways;
};

struct TrainFlag {
  std::string_view names;  // CLI11 names, the first one canonical: "--lr,--learning-rate"
  std::string_view value_name;
  FlagKind kind;
  std::vector<FlagTarget> targets;
  std::string_view help;
};

// Every flag, in the order `strata train --help` lists them.
const std::vector<TrainFlag>& train_flags();

// The flag one of whose names is `name` ("--learning_rate"), or null.
const TrainFlag* find_train_flag(std::string_view name);

// The canonical name of a flag ("--lr").
std::string_view canonical_name(const TrainFlag& flag);

}  // namespace strata::config
