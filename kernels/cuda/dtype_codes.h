// Element-type numbers shared by the CUDA kernels and their host code: kernels::DType's values as
// plain ints (kernels take them as arguments). No CUDA here.
#pragma once

#include "kernels/cpu/dtype.h"

namespace strata::cuda_kernels {

enum DTypeCode : int { kCodeF32 = 0, kCodeBF16 = 1, kCodeF16 = 2 };
static_assert(kCodeF32 == static_cast<int>(kernels::DType::kF32) &&
              kCodeBF16 == static_cast<int>(kernels::DType::kBF16) &&
              kCodeF16 == static_cast<int>(kernels::DType::kF16));

}  // namespace strata::cuda_kernels
