// Element types of the arrays the CPU kernels read and write: fp32, bf16 and fp16. The type is the
// optimizer state's too, so it is defined once in common/state_format.h; the kernels name it as
// kernels::DType.
#pragma once

#include "common/state_format.h"

namespace strata::kernels {

using strata::DType;
using strata::dtype_bytes;
using strata::parse_dtype;
using strata::to_string;

}  // namespace strata::kernels
