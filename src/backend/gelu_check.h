// The start-up check of GPT-2's MLP pre-activation in 16 bits (`gelu_16bit`,
// Ops::keeps_gelu_narrow): the product writes fc = x W + b in bf16 (fp16), its fp32 accumulation
// plus the bias rounded once (Ops::gemm_bias_gelu_narrow, through GemmEngine::gemm_to_16 with the
// bias), and GELU's forward (gemm_bias_gelu_narrow) and backward (Ops::gemm_dgelu_narrow) read it
// so; no fp32 pre-activation is written or read. That is what autocast gives PyTorch's GPT-2 MLP
// (its bf16 c_fc output). CUDA-free: the CUDA backend passes its ops, the tests fakes on the CPU
// backend.
//
// The path rounds the pre-activation, which the verified path (the fp32 product and bias, GELU's
// fp32 kernels) does not, so the product cannot be asked for bits: on two shapes (rows of 40 inner
// columns; rows of 33, not a multiple of 4) in GPT-2's layout (the forward's B not transposed, the
// backward's transposed), with a bias of 16-bit values as a parameter's are, the check asks,
// against the verified ops of backend.ops_f32(), for
// - the 16-bit pre-activation within 1 unit in the last place of the verified fp32 product plus
//   bias (gemm_bias) rounded;
// - GELU's forward on it, bit for bit what the verified kernel gives on its values widened;
// - the backward (the product into fp32 scratch, then GELU's gradient) bit for bit what the
//   verified product and gelu_backward (onto a zeroed gradient) give on those values widened.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/alone_check.h"
#include "backend/backend.h"
#include "common/status.h"

namespace strata::backend {

inline constexpr const char* kGelu16Name = "gelu_16bit";
inline constexpr const char* kGelu16Replaces =
    "GPT-2's MLP pre-activation written in fp32 by its product and bias and read in fp32 by "
    "GELU's forward and backward";

// The path's ops (Ops::gemm_bias_gelu_narrow and gemm_dgelu_narrow), on device arrays; errors
// reach `finish`.
struct NarrowGeluPath {
  DType type = DType::kBF16;
  std::function<void(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                     const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                     const float* bias, void* pre16, float* act)>
      forward;
  std::function<void(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                     const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                     const void* pre16, float* scratch, float* dpre)>
      backward;
  // Waits for the calls so far (the path's and the verified ops'); their first error.
  std::function<Status()> finish;
};

// The path through a backend's own Ops<float> (gemm_bias_gelu_narrow, gemm_dgelu_narrow), with the
// caller's finish.
NarrowGeluPath ops_gelu_path(Ops<float>& ops, std::function<Status()> finish);

// OK, or an error naming the shape, the quantity and its first element outside its bound (or an
// op's own error).
Status check_narrow_gelu(Backend& backend, const NarrowGeluPath& path);

// The start-up check of GELU's gradient kept in 16 bits alone (`gelu_grad_16bit_alone`,
// Ops::keeps_gelu_grad_alone), on top of gelu_16bit: GPT-2's backward scratch dfc (N x 4C), written
// by GELU's 16-bit backward and read by the fc projection's two products and its bias's column
// sums, is written into its companion only (no fp32 array behind it); the products read the
// companion, as they read the companion kept beside the fp32 array already, and the bias's sums
// read it widened (the rounded values, where the fp32 path summed the unrounded ones: as autocast's
// bias gradient sums its bf16 gradient). On the two shapes above, the backward writes the gradient
// beside its fp32 values and alone; the check asks for the two companions bit for bit, then the
// three products on each (check_products_alone), reading the one kept alone only after the backend
// says its products read it from the companion (any access to the key faults); then the bias's
// column sums of the one kept alone, bit for bit what the verified bias_backward gives on an fp32
// array holding its companion's values widened.
inline constexpr const char* kGeluGradAloneName = "gelu_grad_16bit_alone";
inline constexpr const char* kGeluGradAloneReplaces =
    "the fp32 array of GPT-2's GELU gradient kept beside its 16-bit companion, and its bias's "
    "column sums reading it in fp32";

// The ops the path runs through (the backend's Ops<float>, or fakes), with Ops' contracts. The
// void calls report their errors to `finish`.
struct GeluGradAlonePath {
  DType type = DType::kBF16;  // the companions' type, and the pre-activation's
  // As NarrowAlonePath's.
  std::function<Status(float* wide, void* narrow, std::int64_t n, bool alone)> pair;
  std::function<void(const float* wide)> unpair;
  std::function<bool(const float* p, std::int64_t n)> reads_companion;
  // Whether the ops keep the gradient alone (Ops::keeps_gelu_grad_alone).
  std::function<bool()> keeps;
  // Ops::gemm_dgelu_narrow and Ops::bias_backward.
  std::function<void(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                     const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                     const void* pre16, float* scratch, float* dpre)>
      backward;
  std::function<void(float* dbias, const float* dout, std::int64_t rows, std::int64_t channels)>
      bias_backward;
  AloneGemm gemm;
  // Waits for the calls so far; their first error.
  std::function<Status()> finish;
};

// The path through a backend's own Ops<float> (pair_narrow, pair_narrow_alone, unpair_narrow,
// keeps_gelu_grad_alone, gemm_dgelu_narrow, bias_backward, gemm with alpha 1 and beta 0), with the
// caller's reads_companion and finish.
GeluGradAlonePath ops_gelu_grad_path(
    Ops<float>& ops, std::function<bool(const float* p, std::int64_t n)> reads_companion,
    std::function<Status()> finish);

// OK, or an error naming the shape, what differs and the first element whose bits differ (or the
// backend's refusal or error).
Status check_gelu_grad_alone(Backend& backend, const GeluGradAlonePath& path);

}  // namespace strata::backend
