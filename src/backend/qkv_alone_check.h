// The start-up checks of each block's q, k and v and their gradient kept in 16 bits alone (on top
// of activations_16bit_alone and rope_in_attention). In blocks without q/k norms the qkv
// projection's output (q, k, v side by side in each row) is read by the attention alone; in GPT-2's
// and in the Llama family's without a qkv bias, its gradient (the backward scratch dqkv) is read by
// the projection's two products alone (its input gradient, as A; its weight gradient, as A
// transposed) and by GPT-2's bias gradient. No fp32 array is allocated for either where its path is
// on (an address range with nothing behind it, AddressRange, stands for it). CUDA-free: the CUDA
// backend passes its ops, the tests fakes on the CPU backend.
//
// Both checks run three cases of one head size the attention took: GQA 2:1 over two batch rows of
// 24 tokens with the whole head rotated; a partial rotary width over 2 x 23; no rotation over 2 x
// 24, as GPT-2's.
//
// `qkv_grad_16bit_alone` (Ops::keeps_qkv_grad_alone): the attention's backward (the flash
// epilogue, or the staging's widening, rotating dq and dk back where RoPE rides in it) writes the
// gradient into its companion only, and the products read the companion, as they read the
// companion kept beside the fp32 array already. GPT-2's blocks keep it so too: their attention
// does not rotate, so the companion (of the attention's 16-bit type) holds the gradient's fp32
// values exactly, and the qkv bias's column sums (bias_backward) read it widened. The path changes
// no bits, and its check asks for exactly those bits: the backward writes the gradient beside its
// fp32 values and alone, and the check asks for the two companions, then the three products on
// each (check_products_alone), bit for bit, reading the one kept alone only after the backend says
// its products read it from the companion (any access to the key faults); and, without rotation,
// the bias's column sums of each, bit for bit.
//
// `qkv_16bit` (Ops::keeps_qkv_alone): the projection writes q, k and v in 16 bits (its fp32
// accumulation, plus its bias in fp32 where it has one, rounded once, as autocast's bf16 projection
// rounds its output) and the attention's staging reads those 16 bits, widened, where it rounded the
// fp32 values before (rotating q and k as it rounds them again where RoPE rides in it, copying the
// rest). Its check, the projection with a bias (of 16-bit values, as a parameter's are) in the last
// two cases, asks for each 16-bit element
// within 1 unit in the last place of the verified fp32 product (the backend's own gemm or
// gemm_bias) rounded, then the forward (out, lse) and backward (dq, dk, dv), rotated or not,
// reading q, k and v kept alone, bit for bit what they give on fp32 arrays holding those 16-bit
// values widened.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/alone_check.h"
#include "backend/backend.h"
#include "common/status.h"

namespace strata::backend {

inline constexpr const char* kQkvAloneName = "qkv_16bit";
inline constexpr const char* kQkvAloneReplaces =
    "each block's fp32 q, k and v (the qkv projection's output), rounded into the attention's "
    "16-bit staging by its forward and backward";
inline constexpr const char* kQkvGradAloneName = "qkv_grad_16bit_alone";
inline constexpr const char* kQkvGradAloneReplaces =
    "the fp32 array of the gradient of q, k and v kept beside its 16-bit companion (where the "
    "attention rotates q and k)";

// The ops the path runs through (the backend's Ops<float>, or fakes), with Ops' contracts. The
// void calls report their errors to `finish`.
struct QkvAlonePath {
  DType type = DType::kBF16;  // the companions' type
  // As NarrowAlonePath's.
  std::function<Status(float* wide, void* narrow, std::int64_t n, bool alone)> pair;
  std::function<void(const float* wide)> unpair;
  std::function<bool(const float* p, std::int64_t n)> reads_companion;
  // Whether the ops keep q, k and v of this shape alone (Ops::keeps_qkv_alone), and their gradient
  // (Ops::keeps_qkv_grad_alone).
  std::function<bool(const AttentionShape& shape)> keeps;
  std::function<bool(const AttentionShape& shape)> keeps_grad;
  // Ops::attention_forward_rotated and attention_backward_rotated.
  std::function<void(float* out, float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& shape, const kernels::QkRotation<float>& rope)>
      forward_rotated;
  std::function<void(float* dq, float* dk, float* dv, const float* dout, const float* out,
                     const float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& shape, const kernels::QkRotation<float>& rope)>
      backward_rotated;
  // Ops::attention_forward and attention_backward (no rotation), and bias_backward.
  std::function<void(float* out, float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& shape)>
      forward;
  std::function<void(float* dq, float* dk, float* dv, const float* dout, const float* out,
                     const float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& shape)>
      backward;
  std::function<void(float* dbias, const float* dout, std::int64_t rows, std::int64_t channels)>
      bias_backward;
  AloneGemm gemm;
  // Ops::gemm_bias (C contiguous).
  std::function<void(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                     const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                     const float* bias, float* c)>
      gemm_bias;
  // Waits for the calls so far; their first error.
  std::function<Status()> finish;
};

// The path through a backend's own Ops<float> (pair_narrow, pair_narrow_alone, unpair_narrow,
// keeps_qkv_alone, keeps_qkv_grad_alone, attention_forward(_rotated), attention_backward(_rotated),
// bias_backward, gemm with alpha 1 and beta 0, gemm_bias), with the caller's reads_companion and
// finish.
QkvAlonePath ops_qkv_alone_path(Ops<float>& ops,
                                std::function<bool(const float* p, std::int64_t n)> reads_companion,
                                std::function<Status()> finish);

// OK, or an error naming the case, what differs and the first element whose bits differ (or the
// backend's refusal or error).
Status check_qkv_grad_alone(Backend& backend, const QkvAlonePath& path, std::int64_t head_dim);
Status check_qkv_alone(Backend& backend, const QkvAlonePath& path, std::int64_t head_dim);

}  // namespace strata::backend
