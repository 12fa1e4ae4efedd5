// CpuOps: each op is the kernels/cpu kernel run inside the backend's oneTBB arena.
#include "backend/cpu/cpu_ops.h"

#include <algorithm>
#include <cstring>

#include "common/assert.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"

namespace strata::backend {

namespace k = strata::kernels;

template <typename T>
void CpuOps<T>::gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t kk,
                     T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta,
                     T* c, std::int64_t ldc) {
  run([&] { k::gemm<T>(trans_a, trans_b, m, n, kk, alpha, a, lda, b, ldb, beta, c, ldc); });
}
template <typename T>
void CpuOps<T>::embedding_forward(T* out, const std::int32_t* tokens, const std::int32_t* positions,
                                  const T* wte, const T* wpe, std::int64_t rows,
                                  std::int64_t seq_len, std::int64_t channels) {
  run([&] { k::embedding_forward(out, tokens, positions, wte, wpe, rows, seq_len, channels); });
}
template <typename T>
void CpuOps<T>::embedding_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens,
                                   const std::int32_t* positions, std::int64_t rows,
                                   std::int64_t seq_len, std::int64_t channels,
                                   std::int32_t padding_idx) {
  run([&] {
    k::embedding_backward(dwte, dwpe, dout, tokens, positions, rows, seq_len, channels,
                          padding_idx);
  });
}
template <typename T>
void CpuOps<T>::layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b,
                                  std::int64_t rows, std::int64_t channels, double eps) {
  run([&] { k::layernorm_forward(out, mean, rstd, x, w, b, rows, channels, eps); });
}
template <typename T>
void CpuOps<T>::layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w,
                                   const T* mean, const T* rstd, std::int64_t rows,
                                   std::int64_t channels) {
  run([&] { k::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, rows, channels); });
}
template <typename T>
void CpuOps<T>::rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t rows,
                                std::int64_t channels, double eps) {
  run([&] { k::rmsnorm_forward(out, rstd, x, w, rows, channels, eps); });
}
template <typename T>
void CpuOps<T>::rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                                 std::int64_t rows, std::int64_t channels) {
  run([&] { k::rmsnorm_backward(dx, dw, dout, x, w, rstd, rows, channels); });
}
template <typename T>
void CpuOps<T>::rmsnorm_heads_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t rows,
                                      std::int64_t heads, std::int64_t head_dim,
                                      std::int64_t x_stride, std::int64_t out_stride, double eps) {
  run([&] {
    k::rmsnorm_heads_forward(out, rstd, x, w, rows, heads, head_dim, x_stride, out_stride, eps);
  });
}
template <typename T>
void CpuOps<T>::rmsnorm_heads_backward(T* d, T* dw, const T* x, const T* w, const T* rstd,
                                       std::int64_t rows, std::int64_t heads, std::int64_t head_dim,
                                       std::int64_t d_stride, std::int64_t x_stride) {
  run([&] {
    k::rmsnorm_heads_backward(d, dw, x, w, rstd, rows, heads, head_dim, d_stride, x_stride);
  });
}
template <typename T>
void CpuOps<T>::gelu_forward(T* out, const T* x, std::int64_t n) {
  run([&] { k::gelu_forward(out, x, n); });
}
template <typename T>
void CpuOps<T>::gelu_backward(T* dx, const T* x, const T* dout, std::int64_t n) {
  run([&] { k::gelu_backward(dx, x, dout, n); });
}
template <typename T>
void CpuOps<T>::swiglu_forward(T* out, const T* gate_up, std::int64_t rows, std::int64_t inner) {
  run([&] { k::swiglu_forward(out, gate_up, rows, inner); });
}
template <typename T>
void CpuOps<T>::swiglu_backward(T* dgate_up, const T* gate_up, const T* dout, std::int64_t rows,
                                std::int64_t inner) {
  run([&] { k::swiglu_backward(dgate_up, gate_up, dout, rows, inner); });
}
template <typename T>
void CpuOps<T>::add(T* out, const T* a, const T* b, std::int64_t n) {
  run([&] { k::add(out, a, b, n); });
}
template <typename T>
void CpuOps<T>::add_bias(T* x, const T* bias, std::int64_t rows, std::int64_t channels) {
  run([&] { k::add_bias(x, bias, rows, channels); });
}
template <typename T>
void CpuOps<T>::bias_backward(T* dbias, const T* dout, std::int64_t rows, std::int64_t channels) {
  run([&] { k::bias_backward(dbias, dout, rows, channels); });
}
template <typename T>
void CpuOps<T>::rope_forward(T* x, const RopeShape& shape, const T* cos, const T* sin) {
  run([&] { k::rope_forward(x, shape, cos, sin); });
}
template <typename T>
void CpuOps<T>::rope_backward(T* dx, const RopeShape& shape, const T* cos, const T* sin) {
  run([&] { k::rope_backward(dx, shape, cos, sin); });
}
template <typename T>
void CpuOps<T>::attention_forward(T* out, T* lse, const T* q, const T* kp, const T* v,
                                  const AttentionShape& shape) {
  run([&] { k::attention_forward(out, lse, q, kp, v, shape); });
}
template <typename T>
void CpuOps<T>::attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse,
                                   const T* q, const T* kp, const T* v,
                                   const AttentionShape& shape) {
  run([&] { k::attention_backward(dq, dk, dv, dout, out, lse, q, kp, v, shape); });
}
template <typename T>
void CpuOps<T>::cross_entropy_forward(T* losses, const T* logits, const std::int32_t* targets,
                                      std::int64_t rows, std::int64_t vocab) {
  run([&] { k::cross_entropy_forward(losses, logits, targets, rows, vocab); });
}
template <typename T>
void CpuOps<T>::cross_entropy_fused(T* logits, T* losses, const std::int32_t* targets,
                                    std::int64_t rows, std::int64_t vocab, double grad_scale) {
  run([&] { k::cross_entropy_fused(logits, losses, targets, rows, vocab, grad_scale); });
}
template <typename T>
double CpuOps<T>::sum_squares(const T* x, std::int64_t n) {
  double result = 0.0;
  run([&] { result = k::sum_squares(x, n); });
  return result;
}
template <typename T>
double CpuOps<T>::sum(const T* x, std::int64_t n) {
  double result = 0.0;
  run([&] { result = k::sum(x, n); });
  return result;
}
template <typename T>
void CpuOps<T>::scale(T* x, std::int64_t n, double alpha) {
  run([&] { k::scale(x, n, alpha); });
}
template <typename T>
void CpuOps<T>::zero(T* x, std::int64_t n) {
  run([&] {
    k::parallel_chunks(n, 1 << 18, [&](std::int64_t i0, std::int64_t i1) {
      std::memset(x + i0, 0, static_cast<std::size_t>(i1 - i0) * sizeof(T));
    });
  });
}
template <typename T>
void CpuOps<T>::copy(T* dst, const T* src, std::int64_t n) {
  run([&] {
    k::parallel_chunks(n, 1 << 18, [&](std::int64_t i0, std::int64_t i1) {
      std::memcpy(dst + i0, src + i0, static_cast<std::size_t>(i1 - i0) * sizeof(T));
    });
  });
}
template <typename T>
void CpuOps<T>::cast_from(T* dst, const void* src, DType src_type, std::int64_t n) {
  if constexpr (sizeof(T) == 8) {
    run([&] { k::widen_to_f64(dst, src, src_type, n); });
  } else {
    run([&] { k::cast_array(dst, DType::kF32, src, src_type, n); });
  }
}
template <typename T>
void CpuOps<T>::cast_to(void* dst, DType dst_type, const T* src, std::int64_t n) {
  if constexpr (sizeof(T) == 8) {
    run([&] { k::narrow_from_f64(dst, dst_type, src, n); });
  } else {
    run([&] { k::cast_array(dst, dst_type, src, DType::kF32, n); });
  }
}

template <typename T>
void CpuOps<T>::add_rounded(T* acc, const T* g, DType type, std::int64_t n, bool assign) {
  STRATA_ASSERT(type == DType::kBF16 || type == DType::kF16);
  run([&] {
    k::parallel_chunks(n, 1 << 16, [&](std::int64_t i0, std::int64_t i1) {
      // Through a 16-bit block on the stack: cast_to's rounding, cast_from's widening.
      constexpr std::int64_t kBlock = 1024;
      std::uint16_t narrow[kBlock];
      T wide[kBlock];
      for (std::int64_t b = i0; b < i1; b += kBlock) {
        const std::int64_t m = std::min(kBlock, i1 - b);
        if constexpr (sizeof(T) == 8) {
          k::narrow_from_f64(narrow, type, g + b, m);
          k::widen_to_f64(wide, narrow, type, m);
        } else {
          k::cast_array(narrow, type, g + b, DType::kF32, m);
          k::cast_array(wide, DType::kF32, narrow, type, m);
        }
        for (std::int64_t i = 0; i < m; ++i)
          acc[b + i] = assign ? wide[i] : acc[b + i] + wide[i];
      }
    });
  });
}

template class CpuOps<float>;
template class CpuOps<double>;

}  // namespace strata::backend
