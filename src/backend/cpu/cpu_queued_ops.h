// Ops<T> and OptimizerOps that queue each op on an asynchronous compute stream instead of running
// it in the caller: the CPU backend's stream-jitter mode (cpu_backend.h) uses them so that its
// compute stream runs behind the host thread, as a GPU's does, and a missing record or wait between
// the compute stream and a copy stream changes results instead of going unnoticed.
// Arguments are captured by value (shapes copied); ops that return a value (sum, sum_squares, the
// optimizer's read-backs) wait for the stream first and then run in the caller, as the CUDA
// backend's read-backs synchronise.
#pragma once

#include <functional>

#include "backend/ops.h"
#include "backend/optimizer_ops.h"

namespace strata::backend {

// The asynchronous compute stream, as the queued ops see it.
class ComputeQueue {
 public:
  virtual ~ComputeQueue() = default;
  // Queues `op` behind the stream's other work (blocks while the queue is full).
  virtual void push(std::function<void()> op) = 0;
  // Blocks until everything queued so far has run.
  virtual void drain() = 0;
};

template <typename T>
class QueuedOps final : public Ops<T> {
 public:
  QueuedOps(Ops<T>* inner, ComputeQueue* queue) : inner_(inner), queue_(queue) {}

  void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
            const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
            std::int64_t ldc) override {
    queue_->push([=, this] {
      inner_->gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    });
  }
  void embedding_forward(T* out, const std::int32_t* tokens, const std::int32_t* positions,
                         const T* wte, const T* wpe, std::int64_t rows, std::int64_t seq_len,
                         std::int64_t channels) override {
    queue_->push([=, this] {
      inner_->embedding_forward(out, tokens, positions, wte, wpe, rows, seq_len, channels);
    });
  }
  void embedding_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens,
                          const std::int32_t* positions, std::int64_t rows, std::int64_t seq_len,
                          std::int64_t channels, std::int32_t padding_idx) override {
    queue_->push([=, this] {
      inner_->embedding_backward(dwte, dwpe, dout, tokens, positions, rows, seq_len, channels,
                                 padding_idx);
    });
  }
  void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b,
                         std::int64_t rows, std::int64_t channels, double eps) override {
    queue_->push(
        [=, this] { inner_->layernorm_forward(out, mean, rstd, x, w, b, rows, channels, eps); });
  }
  void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean,
                          const T* rstd, std::int64_t rows, std::int64_t channels) override {
    queue_->push([=, this] {
      inner_->layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, rows, channels);
    });
  }
  void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t rows,
                       std::int64_t channels, double eps) override {
    queue_->push([=, this] { inner_->rmsnorm_forward(out, rstd, x, w, rows, channels, eps); });
  }
  void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                        std::int64_t rows, std::int64_t channels) override {
    queue_->push([=, this] { inner_->rmsnorm_backward(dx, dw, dout, x, w, rstd, rows, channels); });
  }
  void rmsnorm_heads_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t rows,
                             std::int64_t heads, std::int64_t head_dim, std::int64_t x_stride,
                             std::int64_t out_stride, double eps) override {
    queue_->push([=, this] {
      inner_->rmsnorm_heads_forward(out, rstd, x, w, rows, heads, head_dim, x_stride, out_stride,
                                    eps);
    });
  }
  void rmsnorm_heads_backward(T* d, T* dw, const T* x, const T* w, const T* rstd, std::int64_t rows,
                              std::int64_t heads, std::int64_t head_dim, std::int64_t d_stride,
                              std::int64_t x_stride) override {
    queue_->push([=, this] {
      inner_->rmsnorm_heads_backward(d, dw, x, w, rstd, rows, heads, head_dim, d_stride, x_stride);
    });
  }
  void gelu_forward(T* out, const T* x, std::int64_t n) override {
    queue_->push([=, this] { inner_->gelu_forward(out, x, n); });
  }
  void gelu_backward(T* dx, const T* x, const T* dout, std::int64_t n) override {
    queue_->push([=, this] { inner_->gelu_backward(dx, x, dout, n); });
  }
  void swiglu_forward(T* out, const T* gate_up, std::int64_t rows, std::int64_t inner) override {
    queue_->push([=, this] { inner_->swiglu_forward(out, gate_up, rows, inner); });
  }
  void swiglu_backward(T* dgate_up, const T* gate_up, const T* dout, std::int64_t rows,
                       std::int64_t inner) override {
    queue_->push([=, this] { inner_->swiglu_backward(dgate_up, gate_up, dout, rows, inner); });
  }
  void add(T* out, const T* a, const T* b, std::int64_t n) override {
    queue_->push([=, this] { inner_->add(out, a, b, n); });
  }
  void add_bias(T* x, const T* bias, std::int64_t rows, std::int64_t channels) override {
    queue_->push([=, this] { inner_->add_bias(x, bias, rows, channels); });
  }
  void bias_backward(T* dbias, const T* dout, std::int64_t rows, std::int64_t channels) override {
    queue_->push([=, this] { inner_->bias_backward(dbias, dout, rows, channels); });
  }
  void rope_forward(T* x, const RopeShape& shape, const T* cos, const T* sin) override {
    queue_->push([=, this] { inner_->rope_forward(x, shape, cos, sin); });
  }
  void rope_backward(T* dx, const RopeShape& shape, const T* cos, const T* sin) override {
    queue_->push([=, this] { inner_->rope_backward(dx, shape, cos, sin); });
  }
  void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                         const AttentionShape& shape) override {
    queue_->push([=, this] { inner_->attention_forward(out, lse, q, k, v, shape); });
  }
  void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse,
                          const T* q, const T* k, const T* v,
                          const AttentionShape& shape) override {
    queue_->push(
        [=, this] { inner_->attention_backward(dq, dk, dv, dout, out, lse, q, k, v, shape); });
  }
  void cross_entropy_forward(T* losses, const T* logits, const std::int32_t* targets,
                             std::int64_t rows, std::int64_t vocab) override {
    queue_->push(
        [=, this] { inner_->cross_entropy_forward(losses, logits, targets, rows, vocab); });
  }
  void cross_entropy_fused(T* logits, T* losses, const std::int32_t* targets, std::int64_t rows,
                           std::int64_t vocab, double grad_scale) override {
    queue_->push([=, this] {
      inner_->cross_entropy_fused(logits, losses, targets, rows, vocab, grad_scale);
    });
  }
  double sum_squares(const T* x, std::int64_t n) override {
    queue_->drain();
    return inner_->sum_squares(x, n);
  }
  double sum(const T* x, std::int64_t n) override {
    queue_->drain();
    return inner_->sum(x, n);
  }
  void scale(T* x, std::int64_t n, double alpha) override {
    queue_->push([=, this] { inner_->scale(x, n, alpha); });
  }
  void zero(T* x, std::int64_t n) override {
    queue_->push([=, this] { inner_->zero(x, n); });
  }
  void copy(T* dst, const T* src, std::int64_t n) override {
    queue_->push([=, this] { inner_->copy(dst, src, n); });
  }
  void cast_from(T* dst, const void* src, DType src_type, std::int64_t n) override {
    queue_->push([=, this] { inner_->cast_from(dst, src, src_type, n); });
  }
  void cast_to(void* dst, DType dst_type, const T* src, std::int64_t n) override {
    queue_->push([=, this] { inner_->cast_to(dst, dst_type, src, n); });
  }
  void add_rounded(T* acc, const T* g, DType type, std::int64_t n, bool assign) override {
    queue_->push([=, this] { inner_->add_rounded(acc, g, type, n, assign); });
  }

 private:
  Ops<T>* inner_;
  ComputeQueue* queue_;
};

// The optimizer ops in the same mode: every call waits for the compute stream and then runs in the
// caller (the CPU implementation's results are read back at once anyway).
class QueuedOptimizerOps final : public OptimizerOps {
 public:
  QueuedOptimizerOps(OptimizerOps* inner, ComputeQueue* queue) : inner_(inner), queue_(queue) {}

  Result<kernels::AdamResult> adam_step(const kernels::AdamParams& params,
                                        const kernels::AdamFusion& fusion,
                                        const kernels::AdamTile& tile) override {
    queue_->drain();
    return inner_->adam_step(params, fusion, tile);
  }

 private:
  OptimizerOps* inner_;
  ComputeQueue* queue_;
};

}  // namespace strata::backend
