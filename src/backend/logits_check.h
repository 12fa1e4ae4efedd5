// The start-up check of the head's logits in 16 bits alone (`logits_16bit`, Ops::logits_in_narrow):
// the logits GEMM writes bf16 (fp16) logits, the cross-entropy reads them in one pass for its
// statistics and writes the gradient over them in the same type, and the two backward products
// read that gradient as their 16-bit A operand; no fp32 logits are written or read. CUDA-free: the
// CUDA backend passes its GEMM engine and kernels, the tests fakes on the CPU backend.
//
// The path rounds the logits, which the verified path (fp32 logits, cross_entropy_fused, the
// gradient's 16-bit companion) does not, so bits cannot be asked for. On one small head (rows with
// an ignored target, a vocabulary that is not a multiple of 32, the 16-bit rows padded to a
// multiple of 8 elements as the head pads them) the check asks instead, against the verified ops of
// backend.ops_f32():
// - the 16-bit logits within 1 unit in the last place of the verified fp32 logits rounded;
// - the losses within 1e-5 (relative) of the verified cross-entropy of those same 16-bit logits,
//   widened; 0 for an ignored target;
// - the gradient within 1 unit in the last place of that cross-entropy's gradient, rounded; zero
//   rows for ignored targets;
// - the input and weight gradients within 1/64 of their largest magnitude of the verified products
//   of that rounded gradient.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/backend.h"
#include "common/status.h"

namespace strata::backend {

inline constexpr const char* kLogits16Name = "logits_16bit";
inline constexpr const char* kLogits16Replaces =
    "fp32 logits with a 16-bit companion, read three times by the cross-entropy";

// How a backend keeps the logits in 16 bits (`type`, kBF16 or kF16): the three ops of
// Ops::gemm_to_narrow, gemm_from_narrow and cross_entropy_narrow, each returning its error.
struct NarrowLogitsPath {
  DType type = DType::kBF16;
  std::function<Status(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb, void* c,
                       std::int64_t ldc)>
      to_narrow;
  std::function<Status(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       float alpha, const void* a, std::int64_t lda, const float* b,
                       std::int64_t ldb, float beta, float* c, std::int64_t ldc)>
      from_narrow;
  std::function<Status(bool gradient, void* logits, std::int64_t ld, float* losses,
                       const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                       double grad_scale)>
      cross_entropy;
};

// OK, or an error naming the quantity and the first element outside its bound (or an op's own
// error).
Status check_narrow_logits(Backend& backend, const NarrowLogitsPath& path);

}  // namespace strata::backend
