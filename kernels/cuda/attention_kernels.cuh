// Causal attention with grouped KV heads, flash-style, fp32 on CUDA cores (no tensor cores yet):
// online softmax over 32-key tiles held in shared memory, so no T x T matrix ever exists.
//
// Mapping (launch_plan.h's AttentionLaunch): blocks of 4 warps. A warp owns rows_per_warp rows; for
// scores, lane j takes key j of the tile (a full dot product over D from shared memory: K rows are
// padded to PD + 1 floats so the 32 lanes hit 32 banks); for the weighted sums, lane l owns
// dimensions l, l + 32, ... of the row (PER_LANE registers per row), and the tile's 32 weights are
// broadcast with shuffles.
//   forward : blocks (query block, head, batch); writes out and lse.
//   dq      : blocks (query block, head, batch); recomputes P from lse, writes dq.
//   dk, dv  : blocks (key block, KV head, batch); walks the group's query heads and the query
//             tiles at or after its keys, lane = query; writes dk, dv.
// Every output element is written by one thread after a fixed-order loop: deterministic, no
// atomics. delta_i = dO_i . O_i is recomputed where needed, so no scratch is used. The launch
// functions are generic over the launcher (device_math.cuh).
// Packed documents and sliding windows (kernels/cpu/nn_ops.h) give query t the keys [lo(t), t];
// lo never decreases along a row, so the forward and dq passes start at the key tile of their
// first row's lo, and the dk/dv pass stops at the first query tile whose lo is past its keys.
#pragma once

#include "kernels/cpu/nn_ops.h"
#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch_plan.h"

STRATA_CUDA_NAMESPACE(cuda_kernels) {
namespace {

using kernels::AttentionShape;

constexpr int kWarps = cuda::kAttentionWarps;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = cuda::kAttentionKeyTile;

struct AttnArgs {
  const float* q;
  const float* k;
  const float* v;
  const float* out;   // forward output (backward input)
  const float* lse;   // (B,H,T)
  const float* dout;  // (backward)
  float* out_w;       // forward: out
  float* lse_w;       // forward: lse
  float* dq;
  float* dk;
  float* dv;
  std::int64_t seq_len;
  std::int64_t heads;
  std::int64_t kv_heads;
  std::int64_t head_dim;
  std::int64_t q_stride;
  std::int64_t kv_stride;
  std::int64_t out_stride;
  float scale;
  std::int64_t window;            // 0 = none
  const std::int32_t* positions;  // (B*T) or null
};

template <int PL>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(AttnArgs a) {
  constexpr int R = 16 / PL;
  constexpr int kRows = kWarps * R;
  constexpr int PD = 32 * PL;
  STRATA_DYNAMIC_SHARED(float, smem);
  float* qs = smem;                   // kRows x PD
  float* ks = qs + kRows * PD;        // kTile x (PD + 1)
  float* vs = ks + kTile * (PD + 1);  // kTile x PD

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const std::int64_t T = a.seq_len;
  const std::int64_t D = a.head_dim;
  const std::int64_t b = blockIdx.z;
  const std::int64_t h = blockIdx.y;
  const std::int64_t g = h / (a.heads / a.kv_heads);
  const std::int64_t t0 = static_cast<std::int64_t>(blockIdx.x) * kRows;

  for (int idx = tid; idx < kRows * PD; idx += kThreads) {
    const int r = idx / PD;
    const int d = idx - r * PD;
    const std::int64_t t = t0 + r;
    qs[idx] = (t < T && d < D) ? a.q[(b * T + t) * a.q_stride + h * D + d] : 0.0f;
  }
  float m[R];
  float l[R];
  float o[R][PL];
  std::int64_t lo[R];
  STRATA_UNROLL
  for (int i = 0; i < R; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
    const std::int64_t t = t0 + warp * R + i;
    lo[i] = t < T ? kernels::attention_first_key(a, b, t) : 0;
    STRATA_UNROLL
    for (int p = 0; p < PL; ++p)
      o[i][p] = 0.0f;
  }
  const std::int64_t last_row = (t0 + kRows < T ? t0 + kRows : T) - 1;
  for (std::int64_t s0 = kernels::attention_first_key(a, b, t0) / kTile * kTile; s0 <= last_row;
       s0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and qs is written, first time)
    for (int idx = tid; idx < kTile * PD; idx += kThreads) {
      const int j = idx / PD;
      const int d = idx - j * PD;
      const std::int64_t s = s0 + j;
      const bool valid = s < T && d < D;
      const std::int64_t off = (b * T + s) * a.kv_stride + g * D + d;
      ks[j * (PD + 1) + d] = valid ? a.k[off] : 0.0f;
      vs[j * PD + d] = valid ? a.v[off] : 0.0f;
    }
    __syncthreads();
    STRATA_UNROLL
    for (int i = 0; i < R; ++i) {
      const int r = warp * R + i;
      const std::int64_t t = t0 + r;
      // Uniform across the warp; a tile that is not skipped holds at least one of the row's keys.
      if (t >= T || s0 > t || s0 + kTile <= lo[i]) continue;
      const bool ok = s0 + lane <= t && s0 + lane >= lo[i];
      float score = -INFINITY;
      if (ok) {
        const float* qr = qs + r * PD;
        const float* kr = ks + lane * (PD + 1);
        float dot = 0.0f;
        for (int d = 0; d < D; ++d)
          dot += qr[d] * kr[d];
        score = dot * a.scale;
      }
      const float m_new = fmaxf(m[i], warp_max(score));  // some lane's key is valid: finite
      const float p = ok ? expf(score - m_new) : 0.0f;
      const float correction = expf(m[i] - m_new);
      l[i] = l[i] * correction + warp_sum(p);
      m[i] = m_new;
      const int valid = static_cast<int>(t - s0 + 1 < kTile ? t - s0 + 1 : kTile);
      STRATA_UNROLL
      for (int pp = 0; pp < PL; ++pp)
        o[i][pp] *= correction;
      for (int jj = 0; jj < valid; ++jj) {
        const float pj = __shfl_sync(kFullMask, p, jj);
        STRATA_UNROLL
        for (int pp = 0; pp < PL; ++pp)
          o[i][pp] += pj * vs[jj * PD + lane + 32 * pp];
      }
    }
  }
  STRATA_UNROLL
  for (int i = 0; i < R; ++i) {
    const std::int64_t t = t0 + warp * R + i;
    if (t >= T) continue;
    const float inv = 1.0f / l[i];
    STRATA_UNROLL
    for (int pp = 0; pp < PL; ++pp) {
      const int d = lane + 32 * pp;
      if (d < D) a.out_w[(b * T + t) * a.out_stride + h * D + d] = o[i][pp] * inv;
    }
    if (lane == 0) a.lse_w[(b * a.heads + h) * T + t] = m[i] + logf(l[i]);
  }
}

template <int PL>
__global__ void __launch_bounds__(kThreads) attention_dq_kernel(AttnArgs a) {
  constexpr int R = 16 / PL;
  constexpr int kRows = kWarps * R;
  constexpr int PD = 32 * PL;
  STRATA_DYNAMIC_SHARED(float, smem);
  float* qs = smem;                   // kRows x PD
  float* dos = qs + kRows * PD;       // kRows x PD
  float* ks = dos + kRows * PD;       // kTile x (PD + 1)
  float* vs = ks + kTile * (PD + 1);  // kTile x (PD + 1)

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const std::int64_t T = a.seq_len;
  const std::int64_t D = a.head_dim;
  const std::int64_t b = blockIdx.z;
  const std::int64_t h = blockIdx.y;
  const std::int64_t g = h / (a.heads / a.kv_heads);
  const std::int64_t t0 = static_cast<std::int64_t>(blockIdx.x) * kRows;

  for (int idx = tid; idx < kRows * PD; idx += kThreads) {
    const int r = idx / PD;
    const int d = idx - r * PD;
    const std::int64_t t = t0 + r;
    const bool valid = t < T && d < D;
    qs[idx] = valid ? a.q[(b * T + t) * a.q_stride + h * D + d] : 0.0f;
    dos[idx] = valid ? a.dout[(b * T + t) * a.out_stride + h * D + d] : 0.0f;
  }
  float delta[R];
  float lse[R];
  float dq[R][PL];
  std::int64_t lo[R];
  STRATA_UNROLL
  for (int i = 0; i < R; ++i) {
    const std::int64_t t = t0 + warp * R + i;
    lo[i] = t < T ? kernels::attention_first_key(a, b, t) : 0;
    float acc = 0.0f;
    if (t < T) {
      const float* o_row = a.out + (b * T + t) * a.out_stride + h * D;
      const float* do_row = a.dout + (b * T + t) * a.out_stride + h * D;
      for (std::int64_t d = lane; d < D; d += 32)
        acc += do_row[d] * o_row[d];
    }
    delta[i] = warp_sum(acc);
    lse[i] = t < T ? a.lse[(b * a.heads + h) * T + t] : 0.0f;
    STRATA_UNROLL
    for (int p = 0; p < PL; ++p)
      dq[i][p] = 0.0f;
  }
  const std::int64_t last_row = (t0 + kRows < T ? t0 + kRows : T) - 1;
  for (std::int64_t s0 = kernels::attention_first_key(a, b, t0) / kTile * kTile; s0 <= last_row;
       s0 += kTile) {
    __syncthreads();
    for (int idx = tid; idx < kTile * PD; idx += kThreads) {
      const int j = idx / PD;
      const int d = idx - j * PD;
      const std::int64_t s = s0 + j;
      const bool valid = s < T && d < D;
      const std::int64_t off = (b * T + s) * a.kv_stride + g * D + d;
      ks[j * (PD + 1) + d] = valid ? a.k[off] : 0.0f;
      vs[j * (PD + 1) + d] = valid ? a.v[off] : 0.0f;
    }
    __syncthreads();
    STRATA_UNROLL
    for (int i = 0; i < R; ++i) {
      const int r = warp * R + i;
      const std::int64_t t = t0 + r;
      if (t >= T || s0 > t || s0 + kTile <= lo[i]) continue;
      const bool ok = s0 + lane <= t && s0 + lane >= lo[i];
      float ds = 0.0f;
      if (ok) {
        const float* qr = qs + r * PD;
        const float* dr = dos + r * PD;
        const float* kr = ks + lane * (PD + 1);
        const float* vr = vs + lane * (PD + 1);
        float qk = 0.0f;
        float dp = 0.0f;
        for (int d = 0; d < D; ++d) {
          qk += qr[d] * kr[d];
          dp += dr[d] * vr[d];
        }
        const float p = expf(qk * a.scale - lse[i]);
        ds = p * (dp - delta[i]);
      }
      const int valid = static_cast<int>(t - s0 + 1 < kTile ? t - s0 + 1 : kTile);
      for (int jj = 0; jj < valid; ++jj) {
        const float dsj = __shfl_sync(kFullMask, ds, jj);
        STRATA_UNROLL
        for (int pp = 0; pp < PL; ++pp)
          dq[i][pp] += dsj * ks[jj * (PD + 1) + lane + 32 * pp];
      }
    }
  }
  STRATA_UNROLL
  for (int i = 0; i < R; ++i) {
    const std::int64_t t = t0 + warp * R + i;
    if (t >= T) continue;
    STRATA_UNROLL
    for (int pp = 0; pp < PL; ++pp) {
      const int d = lane + 32 * pp;
      if (d < D) a.dq[(b * T + t) * a.q_stride + h * D + d] = dq[i][pp] * a.scale;
    }
  }
}

template <int PL>
__global__ void __launch_bounds__(kThreads) attention_dkv_kernel(AttnArgs a) {
  constexpr int R = 16 / PL;
  constexpr int kRows = kWarps * R;
  constexpr int PD = 32 * PL;
  STRATA_DYNAMIC_SHARED(float, smem);
  float* krows = smem;                    // kRows x PD
  float* vrows = krows + kRows * PD;      // kRows x PD
  float* qs = vrows + kRows * PD;         // kTile x (PD + 1)
  float* dos = qs + kTile * (PD + 1);     // kTile x (PD + 1)
  float* lse_s = dos + kTile * (PD + 1);  // kTile
  float* delta_s = lse_s + kTile;         // kTile

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const std::int64_t T = a.seq_len;
  const std::int64_t D = a.head_dim;
  const std::int64_t b = blockIdx.z;
  const std::int64_t g = blockIdx.y;
  const std::int64_t group = a.heads / a.kv_heads;
  const std::int64_t s_base = static_cast<std::int64_t>(blockIdx.x) * kRows;

  for (int idx = tid; idx < kRows * PD; idx += kThreads) {
    const int r = idx / PD;
    const int d = idx - r * PD;
    const std::int64_t s = s_base + r;
    const bool valid = s < T && d < D;
    const std::int64_t off = (b * T + s) * a.kv_stride + g * D + d;
    krows[idx] = valid ? a.k[off] : 0.0f;
    vrows[idx] = valid ? a.v[off] : 0.0f;
  }
  float dk[R][PL];
  float dv[R][PL];
  STRATA_UNROLL
  for (int i = 0; i < R; ++i) {
    STRATA_UNROLL
    for (int p = 0; p < PL; ++p) {
      dk[i][p] = 0.0f;
      dv[i][p] = 0.0f;
    }
  }
  const std::int64_t first_tile = s_base / kTile * kTile;
  const std::int64_t last_key = (s_base + kRows < T ? s_base + kRows : T) - 1;
  for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (std::int64_t t0 = first_tile; t0 < T; t0 += kTile) {
      // No query from here on sees this block's keys (lo only grows); uniform over the block.
      if (kernels::attention_first_key(a, b, t0) > last_key) break;
      __syncthreads();  // the previous tile is consumed (and krows/vrows written, first time)
      for (int idx = tid; idx < kTile * PD; idx += kThreads) {
        const int j = idx / PD;
        const int d = idx - j * PD;
        const std::int64_t t = t0 + j;
        const bool valid = t < T && d < D;
        qs[j * (PD + 1) + d] = valid ? a.q[(b * T + t) * a.q_stride + h * D + d] : 0.0f;
        dos[j * (PD + 1) + d] = valid ? a.dout[(b * T + t) * a.out_stride + h * D + d] : 0.0f;
      }
      for (int j = warp; j < kTile; j += kWarps) {
        const std::int64_t t = t0 + j;
        float acc = 0.0f;
        if (t < T) {
          const float* o_row = a.out + (b * T + t) * a.out_stride + h * D;
          const float* do_row = a.dout + (b * T + t) * a.out_stride + h * D;
          for (std::int64_t d = lane; d < D; d += 32)
            acc += do_row[d] * o_row[d];
        }
        acc = warp_sum(acc);
        if (lane == 0) {
          delta_s[j] = acc;
          lse_s[j] = t < T ? a.lse[(b * a.heads + h) * T + t] : 0.0f;
        }
      }
      __syncthreads();
      const std::int64_t lane_lo =
          t0 + lane < T ? kernels::attention_first_key(a, b, t0 + lane) : 0;
      STRATA_UNROLL
      for (int i = 0; i < R; ++i) {
        const int r = warp * R + i;
        const std::int64_t s = s_base + r;
        if (s >= T || t0 + kTile - 1 < s) continue;  // uniform: no query of the tile sees key s
        const std::int64_t t = t0 + lane;
        const bool ok = t < T && t >= s && s >= lane_lo;
        float p = 0.0f;
        float ds = 0.0f;
        if (ok) {
          const float* qr = qs + lane * (PD + 1);
          const float* dr = dos + lane * (PD + 1);
          const float* kr = krows + r * PD;
          const float* vr = vrows + r * PD;
          float qk = 0.0f;
          float dp = 0.0f;
          for (int d = 0; d < D; ++d) {
            qk += qr[d] * kr[d];
            dp += dr[d] * vr[d];
          }
          p = expf(qk * a.scale - lse_s[lane]);
          ds = p * (dp - delta_s[lane]);
        }
        // Queries t in [max(s, t0), min(T, t0 + kTile)) see key s.
        const int j_begin = static_cast<int>(s > t0 ? s - t0 : 0);
        const int j_end = static_cast<int>(T - t0 < kTile ? T - t0 : kTile);
        for (int jq = j_begin; jq < j_end; ++jq) {
          const float pj = __shfl_sync(kFullMask, p, jq);
          const float dsj = __shfl_sync(kFullMask, ds, jq);
          STRATA_UNROLL
          for (int pp = 0; pp < PL; ++pp) {
            dv[i][pp] += pj * dos[jq * (PD + 1) + lane + 32 * pp];
            dk[i][pp] += dsj * qs[jq * (PD + 1) + lane + 32 * pp];
          }
        }
      }
    }
  }
  STRATA_UNROLL
  for (int i = 0; i < R; ++i) {
    const std::int64_t s = s_base + warp * R + i;
    if (s >= T) continue;
    STRATA_UNROLL
    for (int pp = 0; pp < PL; ++pp) {
      const int d = lane + 32 * pp;
      if (d < D) {
        const std::int64_t off = (b * T + s) * a.kv_stride + g * D + d;
        a.dk[off] = dk[i][pp] * a.scale;
        a.dv[off] = dv[i][pp];
      }
    }
  }
}

enum class AttentionPass { kForward, kDq, kDkv };

template <int PL, typename L>
auto run_attention_pass(const L& launch, AttentionPass pass, const AttnArgs& args,
                        const AttentionShape& shape, const cuda::AttentionLaunch& l) {
  const unsigned row_blocks =
      static_cast<unsigned>((shape.seq_len + l.rows_per_block - 1) / l.rows_per_block);
  const unsigned batch = static_cast<unsigned>(shape.batch);
  const dim3 block(kThreads);
  switch (pass) {
    case AttentionPass::kForward:
      return launch(attention_forward_kernel<PL>,
                    dim3(row_blocks, static_cast<unsigned>(shape.heads), batch), block,
                    static_cast<std::size_t>(l.forward_smem_bytes), args);
    case AttentionPass::kDq:
      return launch(attention_dq_kernel<PL>,
                    dim3(row_blocks, static_cast<unsigned>(shape.heads), batch), block,
                    static_cast<std::size_t>(l.dq_smem_bytes), args);
    case AttentionPass::kDkv:
      break;
  }
  return launch(attention_dkv_kernel<PL>,
                dim3(row_blocks, static_cast<unsigned>(shape.kv_heads), batch), block,
                static_cast<std::size_t>(l.dkv_smem_bytes), args);
}

// Runs one pass with the kernels for l.per_lane (1, 2, 4 or 8; the caller checked it).
template <typename L>
auto run_attention(const L& launch, AttentionPass pass, const AttnArgs& args,
                   const AttentionShape& shape, const cuda::AttentionLaunch& l) {
  switch (l.per_lane) {
    case 1:
      return run_attention_pass<1>(launch, pass, args, shape, l);
    case 2:
      return run_attention_pass<2>(launch, pass, args, shape, l);
    case 4:
      return run_attention_pass<4>(launch, pass, args, shape, l);
    default:
      return run_attention_pass<8>(launch, pass, args, shape, l);
  }
}

AttnArgs attention_args(const AttentionShape& shape) {
  AttnArgs a{};
  a.seq_len = shape.seq_len;
  a.heads = shape.heads;
  a.kv_heads = shape.kv_heads;
  a.head_dim = shape.head_dim;
  a.q_stride = shape.q_stride;
  a.kv_stride = shape.kv_stride;
  a.out_stride = shape.out_stride;
  a.scale = static_cast<float>(shape.scale);
  a.window = shape.window;
  a.positions = shape.positions;
  return a;
}

template <typename L>
auto run_attention_forward(const L& launch, float* out, float* lse, const float* q, const float* k,
                           const float* v, const AttentionShape& shape,
                           const cuda::AttentionLaunch& l) {
  AttnArgs a = attention_args(shape);
  a.q = q;
  a.k = k;
  a.v = v;
  a.out_w = out;
  a.lse_w = lse;
  return run_attention(launch, AttentionPass::kForward, a, shape, l);
}

template <typename L>
auto run_attention_backward(const L& launch, float* dq, float* dk, float* dv, const float* dout,
                            const float* out, const float* lse, const float* q, const float* k,
                            const float* v, const AttentionShape& shape,
                            const cuda::AttentionLaunch& l) {
  AttnArgs a = attention_args(shape);
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.lse = lse;
  a.dout = dout;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  auto err = run_attention(launch, AttentionPass::kDq, a, shape, l);
  if (!launched(err)) return err;
  return run_attention(launch, AttentionPass::kDkv, a, shape, l);
}

}  // namespace
}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
