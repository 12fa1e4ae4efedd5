// The loader's steps after the reader (config.cc runs them): "auto" resolved consistently, the
// checks that span several keys (precision, offload vs stage, NVMe paths, the batch-size
// arithmetic and its bounds), DeepSpeed sections mapped onto Strata's own keys, and what
// `strata train` needs named. Internal to src/config.
#pragma once

#include <string>

#include "config/config.h"
#include "config/json_source.h"
#include "config/reader.h"

namespace strata::config {

struct LoadContext {
  const JsonSource& source;
  ReaderOutput& out;
  Loaded& loaded;
  const LoadOptions& options;

  // True when a value was given at `path` (file or override).
  bool given(const std::string& path) const;
  // Adds an error at `path` unless one of `paths` already has one (a bad value makes the checks
  // built on it meaningless).
  void error(const std::string& path, const std::string& message);
  bool any_invalid(std::initializer_list<const char*> paths) const;
  void note(const std::string& path, const std::string& message,
            Severity severity = Severity::kNote);
  // Records an "auto" resolved to `value` for the migration report and the notes; `loud` ones
  // shape the job and are printed together before it starts.
  void resolved(const std::string& path, const std::string& value, const std::string& reason,
                bool loud);
};

// Fills in every "auto" except the batch sizes (derived in validate).
void resolve_autos(LoadContext& ctx);

// Cross-key checks, DeepSpeed sections mapped onto strata.*, batch derivation and bounds.
void validate(LoadContext& ctx);

// strata train (Purpose::kTrain): the model and the data must be named (a config without them
// would train the default GPT-2 on the synthetic source): an error listing --model and --data.
// Other purposes get a note.
void check_named_model_and_data(LoadContext& ctx);

}  // namespace strata::config
