// Flash attention on tensor cores, FORWARD pass (the FlashAttention-2 design): Q, K, V in bf16 or
// fp16, the output O in the same type and the fp32 log-sum-exp of every softmax row (for a later
// backward). S = Q K^T and O += P V run as mma.sync m16n8k16 with fp32 accumulators
// (kernels/cuda/tensor_core.cuh); the softmax is online, in fp32: each row keeps its running max
// and sum, and the accumulators are rescaled when the max grows, so no T x T matrix exists.
//
// Semantics are those of kernels/cpu/attention.cc and attention_kernels.cuh (kernels/cpu/nn_ops.h,
// AttentionShape): causal, query head h reads KV head h / (H / KV), query t sees the keys
// [lo(t), t] with lo = attention_first_key's rule (packed documents through positions, sliding
// window through window). Layouts (strides in elements): row r = b*T + t of q holds H heads of D
// values at q + r*q_stride; k and v hold KV heads at r*kv_stride; out at r*out_stride; lse is
// (B, H, T), natural log. Needs (flash_attention_supported): D one of the instantiated head sizes
// (64, 80, 96, 128, 256),
// strides multiples of 8 elements and q, k, v 16-byte aligned (cp.async copies 16 bytes).
//
// Mapping: a block of 4 warps takes 64 query rows of one (batch, query head); warp w owns rows
// 16w..16w+15 (the M of its mma). The block walks 64-key tiles of K and V from the tile holding
// its first row's lo to the tile holding its last row (lo never decreases along a row). Shared
// memory holds the Q tile and one K and one V tile, row-major (row = position, column = head
// dimension), rows padded by 8 elements so that the 8 row addresses of each ldmatrix fall in
// different banks. Per K/V tile:
//   1. wait for K (cp.async group), barrier;
//   2. S (16 x 64 per warp) = Q K^T: A from Q by ldmatrix.x4, B from K (stored N x K, i.e. K's
//      rows are B's columns) by ldmatrix.x4; 8 n-tiles of 8 keys, D/16 k-steps;
//   3. barrier (every warp is done with K), start copying the next K tile into the same buffer;
//   4. online softmax on S's accumulators: mask, row max over the quad of lanes sharing a row,
//      rescale O and the running sum, P = exp(S - max) rounded to 16 bits, repacked in registers
//      from the accumulator layout (C) into the A layout of the next mma;
//   5. wait for V, barrier; O (16 x D per warp) += P V: B from V (stored K x N) by ldmatrix.x4
//      .trans; D/8 n-tiles, 4 k-steps of 16 keys;
//   6. barrier (every warp is done with V), start copying the next V tile.
// The epilogue divides O by the row sum, rounds to 16 bits and writes O and lse; where asked, it
// also writes O's 16-bit values widened to fp32 (out_wide), so a caller keeping fp32 activations
// needs no widening kernel after it (flash_attention_f32.cuh).
// Launch functions are generic over the launcher (device_math.cuh), so the tests run this source
// under the SIMT emulator (tests/kernels/flash_attention_emulated_test.cc).
#pragma once

#include <cstdint>

#include "kernels/cpu/nn_ops.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/tensor_core.cuh"

#if !defined(STRATA_SIMT_EMULATION)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "kernels/cuda/cuda_namespace.h"
#endif

STRATA_CUDA_NAMESPACE(cuda_kernels) {

// The 16-bit element types the kernel takes (storage is std::uint16_t, the bits).
struct FlashBf16 {
  static constexpr bool kBf16 = true;
};
struct FlashFp16 {
  static constexpr bool kBf16 = false;
};

// A deliberate fault for the tests' mutation check (never used outside them): kSwapPRows packs
// P's A fragment with registers 1 and 2 exchanged (rows g + 8 and columns + 8 of the 16 x 16 tile);
// in the backward (flash_attention_backward_kernels.cuh), P's and dS's A fragments.
enum class FlashFault { kNone, kSwapPRows };

inline constexpr int kFlashWarps = 4;
inline constexpr int kFlashThreads = kFlashWarps * 32;
inline constexpr int kFlashRows = kFlashWarps * 16;  // query rows per block
inline constexpr int kFlashKeys = 64;                // keys per K/V tile
inline constexpr int kFlashPad = 8;                  // elements of padding per shared row

// Shared memory of the forward kernel: Q, K and V tiles of 64 rows of D + 8 16-bit elements.
constexpr std::size_t flash_forward_smem_bytes(int head_dim) {
  return static_cast<std::size_t>(kFlashRows + 2 * kFlashKeys) *
         static_cast<std::size_t>(head_dim + kFlashPad) * sizeof(std::uint16_t);
}

// The forward kernel's arguments (strides in elements; see the layout above).
struct FlashArgs {
  const std::uint16_t* q;  // (B*T) rows of q_stride: H heads of D
  const std::uint16_t* k;  // (B*T) rows of kv_stride: KV heads of D
  const std::uint16_t* v;  // (B*T) rows of kv_stride: KV heads of D
  std::uint16_t* out;      // (B*T) rows of out_stride: H heads of D; or null (out_wide only)
  float* out_wide;         // or null: O's 16-bit values widened to fp32 too, rows of out_stride
  float* lse;              // (B,H,T)
  std::int64_t seq_len;
  std::int64_t heads;
  std::int64_t kv_heads;
  std::int64_t q_stride;
  std::int64_t kv_stride;
  std::int64_t out_stride;
  float scale_log2;               // scale * log2(e): scores are kept in base 2
  std::int64_t window;            // 0 = none
  const std::int32_t* positions;  // (B*T) or null
};

// Two floats rounded (to nearest even) to the 16-bit type, `lo` in the low half.
template <typename E>
__device__ __forceinline__ std::uint32_t flash_pack(float lo, float hi) {
#if defined(STRATA_SIMT_EMULATION)
  if constexpr (E::kBf16) {
    return pack_16x2(float_to_bf16_bits(lo), float_to_bf16_bits(hi));
  } else {
    return pack_16x2(float_to_fp16_bits(lo), float_to_fp16_bits(hi));
  }
#else
  if constexpr (E::kBf16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
#endif
}

// A 16-bit value of the kernel's type widened to fp32 (exact).
template <typename E>
__device__ __forceinline__ float flash_widen(std::uint16_t h) {
  if constexpr (E::kBf16) {
    return bf16_bits_to_float(h);
  } else {
    return fp16_bits_to_float(h);
  }
}

// Stores two adjacent results packed by flash_pack (`pair`, the first in the low half) at element
// `at` of a row: the 16-bit bits into `narrow`, their fp32 widening into `wide`; either may be
// null.
template <typename E>
__device__ __forceinline__ void flash_store_pair(std::uint16_t* narrow, float* wide,
                                                 std::int64_t at, std::uint32_t pair) {
  const auto lo = static_cast<std::uint16_t>(pair & 0xffffu);
  const auto hi = static_cast<std::uint16_t>(pair >> 16);
  if (narrow != nullptr) {
    narrow[at] = lo;
    narrow[at + 1] = hi;
  }
  if (wide != nullptr) {
    wide[at] = flash_widen<E>(lo);
    wide[at + 1] = flash_widen<E>(hi);
  }
}

// C-layout tiles (8 columns each) as the A fragments of the next mma, rounded to 16 bits: tiles
// 2kk and 2kk + 1 make k-step kk's fragment (mma_a_element: register 0 = tile 2kk c0 c1,
// 1 = tile 2kk c2 c3, 2 = tile 2kk+1 c0 c1, 3 = tile 2kk+1 c2 c3). One tile, `n`, into
// dst = the fragment of k-step n / 2:
template <typename E>
__device__ __forceinline__ void flash_pack_a_tile(MmaA& dst, int n, const MmaAcc& src) {
  const int up = n % 2 == 0 ? 0 : 2;
  dst.reg[up] = flash_pack<E>(src.reg[0], src.reg[1]);
  dst.reg[up + 1] = flash_pack<E>(src.reg[2], src.reg[3]);
}

// kFault's mutation of packed A fragments: registers 1 and 2 exchanged (rows groupID + 8 and
// columns + 8 of each 16 x 16 tile trade places); nothing without a fault.
template <FlashFault kFault, int kSteps>
__device__ __forceinline__ void flash_fault_a(MmaA (&a)[kSteps]) {
  if constexpr (kFault == FlashFault::kSwapPRows) {
    STRATA_UNROLL
    for (int kk = 0; kk < kSteps; ++kk) {
      const std::uint32_t x = a[kk].reg[1];
      a[kk].reg[1] = a[kk].reg[2];
      a[kk].reg[2] = x;
    }
  }
}

// All kTiles tiles of `src` at once, then kFault's mutation.
template <typename E, FlashFault kFault, int kTiles>
__device__ __forceinline__ void flash_pack_a(MmaA (&dst)[kTiles / 2], const MmaAcc (&src)[kTiles]) {
  STRATA_UNROLL
  for (int n = 0; n < kTiles; ++n)
    flash_pack_a_tile<E>(dst[n / 2], n, src[n]);
  flash_fault_a<kFault>(dst);
}

template <typename E>
__device__ __forceinline__ void flash_mma(MmaAcc& d, const MmaA& a, const MmaB& b) {
  if constexpr (E::kBf16) {
    mma_m16n8k16_bf16(d, a, b, d);
  } else {
    mma_m16n8k16_f16(d, a, b, d);
  }
}

// Starts copying `rows` rows of kD 16-bit elements, row r from src + r*stride, into shared dst
// (row stride kD + kFlashPad); rows at or past `valid` are zero-filled (nothing read).
template <int kD>
__device__ __forceinline__ void flash_load_tile(std::uint16_t* dst, const std::uint16_t* src,
                                                std::int64_t stride, int rows, int valid, int tid) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  for (int c = tid; c < rows * kChunks; c += kFlashThreads) {
    const int r = c / kChunks;
    const int col = (c - r * kChunks) * 8;
    const bool in = r < valid;
    cp_async_cg_zfill(dst + r * (kD + kFlashPad) + col, in ? src + r * stride + col : src,
                      in ? 16 : 0);
  }
}

template <typename E, int kD, FlashFault kFault = FlashFault::kNone>
__global__ void __launch_bounds__(kFlashThreads) flash_attention_forward_kernel(FlashArgs a) {
  static_assert(kD % 16 == 0 && kD >= 16, "head size: a multiple of 16 (mma k-steps of 16)");
  constexpr int kStride = kD + kFlashPad;  // shared row stride, elements (16-byte multiple)
  constexpr int kNTiles = kFlashKeys / 8;  // n-tiles of S (8 keys each)
  constexpr int kOTiles = kD / 8;          // n-tiles of O (8 dimensions each)
  STRATA_DYNAMIC_SHARED(std::uint16_t, smem);
  std::uint16_t* qs = smem;                       // kFlashRows x kStride
  std::uint16_t* ks = qs + kFlashRows * kStride;  // kFlashKeys x kStride
  std::uint16_t* vs = ks + kFlashKeys * kStride;  // kFlashKeys x kStride

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const std::int64_t T = a.seq_len;
  const std::int64_t b = blockIdx.z;
  const std::int64_t h = blockIdx.y;
  const std::int64_t g = h / (a.heads / a.kv_heads);
  const std::int64_t t0 = static_cast<std::int64_t>(blockIdx.x) * kFlashRows;
  const std::int64_t t_last = (t0 + kFlashRows < T ? t0 + kFlashRows : T) - 1;
  const std::uint16_t* k_base = a.k + b * T * a.kv_stride + g * kD;
  const std::uint16_t* v_base = a.v + b * T * a.kv_stride + g * kD;
  const auto valid_rows = [T](std::int64_t first, int rows) {
    return static_cast<int>(T - first < rows ? T - first : rows);
  };

  // This lane's two rows of every C fragment: groupID and groupID + 8 of the warp's 16
  // (mma_c_element).
  std::int64_t row_t[2];
  std::int64_t row_lo[2];
  STRATA_UNROLL
  for (int r = 0; r < 2; ++r) {
    row_t[r] = t0 + warp * 16 + mma_c_element(lane, 2 * r).row;
    row_lo[r] = row_t[r] < T ? kernels::attention_first_key(a, b, row_t[r]) : 0;
  }

  // Prologue: the Q tile and the first K tile (group 1), the first V tile (group 2).
  const std::int64_t s_first = kernels::attention_first_key(a, b, t0) / kFlashKeys * kFlashKeys;
  flash_load_tile<kD>(qs, a.q + (b * T + t0) * a.q_stride + h * kD, a.q_stride, kFlashRows,
                      valid_rows(t0, kFlashRows), tid);
  flash_load_tile<kD>(ks, k_base + s_first * a.kv_stride, a.kv_stride, kFlashKeys,
                      valid_rows(s_first, kFlashKeys), tid);
  cp_async_commit_group();
  flash_load_tile<kD>(vs, v_base + s_first * a.kv_stride, a.kv_stride, kFlashKeys,
                      valid_rows(s_first, kFlashKeys), tid);
  cp_async_commit_group();

  MmaAcc o[kOTiles];  // O, 16 x kD per warp, C layout
  STRATA_UNROLL
  for (int n = 0; n < kOTiles; ++n)
    STRATA_UNROLL
  for (int i = 0; i < 4; ++i)
    o[n].reg[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of each row (base-2 scores)
  float l[2] = {0.0f, 0.0f};            // running sum of this lane's columns of each row

  for (std::int64_t s0 = s_first; s0 <= t_last; s0 += kFlashKeys) {
    const bool more = s0 + kFlashKeys <= t_last;
    // 1. K (and, the first time, Q) has landed for every thread.
    cp_async_wait_group<1>();
    __syncthreads();

    // 2. S = Q K^T for the warp's 16 rows and the tile's 64 keys.
    MmaAcc s[kNTiles];
    STRATA_UNROLL
    for (int n = 0; n < kNTiles; ++n)
      STRATA_UNROLL
    for (int i = 0; i < 4; ++i)
      s[n].reg[i] = 0.0f;
    STRATA_UNROLL
    for (int kk = 0; kk < kD / 16; ++kk) {
      MmaA qa;
      const TileIndex qr = ldmatrix_x4_a_row(lane);
      ldmatrix<4>(qa.reg, qs + (warp * 16 + qr.row) * kStride + kk * 16 + qr.col);
      STRATA_UNROLL
      for (int np = 0; np < kNTiles / 2; ++np) {
        std::uint32_t kb[4];
        const TileIndex kr = ldmatrix_x4_b_row(lane);
        ldmatrix<4>(kb, ks + (np * 16 + kr.row) * kStride + kk * 16 + kr.col);
        flash_mma<E>(s[2 * np], qa, MmaB{{kb[0], kb[1]}});
        flash_mma<E>(s[2 * np + 1], qa, MmaB{{kb[2], kb[3]}});
      }
    }

    // 3. Every warp is done with K: start the next K tile into the same buffer.
    __syncthreads();
    if (more) {
      flash_load_tile<kD>(ks, k_base + (s0 + kFlashKeys) * a.kv_stride, a.kv_stride, kFlashKeys,
                          valid_rows(s0 + kFlashKeys, kFlashKeys), tid);
      cp_async_commit_group();
    }

    // 4. Online softmax. Element i of s[n] is row row_t[i / 2], key s0 + 8n + its column.
    float tile_max[2] = {-INFINITY, -INFINITY};
    STRATA_UNROLL
    for (int n = 0; n < kNTiles; ++n) {
      STRATA_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int r = i / 2;
        const std::int64_t key = s0 + 8 * n + mma_c_element(lane, i).col;
        const bool visible = key <= row_t[r] && key >= row_lo[r];
        s[n].reg[i] = visible ? s[n].reg[i] * a.scale_log2 : -INFINITY;
        tile_max[r] = fmaxf(tile_max[r], s[n].reg[i]);
      }
    }
    float base[2];  // what exp2 subtracts: the new max, or 0 while a row has seen no key
    STRATA_UNROLL
    for (int r = 0; r < 2; ++r) {
      // The four lanes of a quad (lane / 4 equal) hold the same two rows.
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(kFullMask, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(kFullMask, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      base[r] = m_new == -INFINITY ? 0.0f : m_new;
      const float correction = exp2f(m[r] - base[r]);  // 0 while m is -inf
      m[r] = m_new;
      l[r] *= correction;
      STRATA_UNROLL
      for (int n = 0; n < kOTiles; ++n) {
        o[n].reg[2 * r] *= correction;
        o[n].reg[2 * r + 1] *= correction;
      }
    }
    // P = exp2(S - max); the sum takes P in fp32, the mma its 16-bit rounding. Keys 16kk..16kk+15
    // are n-tiles 2kk, 2kk + 1 of S; as the A fragment of O's k-step kk (mma_a_element: a0..a3
    // are columns 0-7, a4..a7 columns 8-15; a0, a1, a4, a5 row groupID, the rest groupID + 8):
    // register 0 = s[2kk] c0 c1, 1 = s[2kk] c2 c3, 2 = s[2kk+1] c0 c1, 3 = s[2kk+1] c2 c3. Packed
    // tile by tile as P is computed (flash_pack_a_tile): packing after the loop (flash_pack_a)
    // moves ptxas's register counts (+5 at head size 128, -12 at 64 on sm_80).
    MmaA p[kNTiles / 2];
    STRATA_UNROLL
    for (int n = 0; n < kNTiles; ++n) {
      STRATA_UNROLL
      for (int i = 0; i < 4; ++i) {
        s[n].reg[i] = exp2f(s[n].reg[i] - base[i / 2]);
        l[i / 2] += s[n].reg[i];
      }
      flash_pack_a_tile<E>(p[n / 2], n, s[n]);
    }
    flash_fault_a<kFault>(p);

    // 5. V has landed (the older of the pending groups when the next K is in flight).
    if (more) {
      cp_async_wait_group<1>();
    } else {
      cp_async_wait_group<0>();
    }
    __syncthreads();
    STRATA_UNROLL
    for (int kk = 0; kk < kFlashKeys / 16; ++kk) {
      STRATA_UNROLL
      for (int dp = 0; dp < kD / 16; ++dp) {
        std::uint32_t vb[4];
        const TileIndex vr = ldmatrix_x4_trans_b_row(lane);
        ldmatrix_trans<4>(vb, vs + (kk * 16 + vr.row) * kStride + dp * 16 + vr.col);
        flash_mma<E>(o[2 * dp], p[kk], MmaB{{vb[0], vb[1]}});
        flash_mma<E>(o[2 * dp + 1], p[kk], MmaB{{vb[2], vb[3]}});
      }
    }

    // 6. Every warp is done with V: start the next V tile.
    __syncthreads();
    if (more) {
      flash_load_tile<kD>(vs, v_base + (s0 + kFlashKeys) * a.kv_stride, a.kv_stride, kFlashKeys,
                          valid_rows(s0 + kFlashKeys, kFlashKeys), tid);
      cp_async_commit_group();
    }
  }

  // Epilogue: the row sums over the quad; O / sum rounded to 16 bits; lse = ln(sum) + max ln 2.
  STRATA_UNROLL
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(kFullMask, l[r], 1);
    l[r] += __shfl_xor_sync(kFullMask, l[r], 2);
    if (row_t[r] >= T) continue;
    const float inv = 1.0f / l[r];
    const std::int64_t row = (b * T + row_t[r]) * a.out_stride + h * kD;
    std::uint16_t* out_row = a.out != nullptr ? a.out + row : nullptr;
    float* wide_row = a.out_wide != nullptr ? a.out_wide + row : nullptr;
    STRATA_UNROLL
    for (int n = 0; n < kOTiles; ++n) {
      const int col = 8 * n + mma_c_element(lane, 2 * r).col;
      flash_store_pair<E>(out_row, wide_row, col,
                          flash_pack<E>(o[n].reg[2 * r] * inv, o[n].reg[2 * r + 1] * inv));
    }
    if (lane % 4 == 0) {
      a.lse[(b * a.heads + h) * T + row_t[r]] = m[r] * 0.69314718055994531f + logf(l[r]);
    }
  }
}

// Whether the forward kernel takes this shape: an instantiated head size, strides a multiple of
// 8 elements (16-byte rows for cp.async; the pointers must be 16-byte aligned too).
inline bool flash_attention_supported(const kernels::AttentionShape& s) {
  const bool head = s.head_dim == 64 || s.head_dim == 80 || s.head_dim == 96 || s.head_dim == 128 ||
                    s.head_dim == 256;
  return head && s.q_stride % 8 == 0 && s.kv_stride % 8 == 0 && s.heads % s.kv_heads == 0;
}

inline FlashArgs flash_attention_args(const kernels::AttentionShape& shape) {
  FlashArgs a{};
  a.seq_len = shape.seq_len;
  a.heads = shape.heads;
  a.kv_heads = shape.kv_heads;
  a.q_stride = shape.q_stride;
  a.kv_stride = shape.kv_stride;
  a.out_stride = shape.out_stride;
  a.scale_log2 = static_cast<float>(shape.scale * 1.4426950408889634);
  a.window = shape.window;
  a.positions = shape.positions;
  return a;
}

// Launches the forward kernel for head size kD (shape.head_dim must be kD): blocks
// (query block of 64 rows, head, batch), 128 threads.
template <typename E, int kD, FlashFault kFault = FlashFault::kNone, typename L>
auto run_flash_attention_forward_d(const L& launch, std::uint16_t* out, float* lse,
                                   const std::uint16_t* q, const std::uint16_t* k,
                                   const std::uint16_t* v, const kernels::AttentionShape& shape,
                                   float* out_wide = nullptr) {
  FlashArgs a = flash_attention_args(shape);
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.out_wide = out_wide;
  a.lse = lse;
  const dim3 grid(static_cast<unsigned>((shape.seq_len + kFlashRows - 1) / kFlashRows),
                  static_cast<unsigned>(shape.heads), static_cast<unsigned>(shape.batch));
  return launch(flash_attention_forward_kernel<E, kD, kFault>, grid, dim3(kFlashThreads),
                flash_forward_smem_bytes(kD), a);
}

// The forward pass for shape.head_dim (64, 80, 96, 128 or 256; flash_attention_supported checked).
// `out_wide`, where given, receives O widened to fp32 (rows of shape.out_stride, as out); `out` may
// then be null.
template <typename E, FlashFault kFault = FlashFault::kNone, typename L>
auto run_flash_attention_forward(const L& launch, std::uint16_t* out, float* lse,
                                 const std::uint16_t* q, const std::uint16_t* k,
                                 const std::uint16_t* v, const kernels::AttentionShape& shape,
                                 float* out_wide = nullptr) {
  switch (shape.head_dim) {
    case 64:
      return run_flash_attention_forward_d<E, 64, kFault>(launch, out, lse, q, k, v, shape,
                                                          out_wide);
    case 80:
      return run_flash_attention_forward_d<E, 80, kFault>(launch, out, lse, q, k, v, shape,
                                                          out_wide);
    case 96:
      return run_flash_attention_forward_d<E, 96, kFault>(launch, out, lse, q, k, v, shape,
                                                          out_wide);
    case 128:
      return run_flash_attention_forward_d<E, 128, kFault>(launch, out, lse, q, k, v, shape,
                                                           out_wide);
    default:
      return run_flash_attention_forward_d<E, 256, kFault>(launch, out, lse, q, k, v, shape,
                                                           out_wide);
  }
}

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
