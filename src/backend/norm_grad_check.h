// The start-up check of the gradient of each norm's output kept in 16 bits alone
// (`norm_grad_16bit`, Ops::keeps_norm_grad_alone): the backward's scratch `dln` (the gradient of a
// block's LayerNorm or RMSNorm output, N x C) is written by one product at a time (the input
// gradient of the projection the norm feeds: the MLP's first, then the attention's qkv), and read
// by the norm's backward alone. Where the path is on, the product writes it in 16 bits into its
// companion, with no fp32 array behind it, and the norm's backward reads those 16 bits widened
// where it read the fp32 product: what autocast gives PyTorch, whose bf16 linear hands its norm a
// bf16 gradient. CUDA-free: the CUDA backend passes its ops, the tests fakes on the CPU backend.
//
// The product rounds its fp32 accumulation once, where nothing was rounded before, so the check
// asks for bounds on the product and bits on the backward. On two shapes (rows of 40 channels,
// 16-byte aligned; rows of 33, not), for both layouts of the product (GPT-2's B transposed, the
// Llama family's not), it asks for:
// - each 16-bit element within 1 unit in the last place of the verified fp32 product rounded (the
//   backend's own gemm, into a buffer of its own);
// - LayerNorm's and RMSNorm's backwards reading the gradient kept alone: dx (added to what it
//   held), dw and db bit for bit what the verified backwards give on the gradient widened.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/alone_check.h"
#include "backend/backend.h"
#include "common/status.h"

namespace strata::backend {

inline constexpr const char* kNormGradAloneName = "norm_grad_16bit";
inline constexpr const char* kNormGradAloneReplaces =
    "the gradient of each block's norm outputs written in fp32 by the projections' input "
    "gradients and read in fp32 by the norms' backwards";

// The ops the path runs through (the backend's Ops<float>, or fakes), with Ops' contracts. The
// void calls report their errors to `finish`.
struct NormGradAlonePath {
  DType type = DType::kBF16;  // the companions' type
  // As NarrowAlonePath's.
  std::function<Status(float* wide, void* narrow, std::int64_t n, bool alone)> pair;
  std::function<void(const float* wide)> unpair;
  // Whether the ops keep the gradient alone (Ops::keeps_norm_grad_alone).
  std::function<bool()> keeps;
  AloneGemm gemm;
  std::function<void(float* dx, float* dw, float* db, const float* dout, const float* x,
                     const float* w, const float* mean, const float* rstd, std::int64_t rows,
                     std::int64_t channels)>
      layernorm_backward;
  std::function<void(float* dx, float* dw, const float* dout, const float* x, const float* w,
                     const float* rstd, std::int64_t rows, std::int64_t channels)>
      rmsnorm_backward;
  // Waits for the calls so far; their first error.
  std::function<Status()> finish;
};

// The path through a backend's own Ops<float> (pair_narrow_alone, unpair_narrow,
// keeps_norm_grad_alone, gemm with alpha 1 and beta 0, layernorm_backward, rmsnorm_backward), with
// the caller's finish.
NormGradAlonePath ops_norm_grad_path(Ops<float>& ops, std::function<Status()> finish);

// OK, or an error naming the shape, the layout, the quantity and its first element outside its
// bound (or the backend's refusal or error).
Status check_norm_grad_alone(Backend& backend, const NormGradAlonePath& path);

}  // namespace strata::backend
