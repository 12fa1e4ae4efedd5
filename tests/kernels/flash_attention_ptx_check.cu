// The tensor-core flash attention's kernels (kernels/cuda/flash_attention_kernels.cuh, forward;
// flash_attention_backward_kernels.cuh, backward), compiled for the GPU targets: their tests
// (flash_attention_emulated_test.cc, flash_attention_backward_emulated_test.cc) run them under the
// emulator, so this object, built wherever nvcc is found (tests/CMakeLists.txt), is what keeps
// every instantiation compiling for sm_80/sm_90. Nothing runs it. To see registers, shared memory
// and spills: nvcc -std=c++20 -arch=sm_90 -I. -Isrc
//   -I<build>/generated -Xptxas -v -c tests/kernels/flash_attention_ptx_check.cu
// (docs/backend.md, "Flash attention on tensor cores (forward)" and "(backward)", has the figures).
#include "kernels/cuda/flash_attention_backward_kernels.cuh"
#include "kernels/cuda/flash_attention_kernels.cuh"

namespace strata::cuda_kernels {

template __global__ void flash_attention_forward_kernel<FlashBf16, 64>(FlashArgs);
template __global__ void flash_attention_forward_kernel<FlashBf16, 80>(FlashArgs);
template __global__ void flash_attention_forward_kernel<FlashBf16, 96>(FlashArgs);
template __global__ void flash_attention_forward_kernel<FlashBf16, 128>(FlashArgs);
template __global__ void flash_attention_forward_kernel<FlashBf16, 256>(FlashArgs);
template __global__ void flash_attention_forward_kernel<FlashFp16, 64>(FlashArgs);
template __global__ void flash_attention_forward_kernel<FlashFp16, 80>(FlashArgs);
template __global__ void flash_attention_forward_kernel<FlashFp16, 96>(FlashArgs);
template __global__ void flash_attention_forward_kernel<FlashFp16, 128>(FlashArgs);
template __global__ void flash_attention_forward_kernel<FlashFp16, 256>(FlashArgs);

// The backward: delta, dk/dv and dq for every head size and 16-bit type.
template __global__ void flash_attention_delta_kernel<FlashBf16>(FlashBackwardArgs);
template __global__ void flash_attention_delta_kernel<FlashFp16>(FlashBackwardArgs);
#define STRATA_FLASH_BACKWARD(E, D)                                             \
  template __global__ void flash_attention_dkv_kernel<E, D>(FlashBackwardArgs); \
  template __global__ void flash_attention_dq_kernel<E, D>(FlashBackwardArgs)
STRATA_FLASH_BACKWARD(FlashBf16, 64);
STRATA_FLASH_BACKWARD(FlashBf16, 80);
STRATA_FLASH_BACKWARD(FlashBf16, 96);
STRATA_FLASH_BACKWARD(FlashBf16, 128);
STRATA_FLASH_BACKWARD(FlashBf16, 256);
STRATA_FLASH_BACKWARD(FlashFp16, 64);
STRATA_FLASH_BACKWARD(FlashFp16, 80);
STRATA_FLASH_BACKWARD(FlashFp16, 96);
STRATA_FLASH_BACKWARD(FlashFp16, 128);
STRATA_FLASH_BACKWARD(FlashFp16, 256);
#undef STRATA_FLASH_BACKWARD

}  // namespace strata::cuda_kernels
