// Flash attention on tensor cores, BACKWARD pass (the FlashAttention-2 design, without atomics):
// from Q, K, V, the forward's output O and its fp32 log-sum-exp, and the output's gradient dO (all
// 16-bit but lse), the gradients dQ, dK and dV in the same 16-bit type. Semantics and layouts are
// the forward's (flash_attention_kernels.cuh) and kernels::attention_backward's: dq has q's stride,
// dk and dv kv's (they may be column ranges of one buffer, as q, k and v), dout and out have
// out_stride; the masking rule is kernels::attention_first_key (causal, sliding window, packed
// documents). The outputs are 16-bit, not fp32 as attention_kernels.cuh's backward writes: the
// issue asks for bf16/fp16 in and out, and the strides are that kernel's, so only the element type
// differs. Where asked (FlashGradsOut), the epilogues also write them widened to fp32, in the
// caller's layout, so a caller keeping fp32 gradients runs no widening kernel after them.
//
// Three kernels, each output element written once, by one thread, after a loop in a fixed order:
//   1. delta: D_t = sum_d dO_td O_td in fp32, d ascending, one thread per (batch, head, query);
//      written to a (B, H, T) fp32 workspace.
//   2. dk/dv: blocks (64-key block, KV head, batch) of 4 warps; warp w owns keys 16w..16w+15 (the M
//      of its mma) and keeps their dK and dV in fp32 registers while it walks the group's query
//      heads h = g * H/KV, g * H/KV + 1, ... in order and, for each, the 32-query tiles (16 for
//      head size 256) from the block's first key up to the first tile no query of which sees the
//      block. Per tile, in the
//      transposed form (so nothing is transposed in registers): S^T = K Q^T and dP^T = V dO^T
//      (A from K / V by ldmatrix.x4, B from Q / dO stored N x K by ldmatrix.x4), then
//      P^T = 2^(S^T scale log2e - lse log2e) masked, dS^T = P^T (dP^T - D), both repacked from the
//      C layout into A fragments rounded to 16 bits, and dV += P^T dO, dK += dS^T Q (B from dO / Q
//      stored K x N by ldmatrix.x4.trans). The epilogue writes scale * dK and dV.
//   3. dq: blocks (64-query block, head, batch) of 4 warps, warp w owning rows 16w..16w+15 as in
//      the forward; walks the 64-key tiles from its first row's lo to its last row, recomputing
//      S = Q K^T and P from lse, dP = dO V^T (B from V stored N x K), dS = P (dP - D), and
//      dQ += dS K (B from K by ldmatrix.x4.trans). The epilogue writes scale * dQ.
//   For head size 256, kernels 2 and 3 each take the output's columns in two blocks of 128
//   (flash_bwd_cols), both computing S and dP over all 256: 16 x 256 accumulators would spill.
// Why the bits do not depend on timing: no floating atomics and no cross-block reduction. dQ's sum
// over keys lives in one warp's registers (kernel 3, key tiles ascending); dK's and dV's sums over
// the queries of every query head of the group live in one warp's registers (kernel 2, heads
// ascending, then query tiles ascending); within a tile each sum is a chain of mma in a fixed
// k-step order. Warps share only the read-only tiles in shared memory, behind barriers. So a
// result is the same whatever order blocks, warps or lanes run in (the emulator runs its fibers
// in alternating orders; the test runs everything twice and compares the bits). P and dS are
// computed twice (kernels 2 and 3) instead of exchanging dQ partial sums.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/flash_attention_kernels.cuh"

// Keep the next loop rolled on the GPU (its body is unrolled inside).
#if defined(STRATA_SIMT_EMULATION)
#define STRATA_FLASH_ROLLED
#else
#define STRATA_FLASH_ROLLED _Pragma("unroll 1")
#endif

STRATA_CUDA_NAMESPACE(cuda_kernels) {

// Queries per tile of the dk/dv kernel: 32, and 16 for head size 256 (with 32, and S^T's k-steps
// unrolled, that kernel spilled 184 bytes; with 16, 64; with 16 and the k-steps rolled in chunks of
// 4, none).
__host__ __device__ constexpr int flash_bwd_queries(int head_dim) {
  return head_dim > 128 ? 16 : 32;
}
// Output columns per block: the whole head up to 128; 256 is split into two blocks of 128 columns,
// each recomputing S and dP over all 256 (the accumulators of 16 x 256 would not fit in registers).
__host__ __device__ constexpr int flash_bwd_cols(int head_dim) {
  return head_dim > 128 ? 128 : head_dim;
}
// The first key of a query past the end of the sequence: no key is at or after it.
inline constexpr std::int64_t kFlashNever = 0x7fffffffffffffff;

// The backward's arguments (strides in elements, as FlashArgs').
struct FlashBackwardArgs {
  const std::uint16_t* q;
  const std::uint16_t* k;
  const std::uint16_t* v;
  const std::uint16_t* out;   // the forward's O, out_stride
  const std::uint16_t* dout;  // dO, out_stride
  const float* lse;           // (B,H,T), natural log
  float* delta;               // (B,H,T) workspace: written by kernel 1, read by 2 and 3
  std::uint16_t* dq;          // dq_stride; or null (dq_wide only)
  std::uint16_t* dk;          // dkv_stride; or null (dk_wide only)
  std::uint16_t* dv;          // dkv_stride; or null (dv_wide only)
  float* dq_wide;             // or null: dq's 16-bit values widened to fp32 too, dq_stride
  float* dk_wide;             // likewise, dkv_stride
  float* dv_wide;             // likewise, dkv_stride
  std::int64_t dq_stride;     // the outputs' row strides (q_stride and kv_stride, unless the
  std::int64_t dkv_stride;    // caller's outputs are laid out otherwise: FlashGradsOut)
  std::int64_t seq_len;
  std::int64_t heads;
  std::int64_t kv_heads;
  std::int64_t head_dim;
  std::int64_t q_stride;
  std::int64_t kv_stride;
  std::int64_t out_stride;
  float scale;
  float scale_log2;               // scale * log2(e)
  std::int64_t window;            // 0 = none
  const std::int32_t* positions;  // (B*T) or null
};

// Kernel 1: delta[(b*H + h)*T + t] = sum_d dO_td O_td, d ascending, in fp32. Blocks (chunk of
// 128 (head, query) pairs, batch).
template <typename E>
__global__ void __launch_bounds__(kFlashThreads) flash_attention_delta_kernel(FlashBackwardArgs a) {
  const std::int64_t T = a.seq_len;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kFlashThreads + threadIdx.x;
  if (i >= a.heads * T) return;
  const std::int64_t t = i % T;
  const std::int64_t h = i / T;
  const std::int64_t b = blockIdx.y;
  const std::int64_t at = (b * T + t) * a.out_stride + h * a.head_dim;
  float acc = 0.0f;
  for (std::int64_t d = 0; d < a.head_dim; ++d)
    acc += flash_widen<E>(a.dout[at + d]) * flash_widen<E>(a.out[at + d]);
  a.delta[b * a.heads * T + i] = acc;
}

// acc[0..2*kTiles) = A (16 rows of `as` from row `a_row`) times the transpose of `bs`'s 8*kTiles
// rows from 0 (both row-major with row stride kStride, k = the kD columns): S = Q K^T, dP = dO V^T.
template <typename E, int kD, int kTiles>
__device__ __forceinline__ void flash_mma_abt(MmaAcc (&acc)[kTiles], const std::uint16_t* as,
                                              const std::uint16_t* bs, int lane) {
  constexpr int kStride = kD + kFlashPad;
  STRATA_UNROLL
  for (int n = 0; n < kTiles; ++n)
    STRATA_UNROLL
  for (int i = 0; i < 4; ++i)
    acc[n].reg[i] = 0.0f;
  // The k-steps in chunks of 4 kept rolled for head size 256 (unrolled, the loads the compiler
  // hoists make the dk/dv kernel spill); one unrolled chunk otherwise.
  constexpr int kChunk = kD > 128 ? 4 : kD / 16;
  STRATA_FLASH_ROLLED
  for (int k0 = 0; k0 < kD / 16; k0 += kChunk) {
    STRATA_UNROLL
    for (int kk = k0; kk < k0 + kChunk; ++kk) {
      MmaA fa;
      const TileIndex ar = ldmatrix_x4_a_row(lane);
      ldmatrix<4>(fa.reg, as + ar.row * kStride + kk * 16 + ar.col);
      STRATA_UNROLL
      for (int np = 0; np < kTiles / 2; ++np) {
        std::uint32_t fb[4];
        const TileIndex br = ldmatrix_x4_b_row(lane);
        ldmatrix<4>(fb, bs + (np * 16 + br.row) * kStride + kk * 16 + br.col);
        flash_mma<E>(acc[2 * np], fa, MmaB{{fb[0], fb[1]}});
        flash_mma<E>(acc[2 * np + 1], fa, MmaB{{fb[2], fb[3]}});
      }
    }
  }
}

// acc (16 x kCols) += A (fragments, 16 x 16*kSteps) times B (16*kSteps rows of `bs` from 0, kCols
// columns, row-major with row stride kD + kFlashPad; ldmatrix.trans): dV += P^T dO, dQ += dS K.
template <typename E, int kD, int kCols, int kSteps>
__device__ __forceinline__ void flash_mma_ab(MmaAcc (&acc)[kCols / 8], const MmaA (&fa)[kSteps],
                                             const std::uint16_t* bs, int lane) {
  constexpr int kStride = kD + kFlashPad;
  STRATA_UNROLL
  for (int kk = 0; kk < kSteps; ++kk) {
    STRATA_UNROLL
    for (int dp = 0; dp < kCols / 16; ++dp) {
      std::uint32_t fb[4];
      const TileIndex br = ldmatrix_x4_trans_b_row(lane);
      ldmatrix_trans<4>(fb, bs + (kk * 16 + br.row) * kStride + dp * 16 + br.col);
      flash_mma<E>(acc[2 * dp], fa[kk], MmaB{{fb[0], fb[1]}});
      flash_mma<E>(acc[2 * dp + 1], fa[kk], MmaB{{fb[2], fb[3]}});
    }
  }
}

// Writes rows of a 16 x kCols C-layout accumulator times `scale`, rounded to 16 bits: this lane's
// rows row0 + groupID and row0 + groupID + 8 of the warp (those < T) at element
// `at` + row * stride of `dst` (16-bit) and of `wide` (widened to fp32), either of them null.
template <typename E, int kCols>
__device__ __forceinline__ void flash_store_rows(std::uint16_t* dst, float* wide, std::int64_t at,
                                                 std::int64_t stride, std::int64_t row0,
                                                 std::int64_t T, const MmaAcc (&acc)[kCols / 8],
                                                 float scale, int lane) {
  STRATA_UNROLL
  for (int r = 0; r < 2; ++r) {
    const std::int64_t row = row0 + mma_c_element(lane, 2 * r).row;
    if (row >= T) continue;
    const std::int64_t row_at = at + row * stride;
    std::uint16_t* out_row = dst != nullptr ? dst + row_at : nullptr;
    float* wide_row = wide != nullptr ? wide + row_at : nullptr;
    STRATA_UNROLL
    for (int n = 0; n < kCols / 8; ++n) {
      const int col = 8 * n + mma_c_element(lane, 2 * r).col;
      flash_store_pair<E>(out_row, wide_row, col,
                          flash_pack<E>(acc[n].reg[2 * r] * scale, acc[n].reg[2 * r + 1] * scale));
    }
  }
}

// Shared memory of the dk/dv kernel: K and V blocks of 64 rows, Q and dO tiles of 32 (16), rows of
// D + 8 16-bit elements; then lse (base 2) and delta of the tile's queries (fp32) and their first
// keys (int64).
constexpr std::size_t flash_dkv_smem_bytes(int head_dim) {
  return static_cast<std::size_t>(2 * kFlashKeys + 2 * flash_bwd_queries(head_dim)) *
             static_cast<std::size_t>(head_dim + kFlashPad) * sizeof(std::uint16_t) +
         static_cast<std::size_t>(flash_bwd_queries(head_dim)) *
             (2 * sizeof(float) + sizeof(std::int64_t));
}
// Shared memory of the dq kernel: Q and dO blocks of 64 rows, K and V tiles of 64.
constexpr std::size_t flash_dq_smem_bytes(int head_dim) {
  return static_cast<std::size_t>(2 * kFlashRows + 2 * kFlashKeys) *
         static_cast<std::size_t>(head_dim + kFlashPad) * sizeof(std::uint16_t);
}

// Kernel 2: dK and dV of one 64-key block of one KV head.
template <typename E, int kD, FlashFault kFault = FlashFault::kNone>
__global__ void __launch_bounds__(kFlashThreads) flash_attention_dkv_kernel(FlashBackwardArgs a) {
  static_assert(kD % 16 == 0 && kD >= 16, "head size: a multiple of 16 (mma k-steps of 16)");
  constexpr int kStride = kD + kFlashPad;
  constexpr int kQ = flash_bwd_queries(kD);
  constexpr int kNTiles = kQ / 8;  // n-tiles of S^T (8 queries each)
  constexpr int kCols = flash_bwd_cols(kD);
  constexpr int kSlices = kD / kCols;
  constexpr int kDTiles = kCols / 8;  // n-tiles of dK, dV (8 dimensions each)
  STRATA_DYNAMIC_SHARED(std::uint16_t, smem);
  std::uint16_t* ks = smem;                                            // kFlashKeys x kStride
  std::uint16_t* vs = ks + kFlashKeys * kStride;                       // kFlashKeys x kStride
  std::uint16_t* qs = vs + kFlashKeys * kStride;                       // kQ x kStride
  std::uint16_t* dos = qs + kQ * kStride;                              // kQ x kStride
  float* lse_s = reinterpret_cast<float*>(dos + kQ * kStride);         // kQ, base 2
  float* delta_s = lse_s + kQ;                                         // kQ
  std::int64_t* lo_s = reinterpret_cast<std::int64_t*>(delta_s + kQ);  // kQ

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const std::int64_t T = a.seq_len;
  const std::int64_t b = blockIdx.z;
  const std::int64_t g = blockIdx.y;
  const std::int64_t group = a.heads / a.kv_heads;
  const std::int64_t s_base = static_cast<std::int64_t>(blockIdx.x / kSlices) * kFlashKeys;
  const int col0 = static_cast<int>(blockIdx.x % kSlices) * kCols;  // this block's columns
  const std::int64_t last_key = (s_base + kFlashKeys < T ? s_base + kFlashKeys : T) - 1;
  const auto valid_rows = [T](std::int64_t first, int rows) {
    return static_cast<int>(T - first < rows ? T - first : rows);
  };
  // This lane's two key rows of every C fragment (groupID and groupID + 8 of the warp's 16).
  std::int64_t key[2];
  STRATA_UNROLL
  for (int r = 0; r < 2; ++r)
    key[r] = s_base + warp * 16 + mma_c_element(lane, 2 * r).row;

  flash_load_tile<kD>(ks, a.k + (b * T + s_base) * a.kv_stride + g * kD, a.kv_stride, kFlashKeys,
                      valid_rows(s_base, kFlashKeys), tid);
  flash_load_tile<kD>(vs, a.v + (b * T + s_base) * a.kv_stride + g * kD, a.kv_stride, kFlashKeys,
                      valid_rows(s_base, kFlashKeys), tid);
  cp_async_commit_group();

  MmaAcc dk[kDTiles];
  MmaAcc dv[kDTiles];
  STRATA_UNROLL
  for (int n = 0; n < kDTiles; ++n)
    STRATA_UNROLL
  for (int i = 0; i < 4; ++i) {
    dk[n].reg[i] = 0.0f;
    dv[n].reg[i] = 0.0f;
  }

  for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (std::int64_t t0 = s_base; t0 < T; t0 += kQ) {
      // No query from here on sees this block's keys (lo never decreases): uniform over the block.
      if (kernels::attention_first_key(a, b, t0) > last_key) break;
      __syncthreads();  // every warp is done with the previous tile
      flash_load_tile<kD>(qs, a.q + (b * T + t0) * a.q_stride + h * kD, a.q_stride, kQ,
                          valid_rows(t0, kQ), tid);
      flash_load_tile<kD>(dos, a.dout + (b * T + t0) * a.out_stride + h * kD, a.out_stride, kQ,
                          valid_rows(t0, kQ), tid);
      cp_async_commit_group();
      if (tid < kQ) {
        const std::int64_t t = t0 + tid;
        const bool in = t < T;
        lse_s[tid] = in ? a.lse[(b * a.heads + h) * T + t] * 1.4426950408889634f : 0.0f;
        delta_s[tid] = in ? a.delta[(b * a.heads + h) * T + t] : 0.0f;
        lo_s[tid] = in ? kernels::attention_first_key(a, b, t) : kFlashNever;
      }
      cp_async_wait_group<0>();
      __syncthreads();

      // S^T = K Q^T and dP^T = V dO^T: the warp's 16 keys by the tile's kQ queries.
      MmaAcc st[kNTiles];
      MmaAcc dpt[kNTiles];
      flash_mma_abt<E, kD, kNTiles>(st, ks + warp * 16 * kStride, qs, lane);
      flash_mma_abt<E, kD, kNTiles>(dpt, vs + warp * 16 * kStride, dos, lane);
      // Element i of st[n]: key key[i / 2], query t0 + 8n + its column. Key s is seen by query t
      // when lo(t) <= s <= t < T (past T, lo_s is kFlashNever: the first test covers t < T).
      STRATA_UNROLL
      for (int n = 0; n < kNTiles; ++n) {
        STRATA_UNROLL
        for (int i = 0; i < 4; ++i) {
          const int j = 8 * n + mma_c_element(lane, i).col;
          const std::int64_t s = key[i / 2];
          const bool visible = lo_s[j] <= s && s <= t0 + j;
          const float p = visible ? exp2f(st[n].reg[i] * a.scale_log2 - lse_s[j]) : 0.0f;
          st[n].reg[i] = p;
          dpt[n].reg[i] = p * (dpt[n].reg[i] - delta_s[j]);
        }
      }
      MmaA pt[kNTiles / 2];
      MmaA dst[kNTiles / 2];
      flash_pack_a<E, kFault, kNTiles>(pt, st);
      flash_pack_a<E, kFault, kNTiles>(dst, dpt);
      // dV += P^T dO, dK += dS^T Q (the tile's queries are the k of both).
      flash_mma_ab<E, kD, kCols, kNTiles / 2>(dv, pt, dos + col0, lane);
      flash_mma_ab<E, kD, kCols, kNTiles / 2>(dk, dst, qs + col0, lane);
    }
  }
  cp_async_wait_group<0>();  // the K/V group, when no tile ran

  const std::int64_t row0 = s_base + warp * 16;
  const std::int64_t at = b * T * a.dkv_stride + g * kD + col0;
  flash_store_rows<E, kCols>(a.dk, a.dk_wide, at, a.dkv_stride, row0, T, dk, a.scale, lane);
  flash_store_rows<E, kCols>(a.dv, a.dv_wide, at, a.dkv_stride, row0, T, dv, 1.0f, lane);
}

// Kernel 3: dQ of one 64-query block of one head.
template <typename E, int kD, FlashFault kFault = FlashFault::kNone>
__global__ void __launch_bounds__(kFlashThreads) flash_attention_dq_kernel(FlashBackwardArgs a) {
  static_assert(kD % 16 == 0 && kD >= 16, "head size: a multiple of 16 (mma k-steps of 16)");
  constexpr int kStride = kD + kFlashPad;
  constexpr int kNTiles = kFlashKeys / 8;  // n-tiles of S (8 keys each)
  constexpr int kCols = flash_bwd_cols(kD);
  constexpr int kSlices = kD / kCols;
  constexpr int kDTiles = kCols / 8;  // n-tiles of dQ
  STRATA_DYNAMIC_SHARED(std::uint16_t, smem);
  std::uint16_t* qs = smem;                        // kFlashRows x kStride
  std::uint16_t* dos = qs + kFlashRows * kStride;  // kFlashRows x kStride
  std::uint16_t* ks = dos + kFlashRows * kStride;  // kFlashKeys x kStride
  std::uint16_t* vs = ks + kFlashKeys * kStride;   // kFlashKeys x kStride

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const std::int64_t T = a.seq_len;
  const std::int64_t b = blockIdx.z;
  const std::int64_t h = blockIdx.y;
  const std::int64_t g = h / (a.heads / a.kv_heads);
  const std::int64_t t0 = static_cast<std::int64_t>(blockIdx.x / kSlices) * kFlashRows;
  const int col0 = static_cast<int>(blockIdx.x % kSlices) * kCols;  // this block's columns
  const std::int64_t t_last = (t0 + kFlashRows < T ? t0 + kFlashRows : T) - 1;
  const std::uint16_t* k_base = a.k + b * T * a.kv_stride + g * kD;
  const std::uint16_t* v_base = a.v + b * T * a.kv_stride + g * kD;
  const auto valid_rows = [T](std::int64_t first, int rows) {
    return static_cast<int>(T - first < rows ? T - first : rows);
  };

  std::int64_t row_t[2];
  std::int64_t row_lo[2];
  float lse2[2];   // lse in base 2
  float delta[2];  // D of the row
  STRATA_UNROLL
  for (int r = 0; r < 2; ++r) {
    row_t[r] = t0 + warp * 16 + mma_c_element(lane, 2 * r).row;
    const bool in = row_t[r] < T;
    row_lo[r] = in ? kernels::attention_first_key(a, b, row_t[r]) : kFlashNever;
    lse2[r] = in ? a.lse[(b * a.heads + h) * T + row_t[r]] * 1.4426950408889634f : 0.0f;
    delta[r] = in ? a.delta[(b * a.heads + h) * T + row_t[r]] : 0.0f;
  }

  flash_load_tile<kD>(qs, a.q + (b * T + t0) * a.q_stride + h * kD, a.q_stride, kFlashRows,
                      valid_rows(t0, kFlashRows), tid);
  flash_load_tile<kD>(dos, a.dout + (b * T + t0) * a.out_stride + h * kD, a.out_stride, kFlashRows,
                      valid_rows(t0, kFlashRows), tid);
  cp_async_commit_group();

  MmaAcc dq[kDTiles];
  STRATA_UNROLL
  for (int n = 0; n < kDTiles; ++n)
    STRATA_UNROLL
  for (int i = 0; i < 4; ++i)
    dq[n].reg[i] = 0.0f;

  for (std::int64_t s0 = kernels::attention_first_key(a, b, t0) / kFlashKeys * kFlashKeys;
       s0 <= t_last; s0 += kFlashKeys) {
    __syncthreads();  // every warp is done with the previous K and V tiles
    flash_load_tile<kD>(ks, k_base + s0 * a.kv_stride, a.kv_stride, kFlashKeys,
                        valid_rows(s0, kFlashKeys), tid);
    flash_load_tile<kD>(vs, v_base + s0 * a.kv_stride, a.kv_stride, kFlashKeys,
                        valid_rows(s0, kFlashKeys), tid);
    cp_async_commit_group();
    cp_async_wait_group<0>();
    __syncthreads();

    MmaAcc s[kNTiles];
    MmaAcc dp[kNTiles];
    flash_mma_abt<E, kD, kNTiles>(s, qs + warp * 16 * kStride, ks, lane);
    flash_mma_abt<E, kD, kNTiles>(dp, dos + warp * 16 * kStride, vs, lane);
    // Element i of s[n]: row row_t[i / 2], key s0 + 8n + its column (past T, row_lo is
    // kFlashNever: no key is visible).
    STRATA_UNROLL
    for (int n = 0; n < kNTiles; ++n) {
      STRATA_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int r = i / 2;
        const std::int64_t key = s0 + 8 * n + mma_c_element(lane, i).col;
        const bool visible = key >= row_lo[r] && key <= row_t[r];
        const float p = visible ? exp2f(s[n].reg[i] * a.scale_log2 - lse2[r]) : 0.0f;
        dp[n].reg[i] = p * (dp[n].reg[i] - delta[r]);
      }
    }
    MmaA ds[kNTiles / 2];
    flash_pack_a<E, kFault, kNTiles>(ds, dp);
    flash_mma_ab<E, kD, kCols, kNTiles / 2>(dq, ds, ks + col0, lane);
  }
  cp_async_wait_group<0>();

  flash_store_rows<E, kCols>(a.dq, a.dq_wide, (b * T) * a.dq_stride + h * kD + col0, a.dq_stride,
                             t0 + warp * 16, T, dq, a.scale, lane);
}

// Whether the backward takes this shape: the forward's conditions (head sizes 64, 80, 96, 128,
// 256), and out_stride a multiple of 8 elements too (dO is copied by cp.async).
inline bool flash_attention_backward_supported(const kernels::AttentionShape& s) {
  return flash_attention_supported(s) && s.out_stride % 8 == 0;
}

inline FlashBackwardArgs flash_attention_backward_args(const kernels::AttentionShape& shape) {
  FlashBackwardArgs a{};
  a.seq_len = shape.seq_len;
  a.heads = shape.heads;
  a.kv_heads = shape.kv_heads;
  a.head_dim = shape.head_dim;
  a.q_stride = a.dq_stride = shape.q_stride;
  a.kv_stride = a.dkv_stride = shape.kv_stride;
  a.out_stride = shape.out_stride;
  a.scale = static_cast<float>(shape.scale);
  a.scale_log2 = static_cast<float>(shape.scale * 1.4426950408889634);
  a.window = shape.window;
  a.positions = shape.positions;
  return a;
}

template <typename E, int kD, FlashFault kFault, typename L>
auto run_flash_attention_backward_d(const L& launch, const FlashBackwardArgs& a,
                                    const kernels::AttentionShape& shape) {
  const auto T = static_cast<unsigned>(shape.seq_len);
  constexpr unsigned kSlices = kD / flash_bwd_cols(kD);
  const auto batch = static_cast<unsigned>(shape.batch);
  const auto pairs = static_cast<unsigned>(shape.heads * shape.seq_len);
  auto err = launch(flash_attention_delta_kernel<E>,
                    dim3((pairs + kFlashThreads - 1) / kFlashThreads, batch), dim3(kFlashThreads),
                    std::size_t{0}, a);
  if (!launched(err)) return err;
  err = launch(flash_attention_dkv_kernel<E, kD, kFault>,
               dim3((T + kFlashKeys - 1) / kFlashKeys * kSlices,
                    static_cast<unsigned>(shape.kv_heads), batch),
               dim3(kFlashThreads), flash_dkv_smem_bytes(kD), a);
  if (!launched(err)) return err;
  return launch(
      flash_attention_dq_kernel<E, kD, kFault>,
      dim3((T + kFlashRows - 1) / kFlashRows * kSlices, static_cast<unsigned>(shape.heads), batch),
      dim3(kFlashThreads), flash_dq_smem_bytes(kD), a);
}

// Where the backward's gradients go besides (or instead of) the 16-bit dq, dk, dv: fp32 arrays
// receiving their 16-bit values widened (each may be null), and the row strides of both kinds of
// output (0: the inputs' q_stride and kv_stride).
struct FlashGradsOut {
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  std::int64_t dq_stride = 0, dkv_stride = 0;
};

// The backward pass for shape.head_dim (64, 80, 96, 128 or 256; flash_attention_backward_supported
// checked). WRITES dq, dk, dv (16-bit, strides q_stride / kv_stride, or `wide`'s) and delta (B*H*T
// floats of workspace), and wide.dq, wide.dk, wide.dv where given (then the 16-bit pointer beside
// each may be null); dout and out have out_stride; lse is the forward's.
template <typename E, FlashFault kFault = FlashFault::kNone, typename L>
auto run_flash_attention_backward(const L& launch, std::uint16_t* dq, std::uint16_t* dk,
                                  std::uint16_t* dv, float* delta, const std::uint16_t* dout,
                                  const std::uint16_t* out, const float* lse,
                                  const std::uint16_t* q, const std::uint16_t* k,
                                  const std::uint16_t* v, const kernels::AttentionShape& shape,
                                  const FlashGradsOut& wide = {}) {
  FlashBackwardArgs a = flash_attention_backward_args(shape);
  a.dq_wide = wide.dq;
  a.dk_wide = wide.dk;
  a.dv_wide = wide.dv;
  if (wide.dq_stride != 0) a.dq_stride = wide.dq_stride;
  if (wide.dkv_stride != 0) a.dkv_stride = wide.dkv_stride;
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.dout = dout;
  a.lse = lse;
  a.delta = delta;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  switch (shape.head_dim) {
    case 64:
      return run_flash_attention_backward_d<E, 64, kFault>(launch, a, shape);
    case 80:
      return run_flash_attention_backward_d<E, 80, kFault>(launch, a, shape);
    case 96:
      return run_flash_attention_backward_d<E, 96, kFault>(launch, a, shape);
    case 128:
      return run_flash_attention_backward_d<E, 128, kFault>(launch, a, shape);
    default:
      return run_flash_attention_backward_d<E, 256, kFault>(launch, a, shape);
  }
}

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)

#undef STRATA_FLASH_ROLLED
