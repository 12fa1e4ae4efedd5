// Host-side launch decisions of the CUDA kernels (see launch_plan.h).
#include "kernels/cuda/launch_plan.h"

#include <algorithm>

#include "common/assert.h"

namespace strata::cuda {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

std::int64_t region(std::int64_t elements) {
  return ceil_div(elements, kWorkspaceBlockAlign) * kWorkspaceBlockAlign;
}

// The largest x in [1, hi] with fits(x), assuming fits is monotone (true up to some x); 0 when
// even fits(1) is false.
template <typename Fits>
std::int64_t largest_fitting(std::int64_t hi, const Fits& fits) {
  if (!fits(1)) return 0;
  std::int64_t lo = 1;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Block sizes below the full dimension are rounded down to a multiple of 64 (tensor-core tiles
// stay full), keeping at least 64 when that much was available.
std::int64_t round_block(std::int64_t block, std::int64_t dim) {
  if (block >= dim) return dim;
  return block >= 64 ? block / 64 * 64 : block;
}

}  // namespace

const char* to_string(GemmPrecision precision) {
  switch (precision) {
    case GemmPrecision::kFp32:
      return "fp32";
    case GemmPrecision::kTf32:
      return "tf32";
    case GemmPrecision::kBf16:
      return "bf16";
    case GemmPrecision::kFp16:
      return "fp16";
  }
  return "unknown";
}

std::optional<GemmPrecision> parse_gemm_precision(std::string_view text) {
  if (text == "fp32") return GemmPrecision::kFp32;
  if (text == "tf32") return GemmPrecision::kTf32;
  if (text == "bf16") return GemmPrecision::kBf16;
  if (text == "fp16") return GemmPrecision::kFp16;
  return std::nullopt;
}

std::int64_t padded_ld(std::int64_t cols) {
  return ceil_div(cols, kWorkspaceLdAlign) * kWorkspaceLdAlign;
}

std::int64_t a_block_elements(bool trans_a, std::int64_t rows, std::int64_t depth) {
  return trans_a ? depth * padded_ld(rows) : rows * padded_ld(depth);
}

std::int64_t b_block_elements(bool trans_b, std::int64_t depth, std::int64_t cols) {
  return trans_b ? cols * padded_ld(depth) : depth * padded_ld(cols);
}

std::int64_t GemmBlocking::blocks() const {
  if (m_block == 0 || n_block == 0 || k_block == 0) return 0;
  return ceil_div(m, m_block) * ceil_div(n, n_block) * ceil_div(k, k_block);
}

GemmBlocking plan_gemm_blocking(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                std::int64_t k, std::int64_t capacity) {
  STRATA_ASSERT(m >= 1 && n >= 1 && k >= 1);
  STRATA_ASSERT(capacity >= kGemmWorkspaceMinElements);
  auto fits = [&](std::int64_t mb, std::int64_t nb, std::int64_t kb) {
    return region(a_block_elements(trans_a, mb, kb)) + region(b_block_elements(trans_b, kb, nb)) <=
           capacity;
  };
  auto make = [&](std::int64_t mb, std::int64_t nb, std::int64_t kb, bool n_outer) {
    GemmBlocking plan;
    plan.m = m;
    plan.n = n;
    plan.k = k;
    plan.m_block = mb;
    plan.n_block = nb;
    plan.k_block = kb;
    plan.n_outer = n_outer;
    plan.a_elements = region(a_block_elements(trans_a, mb, kb));
    plan.b_elements = region(b_block_elements(trans_b, kb, nb));
    return plan;
  };
  if (fits(m, n, k)) return make(m, n, k, true);

  // Full k: one operand whole and the other in blocks (each converted once), when the blocks of
  // the other can be at least 64 wide.
  const std::int64_t nb_a =
      round_block(largest_fitting(n, [&](std::int64_t nb) { return fits(m, nb, k); }), n);
  const std::int64_t mb_b =
      round_block(largest_fitting(m, [&](std::int64_t mb) { return fits(mb, n, k); }), m);
  const bool a_whole = nb_a >= std::min<std::int64_t>(n, 64);
  const bool b_whole = mb_b >= std::min<std::int64_t>(m, 64);
  if (a_whole && (!b_whole || ceil_div(n, nb_a) <= ceil_div(m, mb_b))) {
    return make(m, nb_a, k, true);
  }
  if (b_whole) return make(mb_b, n, k, false);

  // Full k, both operands in square-ish blocks; the operand re-converted per block of the other is
  // chosen to convert fewer elements in all.
  const std::int64_t side = largest_fitting(
      std::max(m, n), [&](std::int64_t s) { return fits(std::min(m, s), std::min(n, s), k); });
  if (side >= 64) {
    const std::int64_t mb = round_block(std::min(m, side), m);
    const std::int64_t nb = round_block(std::min(n, side), n);
    const std::int64_t a_total = a_block_elements(trans_a, m, k);
    const std::int64_t b_total = b_block_elements(trans_b, k, n);
    const std::int64_t n_outer_cost = b_total + ceil_div(n, nb) * a_total;
    const std::int64_t m_outer_cost = a_total + ceil_div(m, mb) * b_total;
    return make(mb, nb, k, n_outer_cost <= m_outer_cost);
  }

  // k itself is too long: 64 x 64 output blocks, k in pieces that accumulate.
  const std::int64_t mb = std::min<std::int64_t>(m, 64);
  const std::int64_t nb = std::min<std::int64_t>(n, 64);
  std::int64_t kb = largest_fitting(k, [&](std::int64_t kk) { return fits(mb, nb, kk); });
  STRATA_ASSERT(kb >= 1);
  if (kb < k && kb >= kWorkspaceLdAlign) kb = kb / kWorkspaceLdAlign * kWorkspaceLdAlign;
  return make(mb, nb, kb, true);
}

ColumnReducePlan plan_column_reduce(std::int64_t rows, std::int64_t cols, int arrays,
                                    std::int64_t scratch_doubles) {
  STRATA_ASSERT(rows >= 1 && cols >= 1 && arrays >= 1);
  const std::int64_t by_scratch = scratch_doubles / (static_cast<std::int64_t>(arrays) * cols);
  if (by_scratch < 1) return {};
  std::int64_t chunks =
      std::min({ceil_div(rows, kColumnReduceMinRows), kColumnReduceMaxChunks, by_scratch});
  chunks = std::max<std::int64_t>(chunks, 1);
  ColumnReducePlan plan;
  plan.rows_per_chunk = ceil_div(rows, chunks);
  plan.chunks = ceil_div(rows, plan.rows_per_chunk);
  return plan;
}

AttentionLaunch plan_attention(std::int64_t head_dim) {
  AttentionLaunch l;
  if (head_dim < 1 || head_dim > kAttentionHeadDimMax) return l;
  const std::int64_t lanes_needed = ceil_div(head_dim, 32);
  l.per_lane = 1;
  while (l.per_lane < lanes_needed)
    l.per_lane *= 2;
  l.padded_dim = l.per_lane * 32;
  l.rows_per_warp = 16 / l.per_lane;
  l.rows_per_block = l.rows_per_warp * kAttentionWarps;
  const int pd = l.padded_dim;
  const int tile = kAttentionKeyTile;
  const int f = static_cast<int>(sizeof(float));
  l.forward_smem_bytes = (l.rows_per_block * pd + tile * (pd + 1) + tile * pd) * f;
  l.dq_smem_bytes = (2 * l.rows_per_block * pd + 2 * tile * (pd + 1)) * f;
  l.dkv_smem_bytes = (2 * l.rows_per_block * pd + 2 * tile * (pd + 1) + 2 * tile) * f;
  return l;
}

std::int64_t elementwise_blocks(std::int64_t n) {
  if (n <= 0) return 1;
  return std::clamp<std::int64_t>(ceil_div(n, kElementwiseThreads), 1, kElementwiseBlocksMax);
}

}  // namespace strata::cuda
