// Checkpoints of the in-memory trainer: everything a resumed run needs to continue
// bit-identically to one that never stopped.
//   <checkpoint_dir>/step_00000042/state.safetensors   per unit: master, exp_avg, exp_avg_sq
//                                                      (fp32, the unit's flat padded layout)
//   <checkpoint_dir>/step_00000042/trainer_state.json  counters, scheduler, loss scaler, data
//                                                      position, seed, model shape, precision
//   <checkpoint_dir>/latest                            the name of the newest complete step dir
// A checkpoint is written into step_N.tmp and renamed into place, and `latest` is replaced
// atomically afterwards, so a crash leaves the previous checkpoint intact. The 16-bit device
// parameters are not stored: they are the masters rounded, recomputed on load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "data/dataset.h"
#include "model/model_spec.h"
#include "optim/loss_scaler.h"
#include "train/train_state.h"

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

// Writes a checkpoint of `state` and `counters` under `root`; returns its directory.
Result<std::string> write_checkpoint(const std::string& root, const TrainerCounters& counters,
                                     TrainState& state, const model::ModelShape& shape,
                                     const std::string& precision, std::uint64_t seed);

// The checkpoint directory `path` means: itself when it holds trainer_state.json, else the one
// its `latest` file names. kNotFound when neither.
Result<std::string> find_checkpoint(const std::string& path);

// Loads a checkpoint into `state` (masters and moments; call upload_params after) and returns
// its counters. Errors when the model shape or precision differ from the run's.
Result<TrainerCounters> read_checkpoint(const std::string& dir, TrainState& state,
                                        const model::ModelShape& shape,
                                        const std::string& precision, std::uint64_t seed);

}  // namespace strata::train
