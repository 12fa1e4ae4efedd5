// The CUDA kernels' host-side launch decisions (kernels/cuda/launch_plan.h), tested without a GPU:
// GEMM blocks always fit the conversion workspace and cover the product exactly once, column
// reductions fit their scratch, attention launches fit shared memory.
#include "kernels/cuda/launch_plan.h"

#include <gtest/gtest.h>

#include <set>
#include <tuple>

namespace strata::cuda {
namespace {

// Checks a blocking as GemmEngine uses it: the largest (first) block of each operand fits its
// region, the regions fit the workspace, and no block is larger than its dimension.
void expect_valid(const GemmBlocking& b, bool ta, bool tb, std::int64_t m, std::int64_t n,
                  std::int64_t k, std::int64_t capacity) {
  ASSERT_GT(b.m_block, 0);
  ASSERT_GT(b.n_block, 0);
  ASSERT_GT(b.k_block, 0);
  EXPECT_LE(b.a_elements + b.b_elements, capacity);
  EXPECT_EQ(b.a_elements % kWorkspaceBlockAlign, 0);
  EXPECT_EQ(b.b_elements % kWorkspaceBlockAlign, 0);
  EXPECT_LE(a_block_elements(ta, std::min(b.m_block, m), std::min(b.k_block, k)), b.a_elements);
  EXPECT_LE(b_block_elements(tb, std::min(b.k_block, k), std::min(b.n_block, n)), b.b_elements);
  EXPECT_LE(b.m_block, m);
  EXPECT_LE(b.n_block, n);
  EXPECT_LE(b.k_block, k);
}

TEST(GemmBlocking, ProductsThatFitAreOneBlock) {
  const GemmBlocking b = plan_gemm_blocking(false, true, 100, 200, 300, 1 << 20);
  EXPECT_EQ(b.blocks(), 1);
  EXPECT_EQ(b.m_block, 100);
  EXPECT_EQ(b.n_block, 200);
  EXPECT_EQ(b.k_block, 300);
}

TEST(GemmBlocking, LeadingDimensionsArePaddedToSixteenBytes) {
  EXPECT_EQ(padded_ld(1), 8);
  EXPECT_EQ(padded_ld(8), 8);
  EXPECT_EQ(padded_ld(769), 776);
  EXPECT_EQ(a_block_elements(false, 3, 5), 3 * 8);   // 3 rows of 5 -> ld 8
  EXPECT_EQ(a_block_elements(true, 3, 5), 5 * 8);    // stored transposed: 5 rows of 3
  EXPECT_EQ(b_block_elements(false, 5, 9), 5 * 16);  // 5 rows of 9 -> ld 16
  EXPECT_EQ(b_block_elements(true, 5, 9), 9 * 8);    // stored transposed: 9 rows of 5
}

TEST(GemmBlocking, EveryBlockFitsTheWorkspace) {
  const std::int64_t capacities[] = {kGemmWorkspaceMinElements, 50'000, 1 << 20};
  const std::int64_t dims[] = {1, 7, 64, 129, 1000, 50257};
  for (std::int64_t capacity : capacities) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (std::int64_t m : dims) {
          for (std::int64_t n : {std::int64_t{3}, std::int64_t{768}, std::int64_t{4000}}) {
            for (std::int64_t k : {std::int64_t{5}, std::int64_t{768}, std::int64_t{50257}}) {
              SCOPED_TRACE(::testing::Message() << "capacity " << capacity << " ta " << ta << " tb "
                                                << tb << " m " << m << " n " << n << " k " << k);
              expect_valid(plan_gemm_blocking(ta, tb, m, n, k, capacity), ta, tb, m, n, k,
                           capacity);
            }
          }
        }
      }
    }
  }
}

TEST(GemmBlocking, KeepsTheWholeSumInOneCallWhenA64By64BlockFits) {
  // 64 x 64 output blocks with k = 1000 need 2 * 64 * 1000 elements: k must not be split.
  const GemmBlocking b = plan_gemm_blocking(false, false, 5000, 5000, 1000, 300'000);
  EXPECT_EQ(b.k_block, 1000);
  EXPECT_GE(b.m_block, 64);
  EXPECT_GE(b.n_block, 64);
}

TEST(GemmBlocking, SplitsKOnlyWhenItMust) {
  const GemmBlocking b =
      plan_gemm_blocking(false, false, 64, 64, 1'000'000, kGemmWorkspaceMinElements);
  EXPECT_LT(b.k_block, 1'000'000);
  EXPECT_EQ(b.k_block % kWorkspaceLdAlign, 0);
  expect_valid(b, false, false, 64, 64, 1'000'000, kGemmWorkspaceMinElements);
}

TEST(GemmBlocking, ConvertsTheSmallOperandOnceWhenItFits) {
  // The head's logits GEMM: a chunk of rows (small A) against the whole vocabulary (large B).
  const GemmBlocking b = plan_gemm_blocking(false, true, 166, 50257, 768, 16 << 20);
  EXPECT_EQ(b.m_block, 166);
  EXPECT_TRUE(b.n_outer);
  EXPECT_EQ(b.k_block, 768);
}

TEST(GemmBlocking, DependsOnlyOnItsArguments) {
  const GemmBlocking a = plan_gemm_blocking(true, false, 50257, 768, 4096, 1 << 22);
  const GemmBlocking b = plan_gemm_blocking(true, false, 50257, 768, 4096, 1 << 22);
  EXPECT_EQ(std::tie(a.m_block, a.n_block, a.k_block, a.n_outer),
            std::tie(b.m_block, b.n_block, b.k_block, b.n_outer));
}

TEST(ColumnReducePlan, ChunksCoverEveryRowAndFitTheScratch) {
  for (std::int64_t rows : {1, 15, 16, 17, 1000, 8192, 1 << 20}) {
    for (std::int64_t cols : {1, 768, 4096, 50257}) {
      for (int arrays : {1, 2}) {
        const std::int64_t scratch = 2 << 20;
        const ColumnReducePlan p = plan_column_reduce(rows, cols, arrays, scratch);
        ASSERT_GT(p.chunks, 0);
        EXPECT_GE(p.chunks * p.rows_per_chunk, rows);
        EXPECT_LT((p.chunks - 1) * p.rows_per_chunk, rows);  // no empty chunk
        EXPECT_LE(p.chunks * arrays * cols, scratch);
        EXPECT_LE(p.chunks, kColumnReduceMaxChunks);
      }
    }
  }
}

TEST(ColumnReducePlan, SaysSoWhenNotEvenOneChunkFits) {
  EXPECT_EQ(plan_column_reduce(100, 1000, 2, 1999).chunks, 0);
  EXPECT_EQ(plan_column_reduce(100, 1000, 2, 2000).chunks, 1);
}

TEST(AttentionPlan, PerLaneValuesCoverTheHeadDimension) {
  const std::pair<std::int64_t, int> cases[] = {{1, 1},  {32, 1},  {33, 2},  {64, 2}, {65, 4},
                                                {96, 4}, {128, 4}, {129, 8}, {256, 8}};
  for (const auto& [dim, per_lane] : cases) {
    const AttentionLaunch l = plan_attention(dim);
    EXPECT_EQ(l.per_lane, per_lane) << "head_dim " << dim;
    EXPECT_GE(l.padded_dim, dim);
    EXPECT_EQ(l.rows_per_block, l.rows_per_warp * kAttentionWarps);
  }
}

TEST(AttentionPlan, SharedMemoryFitsAnAmpereBlock) {
  // sm_80 allows 163 KiB of shared memory per block (sm_90: 227 KiB).
  for (std::int64_t dim = 1; dim <= kAttentionHeadDimMax; ++dim) {
    const AttentionLaunch l = plan_attention(dim);
    EXPECT_LE(l.forward_smem_bytes, 163 * 1024) << dim;
    EXPECT_LE(l.dq_smem_bytes, 163 * 1024) << dim;
    EXPECT_LE(l.dkv_smem_bytes, 163 * 1024) << dim;
  }
}

TEST(AttentionPlan, RejectsHeadDimensionsTheKernelsDoNotSupport) {
  EXPECT_EQ(plan_attention(0).per_lane, 0);
  EXPECT_EQ(plan_attention(257).per_lane, 0);
}

TEST(ElementwiseBlocks, AreAtLeastOneAndAtMostTheCap) {
  EXPECT_EQ(elementwise_blocks(0), 1);
  EXPECT_EQ(elementwise_blocks(1), 1);
  EXPECT_EQ(elementwise_blocks(kElementwiseThreads + 1), 2);
  EXPECT_EQ(elementwise_blocks(std::int64_t{1} << 40), kElementwiseBlocksMax);
}

TEST(GemmPrecisionNames, RoundTrip) {
  for (GemmPrecision p :
       {GemmPrecision::kFp32, GemmPrecision::kTf32, GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    EXPECT_EQ(parse_gemm_precision(to_string(p)), p);
  }
  EXPECT_FALSE(parse_gemm_precision("fp8").has_value());
  EXPECT_TRUE(converts_operands(GemmPrecision::kBf16));
  EXPECT_FALSE(converts_operands(GemmPrecision::kTf32));
}

}  // namespace
}  // namespace strata::cuda

// The flash attention on fp32 arrays (flash_attention_f32.cuh): elements per batch row, passes,
// and which shapes it takes.
namespace strata::cuda {
namespace {

TEST(FlashIoPlan, CountsEachBatchRowsPiecesAndCutsTheBatchIntoPasses) {
  // T 256, 8 heads of 64, 2 KV heads: hd 512, kvd 128.
  const FlashIoPlan fwd = plan_flash_io(4, 256, 8, 2, 64, false, 1 << 20);
  EXPECT_EQ(fwd.per_batch_row, 256 * (512 + 256) + 256 * 512);
  EXPECT_EQ(fwd.batch_rows, 3);
  EXPECT_EQ(fwd.passes, 2);
  const FlashIoPlan bwd = plan_flash_io(4, 256, 8, 2, 64, true, 1 << 20);
  EXPECT_EQ(bwd.per_batch_row, 2 * 256 * (512 + 256) + 2 * 256 * 512 + 2 * 8 * 256);
  EXPECT_EQ(bwd.batch_rows, 1);
  EXPECT_EQ(bwd.passes, 4);
  // A workspace that holds the whole batch: one pass of 4 rows, never more rows than the batch.
  EXPECT_EQ(plan_flash_io(4, 256, 8, 2, 64, true, 1 << 30).batch_rows, 4);
  EXPECT_EQ(plan_flash_io(4, 256, 8, 2, 64, true, 1 << 30).passes, 1);
  // One that does not hold a row: no pass.
  EXPECT_EQ(plan_flash_io(4, 256, 8, 2, 64, true, bwd.per_batch_row - 1).batch_rows, 0);
}

TEST(FlashIoPlan, TakesFlashHeadSizesWholeGroupsAndRowsThatFit) {
  for (const std::int64_t d : {64, 80, 96, 128, 256})
    EXPECT_TRUE(flash_io_takes(2, 128, 4, 2, d, 1 << 24)) << d;
  for (const std::int64_t d : {8, 32, 48, 112, 192})
    EXPECT_FALSE(flash_io_takes(2, 128, 4, 2, d, 1 << 24)) << d;
  EXPECT_FALSE(flash_io_takes(2, 128, 6, 4, 64, 1 << 24));  // 6 heads over 4 KV heads
  EXPECT_FALSE(flash_io_takes(2, 128, 4, 2, 64, 1000));     // no batch row fits
}

}  // namespace
}  // namespace strata::cuda
