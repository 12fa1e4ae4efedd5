// The start-up check of each block's attention output kept in 16 bits alone
// (`attention_16bit_alone`, Ops::keeps_attention_alone): the 16-bit attention (flash, or cuDNN's
// on the same staging) writes its result into the output's companion only, no fp32 array is
// allocated for it (an address range with nothing behind it, AddressRange, stands for it), its
// backward reads the forward's output from the companion, and the products that read the output
// (the output projection, its weight gradient) read the companion. CUDA-free: the CUDA backend
// passes its ops, the tests fakes on the CPU backend.
//
// The 16-bit attention's fp32 output is its 16-bit result widened, and where the output has a
// companion beside it (pair_narrow, gemm_activations_16bit's verified path) the backward and the
// products read that companion already: the path changes no bits, and the check asks for exactly
// those bits. For each head size the flash attention took, on one shape (GQA 2:1 over two batch
// rows of 24 tokens: partial tiles) that the ops say they keep alone, it runs the forward on an
// output paired beside its fp32 values and on one kept alone, then asks, bit for bit, for:
// - the two companions and the two log-sum-exps;
// - the backward's dq, dk and dv, reading the output kept alone only after the backend says a
//   product reads it from its companion (any access to the key faults);
// - the three products the model runs on such an output (as A, as A transposed, as B).
#pragma once

#include <cstdint>
#include <functional>

#include "backend/alone_check.h"
#include "backend/backend.h"
#include "common/status.h"

namespace strata::backend {

inline constexpr const char* kAttentionAloneName = "attention_16bit_alone";
inline constexpr const char* kAttentionAloneReplaces =
    "the fp32 array of each block's attention output kept beside its 16-bit companion";

// The ops the path runs through (the backend's Ops<float>, or fakes), with Ops' contracts. The
// void calls report their errors to `finish`.
struct AttentionAlonePath {
  DType type = DType::kBF16;  // the companions' type
  // As NarrowAlonePath's.
  std::function<Status(float* wide, void* narrow, std::int64_t n, bool alone)> pair;
  std::function<void(const float* wide)> unpair;
  std::function<bool(const float* p, std::int64_t n)> reads_companion;
  // Whether the ops keep attention outputs of this shape alone (Ops::keeps_attention_alone), and
  // their gradients (Ops::keeps_attention_grad_alone).
  std::function<bool(const AttentionShape& shape)> keeps;
  std::function<bool(const AttentionShape& shape)> keeps_grad;
  std::function<void(float* out, float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& shape)>
      forward;
  std::function<void(float* dq, float* dk, float* dv, const float* dout, const float* out,
                     const float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& shape)>
      backward;
  AloneGemm gemm;
  // Waits for the calls so far; their first error.
  std::function<Status()> finish;
};

// The path through a backend's own Ops<float> (pair_narrow, pair_narrow_alone, unpair_narrow,
// keeps_attention_alone, attention_forward, attention_backward, gemm with alpha 1 and beta 0),
// with the caller's reads_companion and finish.
AttentionAlonePath ops_attention_alone_path(
    Ops<float>& ops, std::function<bool(const float* p, std::int64_t n)> reads_companion,
    std::function<Status()> finish);

// OK, or an error naming the head size, what differs and the first element whose bits differ (or
// the backend's refusal or error).
Status check_attention_alone(Backend& backend, const AttentionAlonePath& path,
                             std::int64_t head_dim);

// The start-up check of the gradient of each block's attention output kept in 16 bits alone
// (`attention_grad_16bit`, Ops::keeps_attention_grad_alone): the product that writes it (dO of the
// attention, from the output projection's input gradient) writes it in 16 bits into its companion,
// with no fp32 array behind it, and the attention's backward reads those 16 bits in place where it
// rounded the fp32 dO into its staging before. The product rounds its fp32 accumulation once,
// where the verified path rounds the fp32 product: at most 1 unit in the last place apart. On the
// shape above, for both layouts of the product (GPT-2's B transposed, the Llama family's not), the
// check asks for:
// - each 16-bit element within 1 unit in the last place of the verified fp32 product rounded (the
//   backend's own gemm, into a buffer of its own);
// - the backward reading the gradient kept alone, bit for bit what the verified backward gives on
//   those 16-bit values widened.
inline constexpr const char* kAttentionGradAloneName = "attention_grad_16bit";
inline constexpr const char* kAttentionGradAloneReplaces =
    "the fp32 gradient of each block's attention output, rounded into the attention's 16-bit "
    "staging by its backward";
Status check_attention_grad_alone(Backend& backend, const AttentionAlonePath& path,
                                  std::int64_t head_dim);

}  // namespace strata::backend
