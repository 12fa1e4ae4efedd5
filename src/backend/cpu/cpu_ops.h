// Ops<T> for the CPU backend: each op runs the kernels/cpu kernel inside the backend's oneTBB
// arena, synchronously on the calling thread (the compute stream).
#pragma once

#include <tbb/task_arena.h>

#include "backend/ops.h"

namespace strata::backend {

template <typename T>
class CpuOps final : public Ops<T> {
 public:
  explicit CpuOps(tbb::task_arena* arena) : arena_(arena) {}

  void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
            const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
            std::int64_t ldc) override;
  void embedding_forward(T* out, const std::int32_t* tokens, const std::int32_t* positions,
                         const T* wte, const T* wpe, std::int64_t rows, std::int64_t seq_len,
                         std::int64_t channels) override;
  void embedding_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens,
                          const std::int32_t* positions, std::int64_t rows, std::int64_t seq_len,
                          std::int64_t channels, std::int32_t padding_idx) override;
  void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b,
                         std::int64_t rows, std::int64_t channels, double eps) override;
  void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean,
                          const T* rstd, std::int64_t rows, std::int64_t channels) override;
  void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t rows,
                       std::int64_t channels, double eps) override;
  void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                        std::int64_t rows, std::int64_t channels) override;
  void rmsnorm_heads_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t rows,
                             std::int64_t heads, std::int64_t head_dim, std::int64_t x_stride,
                             std::int64_t out_stride, double eps) override;
  void rmsnorm_heads_backward(T* d, T* dw, const T* x, const T* w, const T* rstd, std::int64_t rows,
                              std::int64_t heads, std::int64_t head_dim, std::int64_t d_stride,
                              std::int64_t x_stride) override;
  void gelu_forward(T* out, const T* x, std::int64_t n) override;
  void gelu_backward(T* dx, const T* x, const T* dout, std::int64_t n) override;
  void swiglu_forward(T* out, const T* gate_up, std::int64_t rows, std::int64_t inner) override;
  void swiglu_backward(T* dgate_up, const T* gate_up, const T* dout, std::int64_t rows,
                       std::int64_t inner) override;
  void add(T* out, const T* a, const T* b, std::int64_t n) override;
  void add_bias(T* x, const T* bias, std::int64_t rows, std::int64_t channels) override;
  void bias_backward(T* dbias, const T* dout, std::int64_t rows, std::int64_t channels) override;
  void rope_forward(T* x, const RopeShape& shape, const T* cos, const T* sin) override;
  void rope_backward(T* dx, const RopeShape& shape, const T* cos, const T* sin) override;
  void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                         const AttentionShape& shape) override;
  void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse,
                          const T* q, const T* k, const T* v, const AttentionShape& shape) override;
  void cross_entropy_forward(T* losses, const T* logits, const std::int32_t* targets,
                             std::int64_t rows, std::int64_t vocab) override;
  void cross_entropy_fused(T* logits, T* losses, const std::int32_t* targets, std::int64_t rows,
                           std::int64_t vocab, double grad_scale) override;
  double sum_squares(const T* x, std::int64_t n) override;
  double sum(const T* x, std::int64_t n) override;
  void scale(T* x, std::int64_t n, double alpha) override;
  void zero(T* x, std::int64_t n) override;
  void copy(T* dst, const T* src, std::int64_t n) override;
  void cast_from(T* dst, const void* src, DType src_type, std::int64_t n) override;
  void cast_to(void* dst, DType dst_type, const T* src, std::int64_t n) override;
  void add_rounded(T* acc, const T* g, DType type, std::int64_t n, bool assign) override;

 private:
  template <typename Fn>
  void run(const Fn& fn) {
    arena_->execute(fn);
  }
  tbb::task_arena* arena_;
};

extern template class CpuOps<float>;
extern template class CpuOps<double>;

}  // namespace strata::backend
