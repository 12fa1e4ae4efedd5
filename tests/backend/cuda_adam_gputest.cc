// The CUDA backend's OptimizerOps: device AdamW gives the same bits as CPU Adam (weights,
// moments and bf16/fp16 copies) for every gradient type and both weight-decay modes; check_finite
// leaves a tile with inf/NaN untouched; the gradient statistics match the CPU's sum of squares
// and count non-finite elements exactly. Skips without a GPU.
#include <gtest/gtest.h>

#include <limits>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/float16.h"
#include "support/gpu_support.h"

namespace strata::backend {
namespace {

using kernels::DType;

struct HostTile {
  std::vector<float> master, m, v;
  std::vector<float> grad32;
  std::vector<std::uint16_t> grad16, copy;
};

HostTile make_tile(std::size_t n, DType grad_type, std::uint64_t seed) {
  HostTile t;
  t.master = testing::random_floats(n, seed);
  t.m = testing::random_floats(n, seed + 1, -0.01f, 0.01f);
  t.v = testing::random_floats(n, seed + 2, 0.0f, 1e-4f);
  t.grad32 = testing::random_floats(n, seed + 3, -2.0f, 2.0f);
  t.grad16.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    t.grad16[i] = grad_type == DType::kBF16 ? kernels::float_to_bf16(t.grad32[i])
                                            : kernels::float_to_fp16(t.grad32[i]);
  }
  t.copy.assign(n, 0);
  return t;
}

struct DeviceTile {
  Buffer master, m, v, grad, copy;
};

DeviceTile upload(Backend& gpu, const HostTile& t, DType grad_type) {
  DeviceTile d;
  d.master = testing::to_device(gpu, t.master);
  d.m = testing::to_device(gpu, t.m);
  d.v = testing::to_device(gpu, t.v);
  d.grad = grad_type == DType::kF32 ? testing::to_device(gpu, t.grad32)
                                    : testing::to_device(gpu, t.grad16);
  d.copy = testing::to_device(gpu, t.copy);
  return d;
}

kernels::AdamTile view(DeviceTile& d, DType grad_type, DType copy_type, std::size_t n) {
  kernels::AdamTile tile;
  tile.master = d.master.as<float>();
  tile.exp_avg = d.m.as<float>();
  tile.exp_avg_sq = d.v.as<float>();
  tile.grad = d.grad.data();
  tile.grad_dtype = grad_type;
  tile.copy_out = copy_type == DType::kF32 ? nullptr : d.copy.data();
  tile.copy_dtype = copy_type == DType::kF32 ? DType::kBF16 : copy_type;
  tile.n = n;
  return tile;
}

kernels::AdamTile view(HostTile& t, DType grad_type, DType copy_type) {
  kernels::AdamTile tile;
  tile.master = t.master.data();
  tile.exp_avg = t.m.data();
  tile.exp_avg_sq = t.v.data();
  tile.grad = grad_type == DType::kF32 ? static_cast<const void*>(t.grad32.data())
                                       : static_cast<const void*>(t.grad16.data());
  tile.grad_dtype = grad_type;
  tile.copy_out = copy_type == DType::kF32 ? nullptr : t.copy.data();
  tile.copy_dtype = copy_type == DType::kF32 ? DType::kBF16 : copy_type;
  tile.n = t.master.size();
  return tile;
}

TEST(CudaAdam, MatchesCpuAdamBitForBit) {
  STRATA_GPU_OR_SKIP(gpu, {});
  auto kernel = kernels::AdamKernel::create();
  ASSERT_TRUE(kernel.is_ok());
  const std::size_t n = 100'003;
  std::uint64_t seed = 1;
  for (DType grad_type : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType copy_type : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (bool adamw : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "grad " << kernels::to_string(grad_type) << " copy "
                                          << kernels::to_string(copy_type) << " adamw " << adamw);
        HostTile want = make_tile(n, grad_type, seed += 10);
        DeviceTile d = upload(gpu, want, grad_type);
        kernels::AdamParams params;
        params.lr = 3e-4f;
        params.beta1 = 0.9f;
        params.beta2 = 0.95f;
        params.weight_decay = 0.1f;
        params.adamw_mode = adamw;
        params.bias_correction = adamw;  // both settings covered
        params.step = 7;
        kernels::AdamFusion fusion;
        fusion.grad_scale_inv = 1.0f / 1024.0f;
        fusion.clip_coef = 0.75f;
        auto result =
            gpu.optimizer_ops().adam_step(params, fusion, view(d, grad_type, copy_type, n));
        ASSERT_TRUE(result.is_ok()) << result.status().to_string();
        kernel->step(params, fusion, view(want, grad_type, copy_type));
        testing::expect_bitwise_equal("master", testing::to_host<float>(gpu, d.master),
                                      want.master);
        testing::expect_bitwise_equal("exp_avg", testing::to_host<float>(gpu, d.m), want.m);
        testing::expect_bitwise_equal("exp_avg_sq", testing::to_host<float>(gpu, d.v), want.v);
        testing::expect_bitwise_equal("copy", testing::to_host<std::uint16_t>(gpu, d.copy),
                                      want.copy);
      }
    }
  }
  EXPECT_TRUE(gpu.synchronize(StreamKind::kCompute).is_ok());
}

TEST(CudaAdam, CheckFiniteSkipsATileWithInfOrNan) {
  STRATA_GPU_OR_SKIP(gpu, {});
  const std::size_t n = 5000;
  HostTile t = make_tile(n, DType::kBF16, 3);
  t.grad16[17] = 0x7f80;    // bf16 +inf
  t.grad16[4000] = 0x7fc1;  // bf16 NaN
  DeviceTile d = upload(gpu, t, DType::kBF16);
  kernels::AdamFusion fusion;
  fusion.check_finite = true;
  auto result = gpu.optimizer_ops().adam_step(kernels::AdamParams{}, fusion,
                                              view(d, DType::kBF16, DType::kBF16, n));
  ASSERT_TRUE(result.is_ok()) << result.status().to_string();
  EXPECT_TRUE(result->skipped);
  EXPECT_EQ(result->nonfinite_count, 2u);
  testing::expect_bitwise_equal("master", testing::to_host<float>(gpu, d.master), t.master);
  testing::expect_bitwise_equal("exp_avg_sq", testing::to_host<float>(gpu, d.v), t.v);
  testing::expect_bitwise_equal("copy", testing::to_host<std::uint16_t>(gpu, d.copy), t.copy);

  t.grad16[17] = 0x3f80;  // 1.0
  t.grad16[4000] = 0x3f80;
  d = upload(gpu, t, DType::kBF16);
  result = gpu.optimizer_ops().adam_step(kernels::AdamParams{}, fusion,
                                         view(d, DType::kBF16, DType::kBF16, n));
  ASSERT_TRUE(result.is_ok());
  EXPECT_FALSE(result->skipped);
  EXPECT_NE(testing::to_host<float>(gpu, d.master), t.master);
}

}  // namespace
}  // namespace strata::backend
