// A micro-batch as the model runner takes it, and the one call that hands it over.
//
// targets[i] = -1 means no loss at position i (a prompt token, padding, or the first token of the
// next packed document). positions[i] is token i's position within its own document: with
// packing they restart at 0 where a document starts, and attention stays within the document;
// without packing they are 0..seq_len-1 in every row and are not passed on (the runner's default,
// bit-identical to runs before masks existed).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "model/runner.h"

namespace strata::data {

struct Batch {
  std::int64_t rows = 0;
  std::int64_t seq_len = 0;
  std::vector<std::int32_t> inputs;     // (rows, seq_len) token ids
  std::vector<std::int32_t> targets;    // (rows, seq_len) the next token, or -1: no loss
  std::vector<std::int32_t> positions;  // (rows, seq_len) position within the document
  bool packed = false;                  // positions restart at document starts
  std::int64_t counted = 0;             // targets that are not -1

  void resize(std::int64_t batch_rows, std::int64_t tokens_per_row) {
    rows = batch_rows;
    seq_len = tokens_per_row;
    const auto n = static_cast<std::size_t>(rows * seq_len);
    inputs.assign(n, 0);
    targets.assign(n, 0);
    positions.assign(n, 0);
  }
  std::int64_t size() const { return rows * seq_len; }
  // Every target counts and positions are the plain 0..seq_len-1: what the runner did before
  // masks and packing, which the trainer keeps bit-identical.
  bool plain() const { return !packed && counted == size(); }
  // Recounts `counted` from the targets.
  void count_targets() {
    counted = 0;
    for (std::int32_t t : targets)
      counted += t >= 0 ? 1 : 0;
  }
};

// Whether the runner takes masked targets (-1) and packed positions:
// ModelRunner::set_batch(inputs, targets, positions), issue 15 part A. Until it does, batches
// that need either are refused with an error rather than trained on wrongly.
template <typename Runner>
inline constexpr bool kRunnerTakesMasks = requires(Runner& r, const std::int32_t* p) {
  r.set_batch(p, p, p);
};

// Copies `batch` into the runner. Errors: kInvalidArgument for ids outside the vocabulary (from
// the runner), kUnavailable when the batch needs masks or packing the runner cannot do.
template <typename Runner>
Status feed_batch(Runner& runner, const Batch& batch) {
  if constexpr (kRunnerTakesMasks<Runner>) {
    return runner.set_batch(batch.inputs.data(), batch.targets.data(),
                            batch.packed ? batch.positions.data() : nullptr);
  } else {
    if (!batch.plain()) {
      return Status(ErrorCode::kUnavailable,
                    "this build's model runner cannot mask targets or pack documents (it needs "
                    "ModelRunner::set_batch(inputs, targets, positions)); set "
                    "strata.data.packing false and use a token file without a mask file",
                    "strata.data");
    }
    return runner.set_batch(batch.inputs.data(), batch.targets.data());
  }
}

}  // namespace strata::data
