// The inline PTX of kernels/cuda/tensor_core.cuh, compiled for the GPU targets: the emulator tests
// (tensor_core_emulated_test.cc) run the header's other branch, so this kernel, built wherever nvcc
// is found (tests/CMakeLists.txt), is what keeps every asm statement assembling. Nothing runs it.
// To see its registers and spills: nvcc -std=c++20 -arch=sm_90 -I. -Isrc -I<build>/generated
//   -Xptxas -v -c tests/kernels/tensor_core_ptx_check.cu (docs/backend.md has the figures).
#include "kernels/cuda/tensor_core.cuh"

namespace strata::cuda_kernels {

constexpr int kCheckStride = 24;  // shared row stride in 16-bit elements (48 bytes)

// One warp: a 16x16 A and a 16x16 B (both row-major 16-bit) copied to shared memory with every
// cp.async form (no two copies of a group to one place), loaded with every ldmatrix form,
// multiplied with both mma types; d is 16x16 fp32.
__global__ void tensor_core_ptx_check(float* d, const std::uint16_t* a, const std::uint16_t* b) {
  __shared__ __align__(16) std::uint16_t sa[16 * kCheckStride];
  __shared__ __align__(16) std::uint16_t sb[16 * kCheckStride];
  __shared__ __align__(16) std::uint16_t tail[32 * 8];
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int row = lane / 2, half = lane % 2;
  cp_async_cg(sa + row * kCheckStride + half * 8, a + row * 16 + half * 8);
  cp_async_ca<16>(sb + row * kCheckStride + half * 8, b + row * 16 + half * 8);
  cp_async_commit_group();
  cp_async_ca<8>(sa + row * kCheckStride + 16 + half * 4, a + lane * 4);
  cp_async_ca<4>(sb + row * kCheckStride + 16 + half * 2, b + lane * 2);
  cp_async_cg_zfill(tail + lane * 8, a + lane * 8, lane % 17);
  cp_async_commit_group();
  cp_async_wait_group<1>();
  cp_async_wait_all();
  __syncthreads();

  MmaA fa;
  const TileIndex ra = ldmatrix_x4_a_row(lane);
  ldmatrix<4>(fa.reg, sa + ra.row * kCheckStride + ra.col);
  std::uint32_t r[4];
  const TileIndex rb = ldmatrix_x4_trans_b_row(lane);
  ldmatrix_trans<4>(r, sb + rb.row * kCheckStride + rb.col);
  const MmaB b_lo{{r[0], r[1]}}, b_hi{{r[2], r[3]}};
  const TileIndex rt = ldmatrix_x4_b_row(lane);
  std::uint32_t t4[4], x2[2], x1[1], y2[2], y1[1];
  ldmatrix<4>(t4, sb + rt.row * kCheckStride + rt.col);
  ldmatrix<2>(x2, sa + (lane % 16) * kCheckStride);
  ldmatrix<1>(x1, sb + (lane % 8) * kCheckStride);
  ldmatrix_trans<2>(y2, sa + (lane % 16) * kCheckStride + 8);
  ldmatrix_trans<1>(y1, sb + (lane % 8) * kCheckStride + 8);
  const MmaB mixed{{t4[0] ^ x2[0] ^ x1[0] ^ y2[0], t4[1] ^ x2[1] ^ y1[0] ^ y2[1]}};

  MmaAcc acc[2] = {};
  mma_m16n8k16_bf16(acc[0], fa, b_lo, acc[0]);
  mma_m16n8k16_bf16(acc[1], fa, b_hi, acc[1]);
  mma_m16n8k16_f16(acc[0], fa, mixed, acc[0]);
  const float extra = static_cast<float>(t4[2] ^ t4[3]) + static_cast<float>(tail[lane * 8 + 7]);
  for (int n = 0; n < 2; ++n) {
    for (int i = 0; i < 4; ++i) {
      const TileIndex e = mma_c_element(lane, i);
      d[e.row * 16 + n * 8 + e.col] = acc[n].reg[i] + extra;
    }
  }
}

}  // namespace strata::cuda_kernels
