// The checkpoint root of a run (`<output_dir>/checkpoints` unless strata.checkpoint_dir says):
// its `latest` file, the step directories in it, their rotation (keep the newest N), and the
// guards around them — a fresh run never silently replaces another run's checkpoints in the same
// output_dir, and a resumed run has steps left to train with counters that fit its config.
// Nothing here follows a path out of the root or throws: every filesystem call reports errors
// as values naming the path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "config/config.h"
#include "train/checkpoint_manifest.h"

namespace strata::train {

// The checkpoint root a config writes to.
std::string checkpoint_root(const config::Config& config);

// The step of a directory name "step_00000042" (8 or more digits), or -1 for any other name
// ("step_00000042.tmp" included).
std::int64_t checkpoint_step_of(const std::string& name);

// The complete checkpoints (step directories holding trainer_state.json) under `root`, by step
// ascending. A missing root is an empty list.
Result<std::vector<std::int64_t>> list_checkpoints(const std::string& root);

// After the checkpoint of `current_step` was committed: removes the complete checkpoints older
// than the newest `keep_last` (0 = keep all) and torn ones (step_N.tmp) older than the current
// step. Never removes the current step, one newer than it, or anything not named like a step
// directory. Problems are logged as warnings (a checkpoint that could not be removed does not
// stop training).
Status rotate_checkpoints(const std::string& root, int keep_last, std::int64_t current_step);

// Checks that a run may write into its output_dir and checkpoint root: one that holds another
// run (a `latest`, step directories, metrics.jsonl or final/) is refused (kConfig naming the
// directory and what to set) unless the run resumes from a checkpoint of that same root or
// strata.overwrite_output_dir is true. With overwrite, `remove` true (rank 0) removes the old
// run's checkpoints, `latest` and final/ first; `removed` lists what went.
Status claim_output_dir(const config::Config& config, bool remove,
                        std::vector<std::string>* removed);

// Whether a run configured by `config` can continue from `counters`, read from the checkpoint
// `dir`: steps are left to train, and the loss scaler fits the config (the static scale it
// names, or a dynamic scale not below min_loss_scale). kConfig naming the key to change, or
// kCorrupt naming the file.
Status check_resumable(const TrainerCounters& counters, const config::Config& config,
                       const std::string& dir);

// A note for a run resuming from `step` when `root` holds newer checkpoints (a run rewound on
// purpose): they are replaced as the run reaches their steps. Empty when there are none.
std::string newer_checkpoints_note(const std::string& root, std::int64_t step);

// Creates what a run writes into and is missing: output_dir, the checkpoint root, the trace
// file's folder and every nvme_path the offload settings use; new folders get mode 0700 (swap and
// traces are nobody else's business). Refuses what is unsafe: a path that exists but is not a
// directory, or an nvme_path that others may write to without the sticky bit (they could replace
// the swap files). kConfig naming the key and path.
Status prepare_run_directories(const config::Config& config);

}  // namespace strata::train
