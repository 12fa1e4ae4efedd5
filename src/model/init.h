// Random initialisation for training from scratch (GPT-2's scheme, also used for Llama): weight
// matrices and embeddings ~ N(0, 0.02), the residual output projections (attn.c_proj / o_proj,
// mlp.c_proj / down_proj) ~ N(0, 0.02 / sqrt(2 * layers)), biases 0, norm weights 1.
// Deterministic: each tensor draws from its own stream keyed by (seed, unit, tensor), so a unit
// initialises the same whatever order or thread does it.
#pragma once

#include <cstdint>

#include "model/layout.h"

namespace strata::model {

// Fills `params` (the unit's padded_numel floats) for unit `unit` of `layout`; padding is zeroed.
void init_unit(const ModelShape& spec, const UnitLayout& unit, std::uint64_t seed, float* params);

}  // namespace strata::model
