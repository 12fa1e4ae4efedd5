// OptimizerOps of the CPU backend: the same bits as kernels::AdamKernel on the whole tile (the
// split over threads does not change a bit) and the check_finite skip.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "support/gpu_support.h"

namespace strata::backend {
namespace {

struct Tile {
  std::vector<float> master, m, v, grad;
  std::vector<std::uint16_t> copy;
};

Tile random_tile(std::size_t n, std::uint64_t seed) {
  Tile t;
  t.master = testing::random_floats(n, seed);
  t.m = testing::random_floats(n, seed + 1, -0.1f, 0.1f);
  t.v = testing::random_floats(n, seed + 2, 0.0f, 0.01f);
  t.grad = testing::random_floats(n, seed + 3);
  t.copy.assign(n, 0);
  return t;
}

kernels::AdamTile view(Tile& t) {
  kernels::AdamTile tile;
  tile.master = t.master.data();
  tile.exp_avg = t.m.data();
  tile.exp_avg_sq = t.v.data();
  tile.grad = t.grad.data();
  tile.copy_out = t.copy.data();
  tile.copy_dtype = kernels::DType::kBF16;
  tile.n = t.master.size();
  return tile;
}

TEST(CpuOptimizerOps, AdamMatchesTheKernelBitForBit) {
  auto backend = testing::make_reference_backend();
  const std::size_t n = 3 * kernels::kAdamBlockElems + 123;  // several blocks and a tail
  Tile ours = random_tile(n, 7);
  Tile want = ours;
  kernels::AdamParams params;
  params.lr = 1e-3f;
  params.weight_decay = 0.1f;
  params.step = 3;
  kernels::AdamFusion fusion;
  fusion.grad_scale_inv = 0.5f;
  auto result = backend->optimizer_ops().adam_step(params, fusion, view(ours));
  ASSERT_TRUE(result.is_ok()) << result.status().to_string();
  EXPECT_FALSE(result->skipped);
  auto kernel = kernels::AdamKernel::create();
  ASSERT_TRUE(kernel.is_ok());
  kernel->step(params, fusion, view(want));
  testing::expect_bitwise_equal("master", ours.master, want.master);
  testing::expect_bitwise_equal("exp_avg", ours.m, want.m);
  testing::expect_bitwise_equal("exp_avg_sq", ours.v, want.v);
  testing::expect_bitwise_equal("bf16 copy", ours.copy, want.copy);
}

TEST(CpuOptimizerOps, CheckFiniteSkipsTheTileUntouched) {
  auto backend = testing::make_reference_backend();
  Tile t = random_tile(1000, 11);
  t.grad[500] = std::numeric_limits<float>::infinity();
  const Tile before = t;
  kernels::AdamFusion fusion;
  fusion.check_finite = true;
  auto result = backend->optimizer_ops().adam_step(kernels::AdamParams{}, fusion, view(t));
  ASSERT_TRUE(result.is_ok());
  EXPECT_TRUE(result->skipped);
  EXPECT_EQ(result->nonfinite_count, 1u);
  testing::expect_bitwise_equal("master", t.master, before.master);
}

TEST(CpuOptimizerOps, InvalidParamsAreAnError) {
  auto backend = testing::make_reference_backend();
  Tile t = random_tile(10, 1);
  kernels::AdamParams params;
  params.beta1 = 1.5f;
  auto result = backend->optimizer_ops().adam_step(params, {}, view(t));
  ASSERT_FALSE(result.is_ok());
  EXPECT_EQ(result.status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::backend
