// The start-up check of the gradient of q, k and v kept in 16 bits alone (`qkv_grad_16bit_alone`,
// Ops::keeps_qkv_grad_alone), on top of activations_16bit_alone and rope_in_attention: where the
// 16-bit attention's backward rotates dq and dk back as it widens them, that widening writes the
// q/k/v gradient (the backward scratch dqkv: dq, dk, dv side by side in each row) into its
// companion only, no fp32 array is allocated for it (an address range with nothing behind it,
// AddressRange, stands for it), and the two products that read it (the qkv projection's input
// gradient, as A; its weight gradient, as A transposed) read the companion, as they read the
// companion kept beside the fp32 array already. The Llama family's blocks without q/k norms or a
// qkv bias read it nowhere else. CUDA-free: the CUDA backend passes its ops, the tests fakes on the
// CPU backend.
//
// The path changes no bits, and the check asks for exactly those bits: for two cases of one head
// size the rotated attention took (GQA 2:1 over two batch rows of 24 tokens with the whole head
// rotated; a partial rotary width over 2 x 23), q, k and v side by side as the model keeps them,
// the rotated backward writes the gradient beside its fp32 values and alone, and the check asks for
// the two companions, then the three products on each (check_products_alone), bit for bit, reading
// the one kept alone only after the backend says its products read it from the companion (any
// access to the key faults).
#pragma once

#include <cstdint>
#include <functional>

#include "backend/alone_check.h"
#include "backend/backend.h"
#include "common/status.h"

namespace strata::backend {

inline constexpr const char* kQkvGradAloneName = "qkv_grad_16bit_alone";
inline constexpr const char* kQkvGradAloneReplaces =
    "the fp32 array of the gradient of q, k and v kept beside its 16-bit companion (where the "
    "attention rotates q and k)";

// The ops the path runs through (the backend's Ops<float>, or fakes), with Ops' contracts. The
// void calls report their errors to `finish`.
struct QkvGradAlonePath {
  DType type = DType::kBF16;  // the companions' type
  // As NarrowAlonePath's.
  std::function<Status(float* wide, void* narrow, std::int64_t n, bool alone)> pair;
  std::function<void(const float* wide)> unpair;
  std::function<bool(const float* p, std::int64_t n)> reads_companion;
  // Whether the ops keep the q/k/v gradient of this shape alone (Ops::keeps_qkv_grad_alone).
  std::function<bool(const AttentionShape& shape)> keeps;
  // Ops::attention_forward_rotated and attention_backward_rotated.
  std::function<void(float* out, float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& shape, const kernels::QkRotation<float>& rope)>
      forward_rotated;
  std::function<void(float* dq, float* dk, float* dv, const float* dout, const float* out,
                     const float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& shape, const kernels::QkRotation<float>& rope)>
      backward_rotated;
  AloneGemm gemm;
  // Waits for the calls so far; their first error.
  std::function<Status()> finish;
};

// The path through a backend's own Ops<float> (pair_narrow, pair_narrow_alone, unpair_narrow,
// keeps_qkv_grad_alone, attention_forward_rotated, attention_backward_rotated, gemm with alpha 1
// and beta 0), with the caller's reads_companion and finish.
QkvGradAlonePath ops_qkv_grad_path(
    Ops<float>& ops, std::function<bool(const float* p, std::int64_t n)> reads_companion,
    std::function<Status()> finish);

// OK, or an error naming the case, what differs and the first element whose bits differ (or the
// backend's refusal or error).
Status check_qkv_grad_alone(Backend& backend, const QkvGradAlonePath& path, std::int64_t head_dim);

}  // namespace strata::backend
