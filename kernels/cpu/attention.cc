// Causal attention with grouped KV heads, blocked in 64 x 64 tiles (flash-attention style):
// the forward keeps a running max and sum per query row and never materialises T x T scores;
// the backward recomputes each tile's probabilities from the saved log-sum-exp. Packed documents
// and sliding windows (nn_ops.h) narrow each query row's keys to [lo(t), t]: key tiles wholly
// below a query tile's first lo are skipped, and within a tile only the row's own key range
// counts. Without them every range is the causal one, and the arithmetic is the plain kernel's.
//
// Parallel split: forward tasks are (batch, head, query block); backward tasks are (batch, KV
// head), each walking its query heads, query blocks and key blocks in a fixed order and writing
// only its own rows of dq, dk and dv. So results are deterministic and need no atomics.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/assert.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn_ops.h"
#include "kernels/cpu/parallel.h"

namespace strata::kernels {
namespace {

constexpr std::int64_t kBlock = 64;

// Query row t0 + i's keys within the key tile starting at s0 with nk keys: [*begin, *end).
void key_range(const AttentionShape& s, std::int64_t b, std::int64_t t, std::int64_t s0,
               std::int64_t nk, std::int64_t* begin, std::int64_t* end) {
  *begin = std::max<std::int64_t>(0, attention_first_key(s, b, t) - s0);
  *end = std::min<std::int64_t>(nk, t - s0 + 1);
}

void check(const AttentionShape& s) {
  STRATA_ASSERT(s.batch > 0 && s.seq_len > 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0);
  STRATA_ASSERT(s.heads % s.kv_heads == 0);
  STRATA_ASSERT(s.q_stride >= s.heads * s.head_dim);
  STRATA_ASSERT(s.kv_stride >= s.kv_heads * s.head_dim);
  STRATA_ASSERT(s.out_stride >= s.heads * s.head_dim);
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                       const AttentionShape& s) {
  check(s);
  const std::int64_t T_ = s.seq_len;
  const std::int64_t D = s.head_dim;
  const std::int64_t group = s.heads / s.kv_heads;
  const std::int64_t q_blocks = (T_ + kBlock - 1) / kBlock;
  const T scale = static_cast<T>(s.scale);
  const T neg_inf = -std::numeric_limits<T>::infinity();

  parallel_chunks(s.batch * s.heads * q_blocks, 1, [&](std::int64_t task, std::int64_t) {
    const std::int64_t qb = task % q_blocks;
    const std::int64_t h = (task / q_blocks) % s.heads;
    const std::int64_t b = task / (q_blocks * s.heads);
    const std::int64_t g = h / group;
    const std::int64_t t0 = qb * kBlock;
    const std::int64_t nq = std::min(kBlock, T_ - t0);

    const T* qp = q + (b * T_ + t0) * s.q_stride + h * D;
    T* op = out + (b * T_ + t0) * s.out_stride + h * D;
    T scores[kBlock * kBlock];
    T row_max[kBlock];
    T row_sum[kBlock];
    for (std::int64_t i = 0; i < nq; ++i) {
      row_max[i] = neg_inf;
      row_sum[i] = T(0);
      std::fill(op + i * s.out_stride, op + i * s.out_stride + D, T(0));
    }
    for (std::int64_t kb = attention_first_key(s, b, t0) / kBlock; kb <= qb; ++kb) {
      const std::int64_t s0 = kb * kBlock;
      const std::int64_t nk = std::min(kBlock, T_ - s0);
      const T* kp = k + (b * T_ + s0) * s.kv_stride + g * D;
      const T* vp = v + (b * T_ + s0) * s.kv_stride + g * D;
      // scores(nq, nk) = scale * Q K^T
      gemm_serial<T>(false, true, nq, nk, D, scale, qp, s.q_stride, kp, s.kv_stride, T(0), scores,
                     kBlock);
      for (std::int64_t i = 0; i < nq; ++i) {
        T* sr = scores + i * kBlock;
        std::int64_t begin = 0, end = 0;
        key_range(s, b, t0 + i, s0, nk, &begin, &end);
        if (begin >= end) {  // none of this tile's keys: the row's running values stay
          std::fill(sr, sr + nk, T(0));
          continue;
        }
        T m = row_max[i];
        for (std::int64_t j = begin; j < end; ++j)
          m = std::max(m, sr[j]);
        const T correction = (row_max[i] == neg_inf) ? T(0) : std::exp(row_max[i] - m);
        T sum = T(0);
        for (std::int64_t j = 0; j < begin; ++j)
          sr[j] = T(0);
        for (std::int64_t j = begin; j < end; ++j) {
          sr[j] = std::exp(sr[j] - m);
          sum += sr[j];
        }
        for (std::int64_t j = end; j < nk; ++j)
          sr[j] = T(0);
        row_sum[i] = row_sum[i] * correction + sum;
        row_max[i] = m;
        if (correction != T(1)) {
          T* o = op + i * s.out_stride;
          for (std::int64_t d = 0; d < D; ++d)
            o[d] *= correction;
        }
      }
      // O(nq, D) += P(nq, nk) V(nk, D)
      gemm_serial<T>(false, false, nq, D, nk, T(1), scores, kBlock, vp, s.kv_stride, T(1), op,
                     s.out_stride);
    }
    T* lp = lse + (b * s.heads + h) * T_ + t0;
    for (std::int64_t i = 0; i < nq; ++i) {
      const T inv = T(1) / row_sum[i];
      T* o = op + i * s.out_stride;
      for (std::int64_t d = 0; d < D; ++d)
        o[d] *= inv;
      lp[i] = row_max[i] + std::log(row_sum[i]);
    }
  });
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                        const T* k, const T* v, const AttentionShape& s) {
  check(s);
  const std::int64_t T_ = s.seq_len;
  const std::int64_t D = s.head_dim;
  const std::int64_t group = s.heads / s.kv_heads;
  const std::int64_t blocks = (T_ + kBlock - 1) / kBlock;
  const T scale = static_cast<T>(s.scale);

  parallel_chunks(s.batch * s.kv_heads, 1, [&](std::int64_t task, std::int64_t) {
    const std::int64_t g = task % s.kv_heads;
    const std::int64_t b = task / s.kv_heads;
    T* dkp = dk + b * T_ * s.kv_stride + g * D;
    T* dvp = dv + b * T_ * s.kv_stride + g * D;
    for (std::int64_t t = 0; t < T_; ++t) {
      std::fill(dkp + t * s.kv_stride, dkp + t * s.kv_stride + D, T(0));
      std::fill(dvp + t * s.kv_stride, dvp + t * s.kv_stride + D, T(0));
    }
    T probs[kBlock * kBlock];
    T dprobs[kBlock * kBlock];
    T delta[kBlock];
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (std::int64_t qb = 0; qb < blocks; ++qb) {
        const std::int64_t t0 = qb * kBlock;
        const std::int64_t nq = std::min(kBlock, T_ - t0);
        const T* qp = q + (b * T_ + t0) * s.q_stride + h * D;
        const T* op = out + (b * T_ + t0) * s.out_stride + h * D;
        const T* dop = dout + (b * T_ + t0) * s.out_stride + h * D;
        T* dqp = dq + (b * T_ + t0) * s.q_stride + h * D;
        const T* lp = lse + (b * s.heads + h) * T_ + t0;
        for (std::int64_t i = 0; i < nq; ++i) {
          T acc = T(0);
          for (std::int64_t d = 0; d < D; ++d)
            acc += dop[i * s.out_stride + d] * op[i * s.out_stride + d];
          delta[i] = acc;
          std::fill(dqp + i * s.q_stride, dqp + i * s.q_stride + D, T(0));
        }
        for (std::int64_t kb = attention_first_key(s, b, t0) / kBlock; kb <= qb; ++kb) {
          const std::int64_t s0 = kb * kBlock;
          const std::int64_t nk = std::min(kBlock, T_ - s0);
          const T* kp = k + (b * T_ + s0) * s.kv_stride + g * D;
          const T* vp = v + (b * T_ + s0) * s.kv_stride + g * D;
          // P = exp(scale * Q K^T - lse), masked
          gemm_serial<T>(false, true, nq, nk, D, scale, qp, s.q_stride, kp, s.kv_stride, T(0),
                         probs, kBlock);
          for (std::int64_t i = 0; i < nq; ++i) {
            T* pr = probs + i * kBlock;
            std::int64_t begin = 0, end = 0;
            key_range(s, b, t0 + i, s0, nk, &begin, &end);
            for (std::int64_t j = 0; j < std::min(begin, nk); ++j)
              pr[j] = T(0);
            for (std::int64_t j = begin; j < end; ++j)
              pr[j] = std::exp(pr[j] - lp[i]);
            for (std::int64_t j = std::max(begin, end); j < nk; ++j)
              pr[j] = T(0);
          }
          // dV(nk, D) += P^T dO
          gemm_serial<T>(true, false, nk, D, nq, T(1), probs, kBlock, dop, s.out_stride, T(1),
                         dvp + s0 * s.kv_stride, s.kv_stride);
          // dP(nq, nk) = dO V^T
          gemm_serial<T>(false, true, nq, nk, D, T(1), dop, s.out_stride, vp, s.kv_stride, T(0),
                         dprobs, kBlock);
          // dS = P * (dP - delta), stored over dprobs
          for (std::int64_t i = 0; i < nq; ++i) {
            T* dr = dprobs + i * kBlock;
            const T* pr = probs + i * kBlock;
            for (std::int64_t j = 0; j < nk; ++j)
              dr[j] = pr[j] * (dr[j] - delta[i]);
          }
          // dQ(nq, D) += scale * dS K ; dK(nk, D) += scale * dS^T Q
          gemm_serial<T>(false, false, nq, D, nk, scale, dprobs, kBlock, kp, s.kv_stride, T(1), dqp,
                         s.q_stride);
          gemm_serial<T>(true, false, nk, D, nq, scale, dprobs, kBlock, qp, s.q_stride, T(1),
                         dkp + s0 * s.kv_stride, s.kv_stride);
        }
      }
    }
  });
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const AttentionShape&);
template void attention_forward<double>(double*, double*, const double*, const double*,
                                        const double*, const AttentionShape&);
template void attention_backward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const float*, const float*,
                                        const AttentionShape&);
template void attention_backward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const double*, const double*,
                                         const AttentionShape&);

}  // namespace strata::kernels
