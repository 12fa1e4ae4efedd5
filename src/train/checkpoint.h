// Checkpoints of the trainer: everything a resumed run needs to continue bit-identically to one
// that never stopped, written by every rank of a data-parallel run and readable at any world size.
//
// Layout (format "strata-checkpoint-2"):
//   <root>/step_00000042/state-rank00000-of-00002.safetensors  rank 0's shard of every unit
//   <root>/step_00000042/state-rank00001-of-00002.safetensors  rank 1's shard
//   <root>/step_00000042/trainer_state.json   counters, scheduler, loss scaler, data position,
//                                             seed, model shape, precision, world_size,
//                                             zero_stage, state_files (written by rank 0)
//   <root>/latest                             the name of the newest complete step dir
// A rank file holds, per unit, `<unit>.master`, `<unit>.exp_avg` and `<unit>.exp_avg_sq` (fp32,
// shape {shard_numel}): elements [shard_begin, shard_begin + shard_numel) of the unit's flat
// padded buffer. Its safetensors metadata says which: "format", "rank", "state_files",
// "world_size", and per unit "<unit>.shard_begin" and "<unit>.padded_numel". With ZeRO stage >= 1
// every rank writes its shard (state_files = world size); at stage 0 every rank holds whole units,
// so only rank 0 writes (state_files = 1). A world-1 run writes state-rank00000-of-00001.
// Format "strata-checkpoint-1" (one state.safetensors of whole units) still loads.
//
// Readers map by element index within a unit, so a run resumes at any world size: elements no
// file covers must be padding (at or beyond the unit's numel) and read as zero; a real element
// that no file covers is an error naming the unit, kind and range.
//
// Writing is three phases so that no rank sees a half-written checkpoint:
//   1. rank 0: prepare_checkpoint()  clears a stale step_N.tmp and creates it;
//   -- barrier --
//   2. every rank: write_checkpoint_shard()  its rank file, atomically (file.tmp, rename);
//   -- barrier --
//   3. rank 0: commit_checkpoint()  checks every rank file, writes trainer_state.json, renames
//      step_N.tmp to step_N and replaces `latest` atomically.
// A crash anywhere leaves the previous checkpoint and `latest` intact. The checkpoint directory
// must be one shared file system for all ranks (multi-node: NFS, Lustre, ...). The 16-bit device
// parameters are not stored: they are the masters rounded, recomputed on load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "data/dataset.h"
#include "model/model_spec.h"
#include "offload/offload_store.h"
#include "optim/loss_scaler.h"

namespace strata::comm {
class Comm;
}

namespace strata::train {

struct TrainerCounters {
  std::int64_t step = 0;                  // optimizer steps taken, applied or skipped
  std::int64_t adam_step = 0;             // applied steps (Adam's t)
  std::int64_t scheduler_iteration = -1;  // the lr schedule's last_batch_iteration
  std::int64_t skipped_steps = 0;
  std::int64_t tokens_seen = 0;
  optim::LossScalerState scaler;
  data::DataPosition data;
  std::vector<double> recent_losses;  // for the summary's final_loss
};

// Who writes a checkpoint: this rank, the world size and the ZeRO stage (0 at world size 1).
struct CheckpointRank {
  int rank = 0;
  int world = 1;
  int zero_stage = 0;
  // Rank files of the checkpoint: world when the optimizer state is partitioned, else 1.
  int state_files() const { return zero_stage >= 1 ? world : 1; }
  // Whether this rank writes a file.
  bool writes() const { return rank < state_files(); }
};

// "state-rank00001-of-00002.safetensors".
std::string state_file_name(int rank, int state_files);
// "<root>/step_00000042": where the checkpoint of `step` goes.
std::string checkpoint_dir(const std::string& root, std::int64_t step);

// Phase 1, rank 0 only: removes a stale `<checkpoint_dir>.tmp` and creates it empty; returns it.
Result<std::string> prepare_checkpoint(const std::string& root, std::int64_t step);

// Phase 2, every rank (after phase 1 completed on rank 0): finishes the optimizer step in flight
// and writes this rank's shard of every unit into `<checkpoint_dir(root, step)>.tmp` (nothing
// when !who.writes()). `state` holds exactly `who.rank`'s shard (its plan was made for that rank).
Status write_checkpoint_shard(const std::string& root, std::int64_t step,
                              offload::OffloadStore& state, const CheckpointRank& who);

// Phase 3, rank 0 only (after phase 2 completed on every rank): checks that every rank file is
// there and whole, writes trainer_state.json, renames the directory into place and updates
// `latest`; returns the checkpoint's directory. Errors name the missing or corrupt rank file.
Result<std::string> commit_checkpoint(const std::string& root, const TrainerCounters& counters,
                                      const model::ModelShape& shape, const std::string& precision,
                                      std::uint64_t seed, const CheckpointRank& who);

// The three phases at world size 1 (no Comm needed); returns the checkpoint's directory.
Result<std::string> write_checkpoint(const std::string& root, const TrainerCounters& counters,
                                     offload::OffloadStore& state, const model::ModelShape& shape,
                                     const std::string& precision, std::uint64_t seed);

// The three phases on every rank of `comm`, with its collectives between them (each phase's
// outcome is exchanged, so one rank's failure fails every rank at once, naming that rank, instead
// of leaving the others in a barrier). Every rank returns the same result: the checkpoint's
// directory, or the first failure. Call on every rank with the same arguments but `state`.
Result<std::string> write_checkpoint(const std::string& root, const TrainerCounters& counters,
                                     offload::OffloadStore& state, const model::ModelShape& shape,
                                     const std::string& precision, std::uint64_t seed,
                                     int zero_stage, comm::Comm& comm);

// The checkpoint directory `path` means: itself when it holds trainer_state.json, else the one
// its `latest` file names. kNotFound when neither.
Result<std::string> find_checkpoint(const std::string& path);

// Loads a checkpoint taken at any world size into `state` (this rank's shard of the masters and
// moments, as its plan says; call refresh after) and returns its counters. Errors when the model
// shape, precision or seed differ from the run's, and name any missing or corrupt rank file.
Result<TrainerCounters> read_checkpoint(const std::string& dir, offload::OffloadStore& state,
                                        const model::ModelShape& shape,
                                        const std::string& precision, std::uint64_t seed);

}  // namespace strata::train
