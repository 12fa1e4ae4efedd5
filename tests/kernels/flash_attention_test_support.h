// The flash attention's cases, inputs and error bounds for the tests: the product's own
// (kernels/cpu/flash_attention_check.h, which the CUDA backend's start-up self-check uses too),
// under the name the tests have always used.
#pragma once

#include "kernels/cpu/flash_attention_check.h"

namespace strata::kernels {
namespace testing = flash_check;
}  // namespace strata::kernels
