// The tensor-core flash attention's forward kernel (kernels/cuda/flash_attention_kernels.cuh),
// compiled for the GPU targets: its tests (flash_attention_emulated_test.cc) run it under the
// emulator, so this object, built wherever nvcc is found (tests/CMakeLists.txt), is what keeps
// every instantiation compiling for sm_80/sm_90. Nothing runs it. To see registers, shared memory
// and spills: nvcc -std=c++20 -arch=sm_90 -I. -Isrc
//   -I<build>/generated -Xptxas -v -c tests/kernels/flash_attention_ptx_check.cu
// (docs/backend.md, "Flash attention on tensor cores (forward)", has the figures).
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

}  // namespace strata::cuda_kernels
