// GEMMs of the CUDA backend: row-major C(m,n) = alpha op(A) op(B) + beta C on fp32 device arrays,
// through cuBLASLt with fp32 accumulation. With GemmPrecision bf16/fp16 the operands are first
// rounded into a fixed 16-bit workspace, in blocks when they do not fit (launch_plan.h); fp32/tf32
// multiply the fp32 arrays directly. Algorithms come from cuBLASLt's heuristic once per shape and
// alignment and are kept in a fixed-size cache (no allocation once the shapes have been seen);
// where cuBLASLt has none, Strata's own tiled kernel runs (gemm_fallback.cu).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/cublaslt_api.h"
#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/dtype_codes.h"
#include "kernels/cuda/launch_plan.h"

STRATA_CUDA_NAMESPACE(cuda) {

struct GemmEngineConfig {
  cuda::GemmPrecision precision = cuda::GemmPrecision::kFp32;
  bool use_cublaslt = true;          // false: only the fallback kernel (tests)
  void* cublas_workspace = nullptr;  // device memory for cuBLASLt
  std::uint64_t cublas_workspace_bytes = 0;
  void* convert_workspace = nullptr;  // device memory for 16-bit operands (bf16/fp16)
  std::int64_t convert_elements = 0;  // its size in 16-bit elements
};

// An epilogue for GemmEngine's calls: the bias (n floats), and with `aux` GELU too, aux receiving
// the pre-activation (C's type and leading dimension); or, with `dgelu`, GELU's gradient: the
// product times GELU'(aux), aux then the forward's pre-activation (read). `applied` is set when
// cuBLASLt ran it.
struct GemmEpilogue {
  const float* bias = nullptr;
  void* aux = nullptr;
  bool* applied = nullptr;
  bool dgelu = false;
  // With a 16-bit C (a bias alone): the bias in C's type, which cuBLASLt then reads (its bias type
  // is D's); the fallback kernel reads the fp32 `bias`.
  const void* bias16 = nullptr;
  // The matrix beta multiplies, where it is not the output (cuBLASLt's C apart from its D: the
  // residual added in the epilogue); same layout as the output.
  const float* residual = nullptr;
};

class GemmEngine {
 public:
  // Creates the cuBLASLt handle (when used) for work on `stream`. kUnavailable when cuBLASLt
  // cannot be loaded; kInvalidArgument for a conversion workspace below
  // kGemmWorkspaceMinElements with bf16/fp16.
  static Result<std::unique_ptr<GemmEngine>> create(const GemmEngineConfig& config,
                                                    cudaStream_t stream);
  ~GemmEngine();
  GemmEngine(const GemmEngine&) = delete;
  GemmEngine& operator=(const GemmEngine&) = delete;

  // Queues the product on the stream (contract of kernels::gemm, row-major, any strides).
  Status gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
              float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
              float beta, float* c, std::int64_t ldc);

  // The products' 16-bit type with bf16/fp16 inputs (cuda_kernels::kCodeBF16 or kCodeF16); -1
  // with fp32 or tf32 inputs.
  int sixteen_code() const;
  // C(m,n) (leading dimension ldc) = op(A) op(B) in the products' 16-bit type: the fp32
  // accumulation rounded once to nearest even (cuBLASLt's D in bf16/fp16, or the fallback kernel
  // storing it so). Each operand is read from its 16-bit range where it has one (a weight's, an
  // activation's companion) and is otherwise converted into the conversion workspace: A whole, B
  // whole or, where it does not fit beside A, in blocks of the product's n columns (the product is
  // never cut along k: each output is rounded once). Only with 16-bit inputs (kUnavailable
  // otherwise), and kUnavailable where A to convert does not fit the workspace whole, or not one
  // column of B beside it.
  // With `bias` (n fp32 values, or null) each output is the product plus its column's bias, rounded
  // once. Where the bias epilogue is on (use_bias_epilogue) and cuBLASLt is used: cuBLASLt's BIAS
  // epilogue with a 16-bit D, whose bias is of D's type: the bias's 16-bit twin, looked up at
  // `bias_home` (where the bias lies in a unit's compute copy; null: at `bias`), or else the bias
  // rounded into the conversion workspace. Both hold exactly its values where it holds 16-bit
  // values, as a parameter widened from its 16-bit copy does. Otherwise, or where cuBLASLt has no
  // algorithm for it, the fallback kernel adds the fp32 bias to each fp32 result before rounding
  // it (the bits of the fp32 product, add_bias and a rounding after it). Counted in bias_fused /
  // bias_unfused while the epilogue is on.
  Status gemm_to_16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                    const float* a, std::int64_t lda, const float* b, std::int64_t ldb, void* c,
                    std::int64_t ldc, const float* bias = nullptr,
                    const float* bias_home = nullptr);
  // pre16(m,n) = op(A) op(B) + bias and act16 = GELU(pre) (the tanh form), both computed from the
  // fp32 result and each rounded once to the products' 16-bit type (GELU of the unrounded
  // pre-activation), contiguous: cuBLASLt's CUBLASLT_EPILOGUE_GELU_AUX_BIAS with a 16-bit D (act16)
  // and aux (pre16, of D's type) and the bias in D's type as gemm_to_16's; without cuBLASLt, the
  // fallback kernel with the same epilogue (kGemmGeluAux). Operands as gemm_to_16's (B in blocks of
  // columns where it must). true where it ran; false where the epilogue is off
  // (use_gelu_epilogue_16) or cuBLASLt has no algorithm with it: then pre16 and act16 may hold
  // part of it, and the caller computes them its own way. Counted in gelu16_fused / gelu16_unfused
  // while on.
  Result<bool> gemm_bias_gelu_to_16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                    std::int64_t k, const float* a, std::int64_t lda,
                                    const float* b, std::int64_t ldb, const float* bias,
                                    const float* bias_home, void* pre16, void* act16);
  void use_gelu_epilogue_16(bool on) { gelu16_epilogue_ = on; }
  // dpre16(m,n) = (op(A) op(B)) GELU'(pre16 widened), the fp32 product times the derivative rounded
  // once, contiguous (pre16 as gemm_bias_gelu_to_16 writes it): cuBLASLt's CUBLASLT_EPILOGUE_DGELU
  // with a 16-bit D and aux, or the fallback kernel with kGemmDgelu; true/false and counts
  // (dgelu16_fused / dgelu16_unfused) as gemm_bias_gelu_to_16's (use_dgelu_epilogue_16). With
  // `must` (the caller has no other way: no fp32 scratch), a product cuBLASLt has no algorithm for
  // runs the fallback kernel with the epilogue instead (counted in dgelu16_unfused) and an operand
  // that does not fit the conversion workspace is an error: true wherever the epilogue is on.
  Result<bool> gemm_dgelu_to_16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                std::int64_t k, const float* a, std::int64_t lda, const float* b,
                                std::int64_t ldb, const void* pre16, void* dpre16,
                                bool must = false);
  void use_dgelu_epilogue_16(bool on) { dgelu16_epilogue_ = on; }
  bool dgelu_epilogue_16() const { return dgelu16_epilogue_; }
  // C = alpha op(A) op(B) + beta C (fp32) with A given in the products' 16-bit type (an array
  // written by gemm_to_16 or a 16-bit kernel), B as for gemm_to_16.
  Status gemm_from_16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                      float alpha, const void* a16, std::int64_t lda, const float* b,
                      std::int64_t ldb, float beta, float* c, std::int64_t ldc);

  // C(m,n) = op(A) op(B) + bias(n) on every row (C contiguous, beta 0). With the bias epilogue on
  // (use_bias_epilogue) cuBLASLt adds the bias in the GEMM's epilogue and this returns true. It
  // returns false, with the product alone in C for the caller to add the bias to, when the
  // epilogue is off, cuBLASLt is not used, the converted operands are cut into blocks, or cuBLASLt
  // has no algorithm with the epilogue at this shape.
  Result<bool> gemm_bias(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                         const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                         const float* bias, float* c);
  void use_bias_epilogue(bool on) { bias_epilogue_ = on; }
  // pre(m,n) = op(A) op(B) + bias(n) and act = GELU(pre) (the tanh form), both contiguous, beta 0,
  // in one cuBLASLt call with CUBLASLT_EPILOGUE_GELU_AUX_BIAS (pre is the epilogue's aux output):
  // true. Only with 16-bit GEMM inputs and the epilogue on (use_gelu_epilogue), on a product that
  // is one cuBLASLt call with an algorithm for it; otherwise false, with nothing computed.
  Result<bool> gemm_bias_gelu(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                              std::int64_t k, const float* a, std::int64_t lda, const float* b,
                              std::int64_t ldb, const float* bias, float* pre, float* act);
  void use_gelu_epilogue(bool on) { gelu_epilogue_ = on; }
  // dpre(m,n) = (op(A) op(B)) ∘ GELU'(pre) in one cuBLASLt call with CUBLASLT_EPILOGUE_DGELU (pre,
  // leading dimension n, as its aux input): true. Only with 16-bit GEMM inputs and the epilogue on
  // (use_dgelu_epilogue), on a product that is one cuBLASLt call with an algorithm for it;
  // otherwise false and nothing is computed.
  Result<bool> gemm_dgelu(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                          std::int64_t k, const float* a, std::int64_t lda, const float* b,
                          std::int64_t ldb, const float* pre, float* dpre);
  void use_dgelu_epilogue(bool on) { dgelu_epilogue_ = on; }
  // C(m,n) = op(A) op(B) (+ bias(n) on every row, where given) + R(m,n), C and R contiguous and
  // apart: the residual add in the product, cuBLASLt reading R as its C matrix with beta 1 and
  // writing C as its D (with CUBLASLT_EPILOGUE_BIAS where there is a bias): true. false, with
  // nothing computed, where the epilogue is off (use_residual_epilogue), cuBLASLt is not used,
  // the converted operands are cut into blocks, or cuBLASLt has no algorithm for it. Counted in
  // residual_fused / residual_unfused while on.
  Result<bool> gemm_residual(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                             std::int64_t k, const float* a, std::int64_t lda, const float* b,
                             std::int64_t ldb, const float* bias, const float* residual, float* c);
  void use_residual_epilogue(bool on) { residual_epilogue_ = on; }
  std::int64_t residual_fused() const { return residual_fused_; }
  std::int64_t residual_unfused() const { return residual_unfused_; }
  // Whether the bias epilogue can run at all here (cuBLASLt loaded).
  bool has_cublaslt() const { return api_ != nullptr; }

  // `wide` (n floats on the device) holds exactly the values of `narrow` (n elements of 16-bit
  // `code`, kCodeBF16 or kCodeF16) until forget_widened(wide): the parameters' fp32 compute copy
  // beside the 16-bit parameters it was widened from. A product's operand lying inside `wide`,
  // with 16-bit inputs of the same code, is read from `narrow` instead of converted (the same
  // bits: widening and then rounding a 16-bit value gives it back), block by block where the
  // product is cut into blocks. Noting a range again
  // replaces it; at most kTwinsMax ranges are kept (the oldest is dropped).
  // Off (the default, or after use_weight_twins(false)): note_widened is ignored.
  void use_weight_twins(bool on) {
    twins_on_ = on;
    if (!on) twins_.clear();
  }
  void note_widened(const float* wide, const void* narrow, int code, std::int64_t n);
  // The same for a copy whose weights were NOT widened (only the tensors other kernels read
  // were): every operand inside `wide` must be read from `narrow` until forget_widened(wide), so
  // the range is kept whatever is written into `wide` meanwhile and is never dropped to make room.
  // false (nothing noted) where that cannot be promised: the twins are off, the products do not
  // convert fp32 operands to 16-bit `code`, or kTwinsMax such ranges are kept already.
  bool note_weights_only_in_16(const float* wide, const void* narrow, int code, std::int64_t n);
  void forget_widened(const float* wide);
  static constexpr int kTwinsMax = 64;
  // Products whose B operand was read from a noted 16-bit range.
  std::int64_t twin_calls() const { return twin_calls_; }

  // `wide` (n floats) was just written, and `narrow` (n elements of 16-bit `code`) holds each of
  // its values rounded to nearest even: an activation's companion, written by the kernel that
  // wrote the activation (cuda_kernels::Narrow). Either operand of a product lying inside it, with
  // 16-bit inputs of the same code, is read from `narrow` (the bits run_converted's conversion
  // would give) until forget_written covers any of it. Off (the default, or after
  // use_companions(false)): note_rounded is ignored. At most kCompanionsMax ranges are kept.
  void use_companions(bool on) {
    companions_on_ = on;
    if (!on) std::erase_if(twins_, [](const Twin& t) { return t.companion; });
  }
  bool companions_on() const { return companions_on_; }
  void note_rounded(const float* wide, const void* narrow, int code, std::int64_t n);
  // The same for an activation kept in 16 bits alone: `wide` is only an address range (nothing
  // is stored there) and every product reading inside it reads `narrow`, whatever is written
  // around it, until forget_alone(wide); never dropped to make room. false (nothing noted) where
  // that cannot be promised: the companions are off, or the products do not convert fp32 operands
  // to 16-bit `code`.
  bool note_rounded_alone(const float* wide, const void* narrow, int code, std::int64_t n);
  void forget_alone(const float* wide);
  // Bytes [p, p + bytes) were written without their companion: every noted range (a weight's or
  // an activation's) overlapping them is forgotten.
  void forget_written(const void* p, std::uint64_t bytes);
  static constexpr int kCompanionsMax = 1024;
  // Whether the n floats at p lie inside one range noted by note_rounded for 16-bit `code` (their
  // companion holds their rounding).
  bool has_companion(const float* p, std::int64_t n, int code) const;
  // Operands read from an activation's companion.
  std::int64_t companion_reads() const { return companion_reads_; }

  // "cuBLASLt 130001 (libcublasLt.so.13), GEMM inputs bf16, fp32 accumulation".
  std::string description() const;
  // Calls that ran the fallback kernel instead of cuBLASLt.
  std::int64_t fallback_calls() const { return fallback_calls_; }
  // gemm_bias / gemm_bias_gelu calls whose epilogue ran, and those that did not (the caller then
  // ran the unfused ops), while the epilogue was on.
  std::int64_t bias_fused() const { return bias_fused_; }
  std::int64_t bias_unfused() const { return bias_unfused_; }
  std::int64_t gelu_fused() const { return gelu_fused_; }
  std::int64_t gelu_unfused() const { return gelu_unfused_; }
  std::int64_t dgelu_fused() const { return dgelu_fused_; }
  std::int64_t dgelu_unfused() const { return dgelu_unfused_; }
  std::int64_t gelu16_fused() const { return gelu16_fused_; }
  std::int64_t gelu16_unfused() const { return gelu16_unfused_; }
  std::int64_t dgelu16_fused() const { return dgelu16_fused_; }
  std::int64_t dgelu16_unfused() const { return dgelu16_unfused_; }
  // Zeroes those counts (after the backend's start-up checks).
  void reset_epilogue_counts() {
    bias_fused_ = bias_unfused_ = gelu_fused_ = gelu_unfused_ = dgelu_fused_ = dgelu_unfused_ = 0;
    gelu16_fused_ = gelu16_unfused_ = dgelu16_fused_ = dgelu16_unfused_ = 0;
    residual_fused_ = residual_unfused_ = 0;
    twin_calls_ = 0;
    companion_reads_ = 0;
  }

 private:
  struct Key {
    bool trans_a = false, trans_b = false;
    std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
    int in_code = 0;
    int out_code = 0;  // C's and D's element type (kCodeF32 but in gemm_to_16)
    int align_a = 0, align_b = 0, align_c = 0;
    int align_r = 0;  // cuBLASLt's C (the residual, or the output itself)
    // 0 none, 1 CUBLASLT_EPILOGUE_BIAS, 2 CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 3
    // CUBLASLT_EPILOGUE_DGELU
    int epilogue = 0;
    int bias_code = 0;  // the bias's element type (kCodeF32, or D's with GemmEpilogue::bias16)
    bool operator==(const Key&) const = default;
  };
  struct Entry {
    bool used = false;
    Key key;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t layout_a = nullptr;  // cuBLAS's A = our B
    cublasLtMatrixLayout_t layout_b = nullptr;  // cuBLAS's B = our A
    cublasLtMatrixLayout_t layout_c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool has_algo = false;
  };
  static constexpr int kCacheEntries = 256;

  GemmEngine(const GemmEngineConfig& config, cudaStream_t stream)
      : config_(config), stream_(stream) {}
  // One call on operands of element type in_code (fp32, bf16 or fp16): cuBLASLt, or the fallback.
  // With an epilogue (beta 0): cuBLASLt's, where it has an algorithm for it, setting *applied.
  // Where it has none, a bias epilogue runs the plain product and a GELU epilogue runs nothing.
  // C is of element type out_code (fp32 unless given; with a 16-bit C only a bias epilogue, which
  // the fallback kernel applies too where cuBLASLt has no algorithm for it).
  Status run(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
             float alpha, const void* a, std::int64_t lda, const void* b, std::int64_t ldb,
             float beta, void* c, std::int64_t ldc, int in_code, const GemmEpilogue& epilogue = {},
             int out_code = cuda_kernels::kCodeF32);
  // The operand x (rows x cols as stored, leading dimension ld) in the products' 16-bit type: its
  // 16-bit range (*ld16 = ld), or converted whole at *workspace (*ld16 = cols), which then moves
  // past it; `what` names it in the error where it does not fit.
  Result<const void*> operand_16(const float* x, std::int64_t rows, std::int64_t cols,
                                 std::int64_t ld, std::int64_t* ld16, std::uint16_t** workspace,
                                 const char* what);
  // The cache entry for `key`, describing it to cuBLASLt (and asking its heuristic) on a miss.
  Result<Entry*> lookup(const Key& key);
  // Strata's own kernel (gemm_fallback), counted; `bias`, `aux` and `gelu` as gemm_fallback's.
  Status fallback(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  float alpha, const void* a, std::int64_t lda, const void* b, std::int64_t ldb,
                  float beta, void* c, std::int64_t ldc, int in_code, int out_code,
                  const float* bias = nullptr, void* aux = nullptr,
                  int gelu = cuda_kernels::kGemmNoGelu);
  // What a product written in 16 bits adds (gemm_to_16's bias; gemm_bias_gelu_to_16's and
  // gemm_dgelu_to_16's GELU with its aux, of C's type and leading dimension).
  struct To16Epilogue {
    const float* bias = nullptr;
    const float* bias_home = nullptr;
    void* aux = nullptr;
    int gelu = cuda_kernels::kGemmNoGelu;
    bool must = false;  // a GELU epilogue cuBLASLt declines runs the fallback kernel's
  };
  // gemm_to_16 with `e`; *applied (where given) false where cuBLASLt had no algorithm for a GELU
  // epilogue (the product then stops there, or with e.must runs the fallback kernel's).
  Status product_to_16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb, void* c,
                       std::int64_t ldc, const To16Epilogue& e, bool* applied = nullptr);
  // gemm_bias_gelu_to_16 and gemm_dgelu_to_16: `on`, the counts, the call.
  Result<bool> gelu_to_16(bool on, std::int64_t* fused, std::int64_t* unfused, bool trans_a,
                          bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                          const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                          void* c, const To16Epilogue& e);
  // An fp32 C's product (alpha, beta, with `epilogue`): run_converted where the GEMMs convert
  // their operands (and k > 0), else run on the fp32 arrays.
  Status product(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                 float beta, float* c, std::int64_t ldc, const GemmEpilogue& epilogue = {});
  // Creates the descriptors of `key` in *out and picks an algorithm (has_algo false: none).
  Status describe(const Key& key, Entry* out);
  void release(Entry& entry);
  Status run_converted(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       float alpha, const float* a, std::int64_t lda, const float* b,
                       std::int64_t ldb, float beta, float* c, std::int64_t ldc,
                       const GemmEpilogue& epilogue = {});

  // A GELU epilogue's call (GELU_AUX_BIAS or DGELU) with 16-bit inputs when `on`: whether it ran,
  // counted in *fused or *unfused; nothing is computed when it did not.
  Result<bool> epilogue_only(bool on, std::int64_t* fused, std::int64_t* unfused, bool trans_a,
                             bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                             const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                             float* c, GemmEpilogue epilogue);

  struct Twin {
    const float* wide = nullptr;
    const void* narrow = nullptr;
    int code = 0;
    std::int64_t n = 0;
    bool companion = false;  // an activation's (note_rounded), else a weight's (note_widened)
    // note_weights_only_in_16: the fp32 copy does not hold the weights; note_rounded_alone: there
    // is no fp32 copy.
    bool only = false;
  };
  // The 16-bit twin of the matrix at `b` (rows x cols, leading dimension ld, all inside one noted
  // range of this code), or null; *companion tells which kind it is.
  const void* twin_of(const float* b, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                      int code, bool* companion = nullptr) const;
  // The conversion workspace's first element (its offset) at or after `at` where a converted
  // operand may start: a block boundary, the alignment cuBLASLt is promised.
  std::int64_t block_start(const std::uint16_t* at) const;
  // The 16-bit type the products convert fp32 operands to (with converts_operands(precision)).
  int products_code() const;
  // Drops the oldest range of the kind once `most` of them are kept (never one noted by
  // note_weights_only_in_16); false where every one of them is such a range.
  bool make_room(bool companion, int most);
  // The product's output (m rows of n, leading dimension ldc) is about to be written.
  void forget_output(const float* c, std::int64_t m, std::int64_t n, std::int64_t ldc);

  GemmEngineConfig config_;
  cudaStream_t stream_;
  std::vector<Twin> twins_;
  bool twins_on_ = false;
  bool companions_on_ = false;
  std::int64_t twin_calls_ = 0;
  std::int64_t companion_reads_ = 0;
  const CublasLtApi* api_ = nullptr;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulPreference_t preference_ = nullptr;
  std::array<Entry, kCacheEntries> cache_{};
  int next_victim_ = 0;
  std::int64_t fallback_calls_ = 0;
  bool bias_epilogue_ = false;
  bool gelu_epilogue_ = false;
  bool dgelu_epilogue_ = false;
  std::int64_t bias_fused_ = 0, bias_unfused_ = 0, gelu_fused_ = 0, gelu_unfused_ = 0;
  std::int64_t dgelu_fused_ = 0, dgelu_unfused_ = 0;
  bool gelu16_epilogue_ = false;
  bool dgelu16_epilogue_ = false;
  std::int64_t gelu16_fused_ = 0, gelu16_unfused_ = 0, dgelu16_fused_ = 0, dgelu16_unfused_ = 0;
  bool residual_epilogue_ = false;
  std::int64_t residual_fused_ = 0, residual_unfused_ = 0;
};

}  // STRATA_CUDA_NAMESPACE(cuda)
