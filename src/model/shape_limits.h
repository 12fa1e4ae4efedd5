// Sanity bounds on a model shape, checked once the shape is resolved and before anything is sized
// from it: a config.json from anywhere (n_layer 1e9, a 2^62 vocabulary, ...) must be refused
// with an error, not allocate gigabytes or overflow a size.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "model/model_spec.h"

namespace strata::model {

inline constexpr std::int64_t kLayersMax = 100000;
inline constexpr std::int64_t kHiddenMax = std::int64_t{1} << 20;
inline constexpr std::int64_t kVocabMax = std::int64_t{1} << 31;
inline constexpr std::int64_t kSeqLenMax = std::int64_t{1} << 24;
inline constexpr std::int64_t kIntermediateMax = std::int64_t{1} << 24;
inline constexpr std::int64_t kUnitParamsMax = std::int64_t{1} << 40;
inline constexpr std::int64_t kTotalParamsMax = std::int64_t{1} << 44;  // ~17.6 trillion

// Checks the dimensions a model config gives (strata.model or a config.json) before any
// arithmetic on them: each within the limits above. kConfig naming the key and the valid range.
Status check_model_dims(const config::ModelConfig& model);

// kConfig naming the strata.model key (with its config.json names) and the valid range when a
// dimension, a unit's parameter count or the total is beyond the limits above, or a real value
// (norm_eps, rope_theta) is not finite.
Status check_shape_limits(const ModelShape& shape);

}  // namespace strata::model
