// The run's folders: output_dir, the checkpoint root, the trace's folder and the NVMe paths,
// created with safe modes, and the guards around them — a fresh run never silently replaces
// another run's checkpoints in the same output_dir, and a resumed run has steps left to train
// with counters that fit its config. The checkpoint root's own rules (steps, `latest`, rotation)
// are in checkpoint/root.h; this is where the config meets them.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "common/dir_lock.h"
#include "common/status.h"
#include "config/config.h"

namespace strata::train {

// The checkpoint root a config writes to.
std::string checkpoint_root(const config::Config& config);

// Checks that a run may write into its output_dir and checkpoint root: one that holds another
// run (a `latest`, step directories, metrics.jsonl or final/) is refused (kConfig naming the
// directory and what to set) unless the run resumes from a checkpoint of that same root or
// strata.overwrite_output_dir is true. With overwrite, `remove` true (rank 0) removes the old
// run's checkpoints, `latest` and final/ first; `removed` lists what went.
Status claim_output_dir(const config::Config& config, bool remove,
                        std::vector<std::string>* removed);

// The locks that keep every other Strata process out of this run's folders for its life
// (common/dir_lock.h), taken after prepare_run_directories() and before anything else is written
// or checked: rank 0 locks output_dir and the checkpoint root (kDirLockName in each); every other
// rank locks its own file in the checkpoint root (dir_lock_name(rank)), where its checkpoint
// shards go. A lock another process holds is kConfig naming the key, the holder (pid, host,
// start time, command line) and what to do.
Result<std::vector<DirLock>> lock_run_directories(const config::Config& config, int rank);

// The lock on the checkpoint root that `resume_dir` (a checkpoint) belongs to, while this run reads
// it: nothing (an empty lock) when that root is this run's own (locked already), else the lock
// rank `rank` would hold there, so that a checkpoint a live run is writing (and rotating) is
// never read. kConfig naming strata.resume_from and the holder when a live run holds it.
Result<DirLock> lock_resume_root(const config::Config& config, const std::string& resume_dir,
                                 int rank);

// Whether a run configured by `config` can continue from `counters`, read from the checkpoint
// `dir`: steps are left to train, and the loss scaler fits the config (the static scale it
// names, or a dynamic scale not below min_loss_scale). kConfig naming the key to change, or
// kCorrupt naming the file.
Status check_resumable(const checkpoint::TrainerCounters& counters, const config::Config& config,
                       const std::string& dir);

// Creates what a run writes into and is missing: output_dir, the checkpoint root, the trace
// file's folder and every nvme_path the offload settings use; new folders get mode 0700 (swap and
// traces are nobody else's business). Refuses what is unsafe: a path that exists but is not a
// directory, or an nvme_path that others may write to without the sticky bit (they could replace
// the swap files). kConfig naming the key and path.
Status prepare_run_directories(const config::Config& config);

// The NVMe part of prepare_run_directories, for a caller with swap files but no run (the Python
// optimizer): creates each nvme_path the offload settings use (0700) and refuses one that is not
// a directory, or that every user may write to without the sticky bit. kConfig naming key, path.
Status prepare_nvme_paths(const config::Config& config);

// The same checks for one list of swap folders, whatever the config's offload devices say (the
// Python parameter store's zero_optimization.offload_param.nvme_path); errors name `key`.
Status prepare_nvme_folders(const std::vector<std::string>& paths, const char* key);

}  // namespace strata::train
