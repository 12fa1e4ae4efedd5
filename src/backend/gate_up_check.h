// The start-up check of the Llama family's gate and up projections in 16 bits alone
// (`gate_up_16bit`, Ops::keeps_gate_up_narrow): the product writes [gate | up] in bf16 (fp16),
// rounded once from its fp32 accumulation (Ops::gemm_to_narrow), and SwiGLU's forward and backward
// read them so (swiglu_forward_narrow, swiglu_backward_narrow); no fp32 gate and up are written
// or read. That is what autocast gives PyTorch's Llama MLP. CUDA-free: the CUDA backend passes its
// ops, the tests fakes on the CPU backend.
//
// The path rounds gate and up, which the verified path (an fp32 product, SwiGLU's fp32 kernels)
// does not, so the product cannot be asked for bits: on two shapes (rows of 40 inner columns,
// 16-byte aligned; rows of 33, not) the check asks, against the verified ops of backend.ops_f32(),
// for
// - the 16-bit product within 1 unit in the last place of the verified fp32 product rounded;
// - SwiGLU's forward and backward on it, bit for bit what the verified kernels give on its values
//   widened (the same arithmetic on the same inputs).
#pragma once

#include <cstdint>
#include <functional>

#include "backend/alone_check.h"
#include "backend/backend.h"
#include "common/status.h"

namespace strata::backend {

inline constexpr const char* kGateUp16Name = "gate_up_16bit";
inline constexpr const char* kGateUp16Replaces =
    "the Llama family's gate and up projections written in fp32 by their product and read in "
    "fp32 by SwiGLU";

// The path's ops (Ops::gemm_to_narrow, swiglu_forward_narrow and swiglu_backward_narrow), on device
// arrays; errors reach `finish`.
struct NarrowGateUpPath {
  DType type = DType::kBF16;
  std::function<void(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                     const float* a, std::int64_t lda, const float* b, std::int64_t ldb, void* c,
                     std::int64_t ldc)>
      to_narrow;
  std::function<void(float* out, const void* gate_up, std::int64_t rows, std::int64_t inner)>
      forward;
  std::function<void(float* dgate_up, const void* gate_up, const float* dout, std::int64_t rows,
                     std::int64_t inner)>
      backward;
  // Waits for the calls so far (the path's and the verified ops'); their first error.
  std::function<Status()> finish;
};

// The path through a backend's own Ops<float> (gemm_to_narrow, swiglu_forward_narrow,
// swiglu_backward_narrow), with the caller's finish.
NarrowGateUpPath ops_gate_up_path(Ops<float>& ops, std::function<Status()> finish);

// OK, or an error naming the shape, the quantity and its first element outside its bound (or an
// op's own error).
Status check_narrow_gate_up(Backend& backend, const NarrowGateUpPath& path);

// The start-up check of the gradient of SwiGLU's output kept in 16 bits alone
// (`swiglu_grad_16bit`, Ops::keeps_swiglu_grad_alone), on top of gate_up_16bit: the product that
// writes it (dact, the down projection's input gradient) writes it in 16 bits into its companion,
// with no fp32 array behind it, and SwiGLU's backward reads those 16 bits widened where it read
// the fp32 product. The product rounds its fp32 accumulation once, where nothing was rounded
// before, so SwiGLU's backward computes on a rounded gradient, as autocast's does: the check asks
// for bounds on the product and bits on the backward. On the two shapes above, in the Llama
// family's layout (B not transposed), it asks for:
// - each 16-bit element within 1 unit in the last place of the verified fp32 product rounded (the
//   backend's own gemm, into a buffer of its own);
// - SwiGLU's backward on the 16-bit gate and up reading the gradient kept alone, bit for bit what
//   the verified fp32 kernel gives on gate, up and the gradient widened.
inline constexpr const char* kSwigluGradAloneName = "swiglu_grad_16bit";
inline constexpr const char* kSwigluGradAloneReplaces =
    "the gradient of the Llama family's SwiGLU output written in fp32 by the down projection's "
    "input gradient and read in fp32 by SwiGLU's backward";

// The ops the path runs through (the backend's Ops<float>, or fakes), with Ops' contracts. The
// void calls report their errors to `finish`.
struct SwigluGradAlonePath {
  DType type = DType::kBF16;  // the companions' type, and gate and up's
  // As NarrowAlonePath's.
  std::function<Status(float* wide, void* narrow, std::int64_t n, bool alone)> pair;
  std::function<void(const float* wide)> unpair;
  // Whether the ops keep the gradient alone (Ops::keeps_swiglu_grad_alone).
  std::function<bool()> keeps;
  AloneGemm gemm;
  // SwiGLU's backward on gate and up in 16 bits (Ops::swiglu_backward_narrow).
  std::function<void(float* dgate_up, const void* gate_up, const float* dout, std::int64_t rows,
                     std::int64_t inner)>
      backward;
  // Waits for the calls so far; their first error.
  std::function<Status()> finish;
};

// The path through a backend's own Ops<float> (pair_narrow_alone, unpair_narrow,
// keeps_swiglu_grad_alone, gemm with alpha 1 and beta 0, swiglu_backward_narrow), with the
// caller's finish.
SwigluGradAlonePath ops_swiglu_grad_path(Ops<float>& ops, std::function<Status()> finish);

// OK, or an error naming the shape, the quantity and its first element outside its bound (or the
// backend's refusal or error).
Status check_swiglu_grad_alone(Backend& backend, const SwigluGradAlonePath& path);

// The start-up check of the gradient of gate and up kept in 16 bits alone
// (`gate_up_grad_16bit_alone`, Ops::keeps_gate_up_grad_alone), on top of gate_up_16bit: SwiGLU's
// 16-bit backward writes [dgate | dup] (dfc, N x 2I) into its companion only, no fp32 array is
// allocated for it (an address range with nothing behind it stands for it), and the two products
// that read it (the gate/up projection's input gradient, as A; its weight gradient, as A
// transposed) read the companion, as they read the companion kept beside the fp32 array already.
// The path changes no bits, and the check asks for exactly those bits: on the two shapes above,
// SwiGLU's backward writes the gradient beside its fp32 values and alone, and the check asks for
// the two companions, then the products on each (check_products_alone), bit for bit, reading the
// one kept alone only after the backend says its products read it from the companion.
inline constexpr const char* kGateUpGradAloneName = "gate_up_grad_16bit_alone";
inline constexpr const char* kGateUpGradAloneReplaces =
    "the fp32 array of the gradient of the Llama family's gate and up kept beside its 16-bit "
    "companion";

// The ops the path runs through (the backend's Ops<float>, or fakes), with Ops' contracts. The
// void calls report their errors to `finish`.
struct GateUpGradAlonePath {
  DType type = DType::kBF16;  // the companions' type, and gate and up's
  // As NarrowAlonePath's.
  std::function<Status(float* wide, void* narrow, std::int64_t n, bool alone)> pair;
  std::function<void(const float* wide)> unpair;
  std::function<bool(const float* p, std::int64_t n)> reads_companion;
  // Whether the ops keep the gradient alone (Ops::keeps_gate_up_grad_alone).
  std::function<bool()> keeps;
  // SwiGLU's backward on gate and up in 16 bits (Ops::swiglu_backward_narrow).
  std::function<void(float* dgate_up, const void* gate_up, const float* dout, std::int64_t rows,
                     std::int64_t inner)>
      backward;
  AloneGemm gemm;
  // Waits for the calls so far; their first error.
  std::function<Status()> finish;
};

// The path through a backend's own Ops<float> (pair_narrow, pair_narrow_alone, unpair_narrow,
// keeps_gate_up_grad_alone, swiglu_backward_narrow, gemm with alpha 1 and beta 0), with the
// caller's reads_companion and finish.
GateUpGradAlonePath ops_gate_up_grad_path(
    Ops<float>& ops, std::function<bool(const float* p, std::int64_t n)> reads_companion,
    std::function<Status()> finish);

// OK, or an error naming the shape, what differs and the first element whose bits differ (or the
// backend's refusal or error).
Status check_gate_up_grad_alone(Backend& backend, const GateUpGradAlonePath& path);

}  // namespace strata::backend
