// Element-type numbers shared by the CUDA kernels and their host code: kernels::DType's values as
// plain ints (kernels take them as arguments). No CUDA here.
#pragma once

#include <cstdint>

#include "kernels/cpu/dtype.h"

namespace strata::cuda_kernels {

enum DTypeCode : int { kCodeF32 = 0, kCodeBF16 = 1, kCodeF16 = 2 };
static_assert(kCodeF32 == static_cast<int>(kernels::DType::kF32) &&
              kCodeBF16 == static_cast<int>(kernels::DType::kBF16) &&
              kCodeF16 == static_cast<int>(kernels::DType::kF16));

// GELU in the fallback GEMM's epilogue (gemm_fallback), on each result r (the product, beta's
// term and the bias, in fp32): none; r stored into `aux` and GELU(r) into C (cuBLASLt's
// GELU_AUX_BIAS); or C = GELU'(aux widened) r, aux the forward's pre-activation (cuBLASLt's DGELU),
// assigned as 0 + the product (a -0 becomes +0, as gelu_backward's kernels give). `aux` is of C's
// type and layout.
enum GemmGelu : int { kGemmNoGelu = 0, kGemmGeluAux = 1, kGemmDgelu = 2 };

// A 16-bit companion of a kernel's fp32 output (Ops::pair_narrow): where `p` is set, the kernel
// also writes every element it writes to the fp32 output, rounded to nearest even to `code`
// (kCodeBF16 or kCodeF16), at the same index of p: the bits a GEMM's operand conversion would
// give, so a GEMM may read p instead of converting. Null: nothing more is written.
struct Narrow {
  std::uint16_t* p = nullptr;
  int code = kCodeBF16;
};
// 16-bit values of `code` that a kernel reads, widened, in place of an fp32 input (a gradient kept
// in 16 bits alone, Ops::pair_narrow_alone): unset (null p), the fp32 input is read.
struct Sixteen {
  const std::uint16_t* p = nullptr;
  int code = kCodeBF16;
};
// The companions of an attention backward's three gradients (dq, dk, dv).
struct QkvNarrow {
  Narrow q, k, v;
};
// An attention's q, k and v in 16 bits (each kept so alone, Ops::keeps_qkv_alone), read in place
// of their fp32 arrays where set.
struct QkvSixteen {
  Sixteen q, k, v;
};

}  // namespace strata::cuda_kernels
