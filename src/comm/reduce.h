// The reduction arithmetic of the host transports: a left fold over the ranks' inputs in rank
// order, the one summation order Strata promises (comm.h). Kept apart from the transport so that
// it can be tested on its own, and so that a test can compute the expected result of a
// collective with the same definition.
#pragma once

#include <cstdint>

#include "comm/comm.h"

namespace strata::comm {

// out[i] = fold of sources[0][i], sources[1][i], ..., sources[n-1][i] with `op`, left to right:
// (((s0 op s1) op s2) ...). The accumulator is fp32 for fp32/bf16/fp16 (16-bit outputs are
// rounded to nearest even once, at the end), fp64 for fp64, and 64-bit integers (wrapping) for
// integer types. `out` may be one of the sources (the same elements, not shifted); other overlaps
// are not allowed. source_count >= 1.
void fold_in_order(void* out, const void* const* sources, int source_count, std::uint64_t count,
                   DataType type, ReduceOp op);

}  // namespace strata::comm
