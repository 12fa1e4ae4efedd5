// Reading a checkpoint (format in checkpoint.h) without a training state: its metadata and any
// range of any unit's master or moments, assembled from the rank files that cover it. Used by
// read_checkpoint (resume at any world size) and `strata convert` (consolidation into a Hugging
// Face directory). Every file is validated when opened (the manifest's checksum and fields; each
// rank file's size, header digest and identity); each tensor's digest is checked before its
// first bytes are used, and every value read must be finite (exp_avg_sq also >= 0). Every error
// names the file and tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"
#include "common/status.h"
#include "kernels/cpu/dtype.h"
#include "model/layout.h"
#include "model/model_spec.h"
#include "offload/plan.h"

namespace strata::checkpoint {

class CheckpointReader {
 public:
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&& other) noexcept;
  CheckpointReader& operator=(CheckpointReader&& other) noexcept;

  // Opens the step directory `dir` (trainer_state.json and every state file it lists; their
  // headers and metadata are checked, their tensors are mapped, not read). kNotFound naming a
  // missing file, kCorrupt naming a malformed, damaged or foreign (another step's) one.
  static Result<CheckpointReader> open(const std::string& dir);

  const std::string& dir() const;
  // The model as saved: config.json text (hf_config_json of the run's shape, naming no dtype
  // unless the source model's config did).
  const std::string& model_json() const;
  // That text parsed back into a shape (kCorrupt when it does not round-trip).
  Result<model::ModelShape> shape() const;
  const std::string& precision() const;
  std::uint64_t seed() const;
  // Ranks of the run that wrote it, its ZeRO stage, and how many rank files it has (1 for the
  // old single-file format).
  int world_size() const;
  int zero_stage() const;
  int state_files() const;
  // The format version (1, 2 or 3) and whether the files carry digests that are checked (3).
  int format_version() const;
  bool verified() const;
  // The counters of trainer_state.json (checked against each other when opened).
  Result<TrainerCounters> counters() const;

  // dst[0 .. numel) = elements [begin, begin + numel) of `unit`'s `kind` (master, exp_avg or
  // exp_avg_sq), from whichever rank files cover them. Elements no file covers read as zero when
  // they are padding (>= unit.numel); a real one is kCorrupt naming the unit, kind and range. A
  // tensor failing its digest, or a value that is not finite (or a negative exp_avg_sq), is
  // kCorrupt naming the file, tensor and element.
  // Any stored form is decoded (F32, BF16, 8-bit codes with their absmax).
  Status read(const model::UnitLayout& unit, offload::SlotKind kind, std::int64_t begin,
              std::int64_t numel, float* dst) const;
  // The same elements as `plan` stores `kind` (slot_codec.h), undecoded: values (numel x
  // value_bytes) and, for 8-bit moments, absmax (numel / block). false, with nothing read, when
  // some file holds them in another form (another dtype or block size): read() them instead.
  // The same checks and errors as read().
  Result<bool> read_stored(const model::UnitLayout& unit, offload::SlotKind kind,
                           std::int64_t begin, std::int64_t numel, const offload::TierPlan& plan,
                           void* values, float* absmax) const;

 private:
  struct Impl;
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Writes the checkpoint's fp32 masters, every rank's shard of every unit assembled, as a Hugging
// Face directory `out_dir` (config.json + model.safetensors, tensors in `dtype`): what `strata
// convert` and DeepSpeed's zero_to_fp32.py do. One unit is in memory at a time. The output is
// what save_hf_model writes for a single-rank state holding the same masters.
Status consolidate_checkpoint(const CheckpointReader& reader, const std::string& out_dir,
                              kernels::DType dtype);

}  // namespace strata::checkpoint
