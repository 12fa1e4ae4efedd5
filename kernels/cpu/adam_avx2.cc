// The AVX2 + FMA + F16C path of the CPU Adam kernels: the loops of adam_simd_loop.h (fp32 and
// compressed state, gradient statistics, roofline) compiled for AVX2 over its 8-float vector
// (Avx2, adam_avx2_vec.h). No software prefetch: on the development machine it gained nothing
// over the hardware prefetchers for these long unit-stride streams (docs/adam.md).
#include "kernels/cpu/adam_avx2_vec.h"
#define STRATA_SIMD_TARGET STRATA_AVX2
#include "kernels/cpu/adam_simd_loop.h"

namespace strata::kernels::detail {

AdamPath avx2_path() {
  return simd::path<Avx2>();
}

}  // namespace strata::kernels::detail
