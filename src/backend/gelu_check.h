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

}  // namespace strata::backend
