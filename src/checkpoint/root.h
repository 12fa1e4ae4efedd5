// A checkpoint root (a run's `<output_dir>/checkpoints` unless strata.checkpoint_dir says): its
// `latest` file, the step directories in it and their rotation (keep the newest N). The guards
// of a run's folders (train/run_directories.h) are built on these. Nothing here follows a path
// out of the root or throws: every filesystem call reports errors as values naming the path.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "common/status.h"

namespace strata::checkpoint {

// lstat: false (and no error) when `path` does not exist, an error naming it for anything else.
Result<bool> path_exists(const std::string& path, struct stat* st = nullptr);

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

// A note for a run resuming from `step` when `root` holds newer checkpoints (a run rewound on
// purpose): they are replaced as the run reaches their steps. Empty when there are none.
std::string newer_checkpoints_note(const std::string& root, std::int64_t step);

}  // namespace strata::checkpoint
