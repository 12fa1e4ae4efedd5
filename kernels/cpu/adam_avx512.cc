// The AVX-512 (F, BW, VL, DQ) path of the CPU Adam kernels: the loops of adam_simd_loop.h (fp32
// and compressed state, gradient statistics, roofline) compiled for AVX-512 over its 16-float
// vector (Avx512, adam_avx512_vec.h).
#include "kernels/cpu/adam_avx512_vec.h"  // first: it carries a pragma for the intrinsics header
#define STRATA_SIMD_TARGET STRATA_AVX512
#include "kernels/cpu/adam_simd_loop.h"

namespace strata::kernels::detail {

AdamPath avx512_path() {
  return simd::path<Avx512>();
}

}  // namespace strata::kernels::detail
