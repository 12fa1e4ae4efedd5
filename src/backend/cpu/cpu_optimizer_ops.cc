// CpuOptimizerOps (see cpu_optimizer_ops.h).
#include "backend/cpu/cpu_optimizer_ops.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>

namespace strata::backend {

Result<kernels::AdamResult> CpuOptimizerOps::adam_step(const kernels::AdamParams& params,
                                                       const kernels::AdamFusion& fusion,
                                                       const kernels::AdamTile& tile) {
  STRATA_TRY(kernels::validate(params));
  // The split below moves fp32 pointers; compressed state would need the kernel's own split
  // (8-bit blocks, tile-relative rounding indices), as the CUDA backend keeps fp32 too.
  STRATA_ASSERT_MSG(
      tile.moments == kernels::MomentFormat::kF32 && tile.master_dtype == kernels::DType::kF32,
      "the CPU backend's optimizer ops keep fp32 master and moments");
  kernels::AdamResult result;
  kernels::AdamFusion blocks_fusion = fusion;
  if (fusion.check_finite) {
    const kernels::GradStats stats = kernel_.grad_stats(tile.grad, tile.grad_dtype, tile.n);
    if (stats.nonfinite_count > 0) {
      result.skipped = true;
      result.nonfinite_count = stats.nonfinite_count;
      return result;
    }
    blocks_fusion.check_finite = false;
  }
  const std::size_t block = kernels::kAdamBlockElems;
  const std::size_t blocks = (tile.n + block - 1) / block;
  const std::size_t grad_bytes = kernels::dtype_bytes(tile.grad_dtype);
  arena_->execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, blocks), [&](const auto& r) {
      const std::size_t begin = r.begin() * block;
      const std::size_t end = std::min(r.end() * block, tile.n);
      kernels::AdamTile part = tile;
      part.master = static_cast<float*>(tile.master) + begin;
      part.exp_avg = static_cast<float*>(tile.exp_avg) + begin;
      part.exp_avg_sq = static_cast<float*>(tile.exp_avg_sq) + begin;
      part.grad = static_cast<const char*>(tile.grad) + begin * grad_bytes;
      if (tile.copy_out != nullptr) part.copy_out = static_cast<char*>(tile.copy_out) + begin * 2;
      part.n = end - begin;
      kernel_.step(params, blocks_fusion, part);
    });
  });
  return result;
}

}  // namespace strata::backend
