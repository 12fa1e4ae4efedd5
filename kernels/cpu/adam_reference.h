// The readable reference of one Adam/AdamW step, in double precision, that every SIMD path of
// AdamKernel is tested against element by element. It follows PyTorch's torch.optim.Adam/AdamW
// formulas literally (see adam.h for the formula list); it is slow and allocates nothing.
#pragma once

#include <cstddef>

#include "kernels/cpu/adam.h"

namespace strata::kernels {

// The reference inputs: the fp32 state before the step and the gradient as stored.
struct AdamReferenceInput {
  const float* master = nullptr;      // [n]
  const float* exp_avg = nullptr;     // [n]
  const float* exp_avg_sq = nullptr;  // [n]
  const void* grad = nullptr;         // [n] of grad_dtype
  DType grad_dtype = DType::kF32;
  std::size_t n = 0;
};

// The state after the step, in double: out_master/out_exp_avg/out_exp_avg_sq have n elements.
// Returns what AdamKernel::step() returns; when it says skipped the outputs are the inputs.
AdamResult adam_reference(const AdamParams& params, const AdamFusion& fusion,
                          const AdamReferenceInput& in, double* out_master, double* out_exp_avg,
                          double* out_exp_avg_sq);

}  // namespace strata::kernels
