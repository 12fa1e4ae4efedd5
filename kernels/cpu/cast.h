// Whole-array conversions between the element types a parameter or gradient buffer can hold
// (kernels/cpu/dtype.h: fp32, bf16, fp16) and double, for the model kernels and the trainer.
// Narrowing rounds to nearest even with the scalar conversions of kernels/cpu/float16.h, the
// same bits the Adam kernel's copy-out writes. Runs on oneTBB for large arrays; buffers must not
// overlap.
#pragma once

#include <cstdint>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/float16.h"

namespace strata::kernels {

// dst[i] = src[i] converted from `src_type` to `dst_type`, n elements.
void cast_array(void* dst, DType dst_type, const void* src, DType src_type, std::int64_t n);
// dst[i] = double(src[i]).
void widen_to_f64(double* dst, const void* src, DType src_type, std::int64_t n);
// dst[i] = src[i] rounded to float, then to `dst_type`.
void narrow_from_f64(void* dst, DType dst_type, const double* src, std::int64_t n);
// acc[i] = (assign ? 0 : acc[i]) + float(src[i]): accumulates a gradient that arrived in
// `src_type` into fp32.
void accumulate_from(float* acc, const void* src, DType src_type, std::int64_t n, bool assign);

}  // namespace strata::kernels
