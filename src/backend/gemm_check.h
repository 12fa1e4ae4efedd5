// The start-up checks of a GEMM with its bias, or its bias and GELU, or GELU's gradient, fused into
// the epilogue (the CUDA backend's cuBLASLt CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX_BIAS
// and CUBLASLT_EPILOGUE_DGELU,
// backend/fast_path.h). CUDA-free: the CUDA backend passes its GEMM engine,
// the tests fakes on the CPU backend.
//
// The check runs the fused GEMM on the backend's memory for small shapes, every transposition, on
// inputs exactly representable in the 16-bit type (so rounding them is exact in every GEMM
// precision), and compares each element with the CPU's product in double within fp32
// accumulation's bound, (k + 2) 2^-24 (sum over k of |a b| + |bias|). It fails on an error, an
// element over its bound, or a call that did not fuse the bias.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/backend.h"
#include "common/status.h"

namespace strata::backend {

// C(m,n) = op(A) op(B) + bias(n) on every row, C contiguous, on device fp32 arrays; returns
// whether the bias was fused (false: C holds the product alone).
using GemmBiasFn = std::function<Result<bool>(
    bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
    std::int64_t lda, const float* b, std::int64_t ldb, const float* bias, float* c)>;

// `fp16_inputs`: inputs are fp16 values (an fp16 GEMM precision), else bf16 values.
Status check_gemm_bias(Backend& backend, const GemmBiasFn& fused, bool fp16_inputs);

// pre(m,n) = op(A) op(B) + bias(n) and act = GELU(pre) (tanh form), both contiguous; returns
// whether they were fused (false: nothing was computed).
using GemmBiasGeluFn = std::function<Result<bool>(
    bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
    std::int64_t lda, const float* b, std::int64_t ldb, const float* bias, float* pre, float* act)>;

// pre as check_gemm_bias checks C; act against GELU of the reference pre in double within
// |GELU'(pre)| (pre's bound) + 2^-20 (|act| + |pre|) + 2^-24: the error of evaluating this model's
// GELU in fp32 with an accurate tanh, with room. Another GELU (the erf form, up to 4.7e-4 away) or
// a tanh approximated to 2^-12 fails, and the unfused kernels run instead.
Status check_gemm_bias_gelu(Backend& backend, const GemmBiasGeluFn& fused, bool fp16_inputs);

// dpre(m,n) = (op(A) op(B)) ∘ GELU'(pre), contiguous, pre given; returns whether it was fused
// (false: nothing was computed).
using GemmDgeluFn = std::function<Result<bool>(
    bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
    std::int64_t lda, const float* b, std::int64_t ldb, const float* pre, float* dpre)>;

// dpre against the product in double times the derivative of this model's GELU (tanh form) at pre
// (fp32 values in [-4, 4)), within |GELU'(pre)| (the product's bound) + 2^-20 |product| (1 +
// |GELU'(pre)|) + 2^-24. The erf form's derivative (up to 1.3e-3 away) fails, as does a product
// left without the derivative; the unfused kernels then run.
Status check_gemm_dgelu(Backend& backend, const GemmDgeluFn& fused, bool fp16_inputs);

// C(m,n) = op(A) op(B) (+ bias(n) on every row where bias is not null) + R(m,n), C and R
// contiguous and apart; returns whether the residual was fused (false: nothing was computed).
using GemmResidualFn = std::function<Result<bool>(
    bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
    std::int64_t lda, const float* b, std::int64_t ldb, const float* bias, const float* residual,
    float* c)>;

// As check_gemm_bias, each case with and without a bias, R drawn as A and B are, its magnitude
// added to the bound's sum: a residual left out, added twice or read transposed fails.
Status check_gemm_residual(Backend& backend, const GemmResidualFn& fused, bool fp16_inputs);

// The same two in 16 bits (GemmEngine::gemm_bias_gelu_to_16, gemm_dgelu_to_16): pre16 and act16
// (the forward) or dpre16 (the backward, reading pre16) are arrays of the 16-bit type (bf16, or
// fp16 with `fp16_inputs`), each the fp32 result rounded once; returns whether the epilogue ran.
using GemmBiasGelu16Fn =
    std::function<Result<bool>(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                               std::int64_t k, const float* a, std::int64_t lda, const float* b,
                               std::int64_t ldb, const float* bias, void* pre16, void* act16)>;
using GemmDgelu16Fn = std::function<Result<bool>(
    bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
    std::int64_t lda, const float* b, std::int64_t ldb, const void* pre16, void* dpre16)>;

// As check_gemm_bias_gelu and check_gemm_dgelu (the pre-activation DGELU reads drawn in [-4, 4) and
// rounded to the 16-bit type), each bound widened by one unit in the last place of the 16-bit type
// at the value's magnitude (the rounding of the fp32 result, with room); act's bound takes pre's
// so widened through |GELU'| (GELU of the unrounded pre-activation and GELU of its 16-bit rounding
// both pass, as the unfused 16-bit path's does); dpre's adds |product| times how far GELU' moves
// within the rounding interval of the 16-bit pre-activation (half a unit either side, times the
// largest |GELU''| at its middle and ends): a 16-bit pre-activation stands for any value in it. A
// value two units off, one read or written as the other 16-bit type, the erf form or its derivative
// (caught in the tails, where it differs most against |GELU''|) fails.
Status check_gemm_bias_gelu_16(Backend& backend, const GemmBiasGelu16Fn& fused, bool fp16_inputs);
Status check_gemm_dgelu_16(Backend& backend, const GemmDgelu16Fn& fused, bool fp16_inputs);

inline constexpr const char* kGemmBiasName = "gemm_bias_epilogue";
inline constexpr const char* kGemmBiasReplaces = "the GEMM, then the bias kernel (add_bias)";
inline constexpr const char* kGemmBiasGeluName = "gemm_bias_gelu_epilogue";
inline constexpr const char* kGemmBiasGeluReplaces =
    "the GEMM with its bias, then the GELU kernel (gelu_forward)";
// The weights read from their 16-bit parameters (Ops::note_widened): checked with
// check_gemm_bias on a product whose B is noted as the widening of its 16-bit copy (the bias added
// by the verified kernel after it), failing when the engine converted B after all.
inline constexpr const char* kWeights16Name = "gemm_weights_16bit";
inline constexpr const char* kWeights16Replaces =
    "every weight converted from its fp32 copy to 16 bits before its GEMM";
// Activations' 16-bit companions (Ops::pair_narrow): checked with check_gemm_bias on a product
// whose operands were written with their companions by a kernel that writes them, failing when the
// engine converted either after all.
inline constexpr const char* kActivations16Name = "gemm_activations_16bit";
inline constexpr const char* kActivations16Replaces =
    "every activation converted from fp32 to 16 bits before its GEMMs";
inline constexpr const char* kGemmDgeluName = "gemm_dgelu_epilogue";
inline constexpr const char* kGemmDgeluReplaces =
    "the GEMM, then the GELU gradient kernel (gelu_backward)";
// The residual add in the product that gives the block's output (each block's MLP output
// projection, both families).
inline constexpr const char* kGemmResidualName = "gemm_residual_epilogue";
inline constexpr const char* kGemmResidualReplaces =
    "the MLP's output projection (with its bias), then the residual add kernel (add)";
// GPT-2's MLP in 16 bits (gelu_16bit with the activation kept alone; gelu_grad_16bit_alone) with
// GELU and its gradient back in the product's epilogue.
inline constexpr const char* kGemmBiasGelu16Name = "gemm_bias_gelu_epilogue_16bit";
inline constexpr const char* kGemmBiasGelu16Replaces =
    "the MLP's pre-activation written in 16 bits by its product and bias, then GELU's 16-bit "
    "kernel (gelu_forward_16) reading it and writing the activation";
inline constexpr const char* kGemmDgelu16Name = "gemm_dgelu_epilogue_16bit";
inline constexpr const char* kGemmDgelu16Replaces =
    "the product giving GELU's output gradient written in fp32 scratch, then GELU's 16-bit "
    "backward kernel (gelu_backward_16) reading it and writing the gradient";

}  // namespace strata::backend
