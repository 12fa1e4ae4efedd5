// Training and validation samples for the trainer: windows of seq_len + 1 tokens, the first
// seq_len the inputs and the last seq_len the targets. Three sources:
//   - token files (data/token_file.h) and text files: non-overlapping windows (stride seq_len),
//     or with strata.data.packing whole documents packed into windows (data/windows.h); a mask
//     file beside a token file (data/token_mask.h) marks targets that carry no loss (-1); the
//     last val_fraction of the windows (of the documents, packed), or a separate val_path file,
//     is the validation split; the training windows are visited in a seeded random order, a
//     fresh permutation per epoch;
//   - synthetic: a seeded Markov chain whose per-token entropy is exactly ln(branching)
//     (data/markov.h), an endless stream.
// The position (epoch, sample) is what a checkpoint saves; seek() restores it exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "config/config.h"
#include "data/batch.h"

namespace strata::data {

struct DataPosition {
  std::int64_t epoch = 0;
  std::int64_t sample = 0;  // samples consumed in this epoch
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Fills `batch` (batch.rows rows of seq_len, sized by the caller) with the next training
  // samples, sets its `counted` and `packed`, and advances the position. Token ids outside
  // [0, vocab) are kInvalidArgument naming the file and byte offset.
  virtual Status next_train(Batch& batch) = 0;
  // Validation batch `index` (deterministic; wraps around the validation split).
  virtual Status val_batch(std::int64_t index, Batch& batch) = 0;
  // Samples in one epoch of the training split (0 = endless).
  virtual std::int64_t train_samples() const = 0;
  virtual DataPosition position() const = 0;
  // Moves to a saved position; kInvalidArgument when it cannot exist for this data.
  virtual Status seek(const DataPosition& position) = 0;
  // The lowest achievable mean loss in nats, when known (the synthetic source).
  virtual std::optional<double> entropy_floor() const = 0;
  // One line: source, file, format, tokens, split.
  virtual std::string describe() const = 0;
  // What the user should hear about the data once (documents cut by packing), one per line.
  virtual std::vector<std::string> warnings() const { return {}; }
};

// The dataset the config asks for, for a model with `vocab_size` tokens; `seed` seeds shuffling
// and the synthetic chain. Errors name the file or key.
Result<std::unique_ptr<Dataset>> make_dataset(const config::DataConfig& data,
                                              std::int64_t vocab_size, std::uint64_t seed);

}  // namespace strata::data
