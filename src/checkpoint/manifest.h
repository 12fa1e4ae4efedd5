// The manifest of a checkpoint, `trainer_state.json`: the trainer's counters, what the run was
// (seed, precision, model, world size, ZeRO stage), and for format 3 the identity and xxHash3-64
// digests of every state file (its size, its header, each tensor), the whole text protected by a
// checksum of its own. It is read as hostile input: at most kManifestBytesMax bytes, nested at
// most kManifestDepthMax deep, every field checked for its type and range, and the counters
// checked against each other (a step count that is not applied + skipped steps, a loss scale
// that is not a positive finite number, ...). Every problem is kCorrupt naming the file and the
// field, never an exception.
//
// Formats: "strata-checkpoint-3" (this one, written now), "strata-checkpoint-2" (rank files
// without digests: loads, unverified) and "strata-checkpoint-1" (one state.safetensors: loads,
// unverified).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "data/dataset.h"
#include "optim/loss_scaler.h"

namespace strata::checkpoint {

inline constexpr int kCheckpointVersion = 3;
inline constexpr std::uint64_t kManifestBytesMax = std::uint64_t{256} << 20;
inline constexpr int kManifestDepthMax = 8;
inline constexpr int kStateFilesMax = 1 << 16;
inline constexpr std::int64_t kCounterMax = std::int64_t{1} << 50;  // steps, tokens, samples
inline constexpr std::size_t kRecentLossesMax = 1000;

// "strata-checkpoint-<version>".
std::string checkpoint_format(int version);

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

// What one state file holds and its digests (format 3).
struct StateFileDigest {
  std::string name;  // "state-rank00001-of-00002.safetensors"
  std::uint64_t bytes = 0;
  std::uint64_t header_xxh3 = 0;
  std::map<std::string, std::uint64_t> tensor_xxh3;  // tensor name -> digest of its bytes
};

struct CheckpointManifest {
  int version = kCheckpointVersion;  // 1, 2 or 3
  TrainerCounters counters;
  std::uint64_t seed = 0;
  std::string precision;  // "fp32", "bf16" or "fp16"
  // config.json text of the model (hf_config_json, naming no dtype unless the source model's
  // config did).
  std::string model_json;
  // The Hugging Face directory the model came from ("" if none): `strata convert` copies its
  // tokenizer files and generation_config.json from there.
  std::string source_model;
  int world_size = 1;
  int zero_stage = 0;
  int state_files = 1;
  std::vector<StateFileDigest> files;  // format 3: one per state file, in rank order
};

// "state-rank00001-of-00002.safetensors".
std::string state_file_name(int rank, int state_files);

// The invariants of counters a trainer wrote: step = adam_step + skipped_steps, the schedule's
// iteration = adam_step - 1 (DeepSpeed's convention), the loss scaler updated once per step with
// a positive finite scale, and every count within [0, kCounterMax]. kCorrupt naming `source` and
// the counter at fault.
Status check_counters(const TrainerCounters& c, const std::string& source);

// The text of trainer_state.json for `m` (format 3, with its checksum).
std::string render_checkpoint_manifest(const CheckpointManifest& m);

// `text` with its checksum recomputed (when it has exactly one "checksum": "xxh3:<16 hex>"), for
// tests and fuzzing that change a manifest on purpose to reach the checks behind the checksum.
std::string seal_checkpoint_manifest(std::string_view text);

// Parses and checks the text of trainer_state.json; `source` names it in errors.
Result<CheckpointManifest> parse_checkpoint_manifest(std::string_view text,
                                                     const std::string& source);

}  // namespace strata::checkpoint
