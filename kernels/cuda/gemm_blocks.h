// The walk over a GemmBlocking (launch_plan.h) that GemmEngine runs for bf16/fp16 GEMMs:
// for each output block, in the plan's order, and each k piece, convert the operand blocks that
// are not already in the workspace, then multiply them into C (beta for the first k piece, 1 for
// the rest). The conversions and products are callbacks, so the walk is tested on the CPU
// (tests/backend/gemm_blocks_test.cc) with the same offsets the GPU uses. No CUDA here.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/launch_plan.h"

STRATA_CUDA_NAMESPACE(cuda) {

// Convert `rows` x `cols` fp32 values at src (leading dimension src_ld) into the operand's
// workspace region with leading dimension dst_ld.
struct BlockCopy {
  const float* src = nullptr;
  std::int64_t src_ld = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t dst_ld = 0;
};

// C block (m x n at c, leading dimension of C) = alpha op(A block) op(B block) + beta C block, the
// blocks being in the workspace with leading dimensions a_ld and b_ld.
struct BlockProduct {
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t a_ld = 0, b_ld = 0;
  float beta = 0.0f;
  float* c = nullptr;
};

template <typename ConvertA, typename ConvertB, typename Multiply>
Status walk_gemm_blocks(const cuda::GemmBlocking& plan, bool trans_a, bool trans_b, const float* a,
                        std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                        std::int64_t ldc, ConvertA&& convert_a, ConvertB&& convert_b,
                        Multiply&& multiply) {
  const std::int64_t m = plan.m, n = plan.n, k = plan.k;
  std::int64_t a_at[2] = {-1, -1};  // (m0, k0) of the A block in the workspace
  std::int64_t b_at[2] = {-1, -1};  // (k0, n0) of the B block
  auto block = [&](std::int64_t m0, std::int64_t n0) -> Status {
    const std::int64_t mb = std::min(plan.m_block, m - m0);
    const std::int64_t nb = std::min(plan.n_block, n - n0);
    for (std::int64_t k0 = 0; k0 < k; k0 += plan.k_block) {
      const std::int64_t kb = std::min(plan.k_block, k - k0);
      // op(A) rows m0.., columns k0.. as stored: rows of A, or columns when A is transposed.
      BlockProduct product;
      product.m = mb;
      product.n = nb;
      product.k = kb;
      product.a_ld = cuda::padded_ld(trans_a ? mb : kb);
      product.b_ld = cuda::padded_ld(trans_b ? kb : nb);
      product.beta = k0 == 0 ? beta : 1.0f;
      product.c = c + m0 * ldc + n0;
      if (a_at[0] != m0 || a_at[1] != k0) {
        BlockCopy copy;
        copy.src = trans_a ? a + k0 * lda + m0 : a + m0 * lda + k0;
        copy.src_ld = lda;
        copy.rows = trans_a ? kb : mb;
        copy.cols = trans_a ? mb : kb;
        copy.dst_ld = product.a_ld;
        STRATA_TRY(convert_a(copy));
        a_at[0] = m0;
        a_at[1] = k0;
      }
      if (b_at[0] != k0 || b_at[1] != n0) {
        BlockCopy copy;
        copy.src = trans_b ? b + n0 * ldb + k0 : b + k0 * ldb + n0;
        copy.src_ld = ldb;
        copy.rows = trans_b ? nb : kb;
        copy.cols = trans_b ? kb : nb;
        copy.dst_ld = product.b_ld;
        STRATA_TRY(convert_b(copy));
        b_at[0] = k0;
        b_at[1] = n0;
      }
      STRATA_TRY(multiply(product));
    }
    return Status::ok();
  };
  if (plan.n_outer) {
    for (std::int64_t n0 = 0; n0 < n; n0 += plan.n_block) {
      for (std::int64_t m0 = 0; m0 < m; m0 += plan.m_block)
        STRATA_TRY(block(m0, n0));
    }
  } else {
    for (std::int64_t m0 = 0; m0 < m; m0 += plan.m_block) {
      for (std::int64_t n0 = 0; n0 < n; n0 += plan.n_block)
        STRATA_TRY(block(m0, n0));
    }
  }
  return Status::ok();
}

}  // STRATA_CUDA_NAMESPACE(cuda)
