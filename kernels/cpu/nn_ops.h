// CPU kernels for every operation of the GPT-2 and Llama-family models, forward and backward,
// templated on the compute type (float for training, double for the finite-difference gradient
// checks). Conventions:
//   - row-major; shapes in comments, e.g. (N,C) = N rows of C values;
//   - backward kernels ACCUMULATE (+=) into parameter gradients and into input gradients, except
//     where a contract says "writes"; callers zero what must start at zero;
//   - every kernel is deterministic: parallel splits depend only on the shape, and reductions run
//     in a fixed order, so results do not depend on the thread count.
#pragma once

#include <cstdint>

// Functions the CUDA kernels call too (nvcc compiles them for host and device).
#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::kernels {

// Row r = b*T + t of a (B,T) batch sits at position positions[r] of its document (packed
// sequences), or at t = r % T when `positions` is null.

// ---- embedding ---------------------------------------------------------------------------------
// out(B*T,C) = wte[tokens[r]] + wpe[position of r] (wpe may be null: no learned positions).
template <typename T>
void embedding_forward(T* out, const std::int32_t* tokens, const std::int32_t* positions,
                       const T* wte, const T* wpe, std::int64_t rows, std::int64_t seq_len,
                       std::int64_t channels);
// dwte[tokens[r]] += dout[r]; dwpe[position of r] += dout[r] (dwpe may be null). Rows whose
// token is padding_idx add nothing to dwte (nn.Embedding's padding_idx); -1 = none.
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens,
                        const std::int32_t* positions, std::int64_t rows, std::int64_t seq_len,
                        std::int64_t channels, std::int32_t padding_idx);

// ---- normalisation -----------------------------------------------------------------------------
// out(N,C) = (x - mean) * rstd * w + b; writes mean(N), rstd(N) for backward.
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b,
                       std::int64_t rows, std::int64_t channels, double eps);
// dx += ..., dw += ..., db += ... given dout(N,C) and the forward's x, w, mean, rstd.
template <typename T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean,
                        const T* rstd, std::int64_t rows, std::int64_t channels);
// out(N,C) = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps) (Llama's RMSNorm); writes rstd(N).
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t rows,
                     std::int64_t channels, double eps);
template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                      std::int64_t rows, std::int64_t channels);
// RMSNorm of every head on its own (Qwen3's q_norm / k_norm): row r holds `heads` vectors of D
// values at x + r*x_stride + h*D, each normalised over its D values and multiplied by w(D); out has
// the same layout at out_stride; writes rstd(rows*heads).
template <typename T>
void rmsnorm_heads_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t rows,
                           std::int64_t heads, std::int64_t head_dim, std::int64_t x_stride,
                           std::int64_t out_stride, double eps);
// In place: d (layout of x at d_stride) holds dout on entry and dx on return; dw += ...
template <typename T>
void rmsnorm_heads_backward(T* d, T* dw, const T* x, const T* w, const T* rstd, std::int64_t rows,
                            std::int64_t heads, std::int64_t head_dim, std::int64_t d_stride,
                            std::int64_t x_stride);

// ---- pointwise ---------------------------------------------------------------------------------
// GELU, tanh approximation (GPT-2's gelu_new): out(n) = 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715
// x^3))).
template <typename T>
void gelu_forward(T* out, const T* x, std::int64_t n);
// dx += gelu'(x) * dout.
template <typename T>
void gelu_backward(T* dx, const T* x, const T* dout, std::int64_t n);
// gate_up(N, 2I) holds [gate | up] per row; out(N,I) = silu(gate) * up.
template <typename T>
void swiglu_forward(T* out, const T* gate_up, std::int64_t rows, std::int64_t inner);
// Writes dgate_up(N, 2I) from dout(N,I).
template <typename T>
void swiglu_backward(T* dgate_up, const T* gate_up, const T* dout, std::int64_t rows,
                     std::int64_t inner);
// out(N,C) = a + b (out may alias a or b).
template <typename T>
void add(T* out, const T* a, const T* b, std::int64_t n);
// x(N,C) += bias(C) on every row.
template <typename T>
void add_bias(T* x, const T* bias, std::int64_t rows, std::int64_t channels);
// dbias(C) += sum over rows of dout(N,C).
template <typename T>
void bias_backward(T* dbias, const T* dout, std::int64_t rows, std::int64_t channels);

// ---- rotary embeddings ------------------------------------------------------------------------
// Rotates, in place, `heads` heads of head_dim D starting at column 0 of x's rows (row r at
// x + r*stride) by the angles of row r's position, with Hugging Face's rotate_half pairing over
// the first R = rotary_dim dimensions of each head: (d, d + R/2) for d < R/2; dimensions R..D-1
// pass unchanged (Phi-3's partial rotary). cos/sin are (T, R/2) tables; every position is < T.
struct RopeShape {
  std::int64_t rows = 0;
  std::int64_t stride = 0;
  std::int64_t seq_len = 0;  // T
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t rotary_dim = 0;              // even, <= head_dim
  const std::int32_t* positions = nullptr;  // (rows), or null: row r is at r % T
};
template <typename T>
void rope_forward(T* x, const RopeShape& shape, const T* cos, const T* sin);
// The transposed map, applied in place to the gradient (the inverse rotation, scaled alike).
template <typename T>
void rope_backward(T* dx, const RopeShape& shape, const T* cos, const T* sin);
// Fills cos/sin (T, half) for positions 0..T-1 from inv_freq(half): angle = t * inv_freq[d] in T's
// precision, cos and sin times `scaling` (YaRN's and LongRoPE's attention factor), as Hugging Face
// computes them (for float: float32 product and float32 scaling).
template <typename T>
void rope_tables(T* cos, T* sin, std::int64_t seq_len, std::int64_t half, const T* inv_freq,
                 double scaling);
// Plain RoPE's inverse frequencies: inv_freq[d] = 1 / theta^(2d/D) for d < D/2, computed in T's
// precision the way Hugging Face computes them (for float: float32 pow and division).
template <typename T>
void rope_default_inv_freq(T* inv_freq, std::int64_t head_dim, double theta);
// Plain RoPE's tables (T, D/2): rope_default_inv_freq, then rope_tables with scaling 1.
template <typename T>
void rope_tables(T* cos, T* sin, std::int64_t seq_len, std::int64_t head_dim, double theta);

// ---- attention ---------------------------------------------------------------------------------
// Causal multi-head attention with grouped KV heads, blocked (flash style): never holds a T x T
// matrix, only 64 x 64 tiles. Row r = b*T + t of q holds H heads of D values at q + r*q_stride;
// k and v hold KV heads at k + r*kv_stride, v + r*kv_stride (query head h reads KV head
// h / (H/KV)). out(B*T, H*D) at out + r*out_stride; lse(B,H,T) = log-sum-exp of each softmax row.
// Query t of a row sees the keys [lo(t), t]: lo(t) = max(0, t - positions[t]) (its own document;
// 0 without positions) and, with a sliding window W, at least t - W + 1. lo never decreases
// along a row (positions restart at 0 or count up by one), so key tiles below a query tile's
// first lo are skipped whole.
struct AttentionShape {
  std::int64_t batch = 0;
  std::int64_t seq_len = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t q_stride = 0;
  std::int64_t kv_stride = 0;
  std::int64_t out_stride = 0;
  double scale = 0.0;                       // usually 1/sqrt(D)
  std::int64_t window = 0;                  // sliding window W; 0 = none
  const std::int32_t* positions = nullptr;  // (B*T) positions in their documents, or null
};

// RoPE applied to an attention's q and k as the attention reads them, the arrays left unrotated
// (the CUDA flash path's staging, Ops::attention_rotates): rope_forward's tables cos and sin
// (rotary_dim / 2 values per position) and rotary width (even, <= head_dim; 0: head_dim), at the
// attention's positions (AttentionShape::positions, else t within its sequence). None where cos
// is null.
template <typename T>
struct QkRotation {
  const T* cos = nullptr;
  const T* sin = nullptr;
  std::int64_t rotary_dim = 0;
};

// The first key query row t of batch row b sees (see above). `A` is an AttentionShape or a CUDA
// attention kernel's argument struct (positions, seq_len and window are read): one rule for the
// CPU reference and every CUDA attention kernel, which call it in device code.
template <typename A>
STRATA_HOST_DEVICE inline std::int64_t attention_first_key(const A& s, std::int64_t b,
                                                           std::int64_t t) {
  std::int64_t lo = 0;
  if (s.positions != nullptr) lo = t - s.positions[b * s.seq_len + t];
  if (s.window > 0 && t - s.window + 1 > lo) lo = t - s.window + 1;
  return lo < 0 ? 0 : lo;
}
template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                       const AttentionShape& shape);
// WRITES dq, dk, dv (same strides as q, k, v; they may be column ranges of one buffer) from
// dout (stride out_stride) and the forward's out and lse.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                        const T* k, const T* v, const AttentionShape& shape);

// ---- loss --------------------------------------------------------------------------------------
// Softmax + cross-entropy over logits(N,V): losses[r] = logsumexp(logits[r]) - logits[r][target].
// A target of -1 (PyTorch's ignore_index) counts for nothing: its loss is 0 and, fused, its
// gradient row is 0.
template <typename T>
void cross_entropy_forward(T* losses, const T* logits, const std::int32_t* targets,
                           std::int64_t rows, std::int64_t vocab);
// Fused forward + backward, in place: losses as above, then logits[r] is overwritten with
// (softmax(logits[r]) - onehot(target)) * grad_scale.
template <typename T>
void cross_entropy_fused(T* logits, T* losses, const std::int32_t* targets, std::int64_t rows,
                         std::int64_t vocab, double grad_scale);

// ---- reductions ---------------------------------------------------------------------------------
// Sum of x[i]^2 in double, in a fixed order (chunks combined in order); inf/NaN propagate.
template <typename T>
double sum_squares(const T* x, std::int64_t n);
// Sum of x[i] in double, in a fixed order.
template <typename T>
double sum(const T* x, std::int64_t n);
// x[i] *= alpha.
template <typename T>
void scale(T* x, std::int64_t n, double alpha);

}  // namespace strata::kernels
