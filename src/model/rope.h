// RoPE's inverse frequencies and attention scaling for every rope_type Strata implements
// (config/model_arch.h), computed the way transformers' modeling_rope_utils computes them: in
// float32 for a float model (T = float), so the tables match to the last bit or two, and in double
// for the double-precision gradient checks.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_spec.h"

namespace strata::model {

// inv_freq (rotary_dim(shape) / 2 values). `long_factors` picks LongRoPE's long_factor (used when
// a batch's largest position + 1 exceeds original_max_position_embeddings); other types ignore it.
template <typename T>
std::vector<T> rope_inv_freq(const ModelShape& shape, bool long_factors);

// What cos and sin are multiplied by: YaRN's and LongRoPE's attention factor, else 1.
double rope_attention_scaling(const ModelShape& shape);

// True when the model's RoPE depends on the batch's longest position (LongRoPE with sequences
// longer than original_max_position_embeddings): then a runner keeps both tables.
bool rope_needs_long_tables(const ModelShape& shape, std::int64_t seq_len);

// For LongRoPE: whether a batch whose largest position is `max_position` uses the long factors.
bool rope_uses_long_factors(const ModelShape& shape, std::int64_t max_position);

}  // namespace strata::model
