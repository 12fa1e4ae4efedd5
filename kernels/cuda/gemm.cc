// The CUDA backend's GEMMs (see gemm.h).
#include "kernels/cuda/gemm.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/log.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm_blocks.h"
#include "kernels/cuda/launch.h"

STRATA_CUDA_NAMESPACE(cuda) {
namespace {

using cuda::GemmPrecision;

// The largest power of two (up to 256) that divides the address: what cuBLASLt may assume.
std::uint32_t alignment_of(const void* p) {
  const auto x = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 1;
  while (a < 256 && x % (2 * a) == 0)
    a *= 2;
  return a;
}

cudaDataType_t data_type(int code) {
  if (code == cuda_kernels::kCodeBF16) return CUDA_R_16BF;
  if (code == cuda_kernels::kCodeF16) return CUDA_R_16F;
  return CUDA_R_32F;
}

}  // namespace

Result<std::unique_ptr<GemmEngine>> GemmEngine::create(const GemmEngineConfig& config,
                                                       cudaStream_t stream) {
  if (cuda::converts_operands(config.precision) &&
      (config.convert_workspace == nullptr ||
       config.convert_elements < cuda::kGemmWorkspaceMinElements)) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("the {} GEMM conversion workspace holds {} elements; it needs at "
                              "least {}",
                              cuda::to_string(config.precision), config.convert_elements,
                              cuda::kGemmWorkspaceMinElements));
  }
  std::unique_ptr<GemmEngine> engine(new GemmEngine(config, stream));
  if (!config.use_cublaslt) return engine;
  STRATA_ASSIGN_OR_RETURN(engine->api_, load_cublaslt());
  const CublasLtApi& api = *engine->api_;
  STRATA_TRY(STRATA_CUBLAS_CHECK(api.create(&engine->handle_)));
  STRATA_TRY(STRATA_CUBLAS_CHECK(api.pref_create(&engine->preference_)));
  const std::uint64_t bytes =
      config.cublas_workspace == nullptr ? 0 : config.cublas_workspace_bytes;
  STRATA_TRY(STRATA_CUBLAS_CHECK(api.pref_set(
      engine->preference_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes))));
  return engine;
}

GemmEngine::~GemmEngine() {
  for (Entry& entry : cache_)
    release(entry);
  if (api_ != nullptr) {
    if (preference_ != nullptr) (void)STRATA_CUBLAS_CHECK(api_->pref_destroy(preference_));
    if (handle_ != nullptr) (void)STRATA_CUBLAS_CHECK(api_->destroy(handle_));
  }
}

std::string GemmEngine::description() const {
  const std::string inputs =
      fmt::format("GEMM inputs {}, fp32 accumulation", cuda::to_string(config_.precision));
  if (api_ == nullptr) return fmt::format("Strata's fallback GEMM kernel only, {}", inputs);
  return fmt::format("cuBLASLt {} ({}), {}", api_->get_version(), api_->path, inputs);
}

void GemmEngine::release(Entry& entry) {
  if (!entry.used) return;
  if (api_ != nullptr) {
    if (entry.layout_a != nullptr) (void)STRATA_CUBLAS_CHECK(api_->layout_destroy(entry.layout_a));
    if (entry.layout_b != nullptr) (void)STRATA_CUBLAS_CHECK(api_->layout_destroy(entry.layout_b));
    if (entry.layout_c != nullptr) (void)STRATA_CUBLAS_CHECK(api_->layout_destroy(entry.layout_c));
    if (entry.desc != nullptr) (void)STRATA_CUBLAS_CHECK(api_->desc_destroy(entry.desc));
  }
  entry = Entry{};
}

Result<GemmEngine::Entry*> GemmEngine::lookup(const Key& key) {
  for (Entry& entry : cache_) {
    if (entry.used && entry.key == key) return &entry;
  }
  Entry fresh;
  fresh.used = true;
  fresh.key = key;
  const Status made = describe(key, &fresh);
  if (!made.is_ok()) {
    release(fresh);  // nothing half-made stays in the cache
    return made;
  }
  Entry* slot = nullptr;
  for (Entry& entry : cache_) {
    if (!entry.used) {
      slot = &entry;
      break;
    }
  }
  if (slot == nullptr) {
    slot = &cache_[static_cast<std::size_t>(next_victim_)];
    next_victim_ = (next_victim_ + 1) % kCacheEntries;
    release(*slot);
  }
  *slot = fresh;
  return slot;
}

Status GemmEngine::describe(const Key& key, Entry* out) {
  Entry& e = *out;
  const CublasLtApi& api = *api_;
  const cublasComputeType_t compute =
      key.in_code == cuda_kernels::kCodeF32 && config_.precision == GemmPrecision::kTf32
          ? CUBLAS_COMPUTE_32F_FAST_TF32
          : CUBLAS_COMPUTE_32F;
  STRATA_TRY(STRATA_CUBLAS_CHECK(api.desc_create(&e.desc, compute, CUDA_R_32F)));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS's A is our B.
  const cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATA_TRY(
      STRATA_CUBLAS_CHECK(api.desc_set(e.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a))));
  STRATA_TRY(
      STRATA_CUBLAS_CHECK(api.desc_set(e.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b))));
  if (key.epilogue != 0) {
    const cublasLtEpilogue_t epilogue = key.epilogue == 3   ? CUBLASLT_EPILOGUE_DGELU
                                        : key.epilogue == 2 ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                            : CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = data_type(key.bias_code);
    STRATA_TRY(STRATA_CUBLAS_CHECK(
        api.desc_set(e.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue))));
    if (key.epilogue != 3) {  // DGELU has no bias
      STRATA_TRY(STRATA_CUBLAS_CHECK(api.desc_set(e.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                  &bias_type, sizeof(bias_type))));
    }
    if (key.epilogue >= 2) {
      // The aux output (the pre-activation; DGELU's input) is as C: C's type (cuBLASLt's default
      // aux type is D's) and leading dimension (set before the heuristic, which may take it into
      // account).
      const std::int64_t aux_ld = key.ldc;
      STRATA_TRY(STRATA_CUBLAS_CHECK(
          api.desc_set(e.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld))));
    }
  }
  const cudaDataType_t in = data_type(key.in_code);
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  STRATA_TRY(STRATA_CUBLAS_CHECK(api.layout_create(&e.layout_a, in, u(key.trans_b ? key.k : key.n),
                                                   u(key.trans_b ? key.n : key.k), key.ldb)));
  STRATA_TRY(STRATA_CUBLAS_CHECK(api.layout_create(&e.layout_b, in, u(key.trans_a ? key.m : key.k),
                                                   u(key.trans_a ? key.k : key.m), key.lda)));
  STRATA_TRY(STRATA_CUBLAS_CHECK(
      api.layout_create(&e.layout_c, data_type(key.out_code), u(key.n), u(key.m), key.ldc)));
  // cuBLAS's A is our B, so the alignments swap too.
  const std::uint32_t align_a = static_cast<std::uint32_t>(key.align_b);
  const std::uint32_t align_b = static_cast<std::uint32_t>(key.align_a);
  const std::uint32_t align_c = static_cast<std::uint32_t>(key.align_c);
  const std::uint32_t align_r = static_cast<std::uint32_t>(key.align_r);
  STRATA_TRY(STRATA_CUBLAS_CHECK(api.pref_set(
      preference_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a))));
  STRATA_TRY(STRATA_CUBLAS_CHECK(api.pref_set(
      preference_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b))));
  STRATA_TRY(STRATA_CUBLAS_CHECK(api.pref_set(
      preference_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_r, sizeof(align_r))));
  STRATA_TRY(STRATA_CUBLAS_CHECK(api.pref_set(
      preference_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c))));
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t status = api.heuristic(handle_, e.desc, e.layout_a, e.layout_b, e.layout_c,
                                              e.layout_c, preference_, 1, &result, &count);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && count == 0)) {
    STRATA_LOG_DEBUG(
        "cuBLASLt has no algorithm for m={} n={} k={} (trans {} {}, lds {} {} {}); using the "
        "fallback kernel",
        key.m, key.n, key.k, key.trans_a, key.trans_b, key.lda, key.ldb, key.ldc);
    e.has_algo = false;
    return Status::ok();
  }
  STRATA_TRY(STRATA_CUBLAS_CHECK(status));
  e.algo = result.algo;
  e.has_algo = true;
  return Status::ok();
}

Status GemmEngine::run(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       float alpha, const void* a, std::int64_t lda, const void* b,
                       std::int64_t ldb, float beta, void* c, std::int64_t ldc, int in_code,
                       const GemmEpilogue& epilogue, int out_code) {
  const float* bias = epilogue.bias;
  const bool wide = out_code == cuda_kernels::kCodeF32;
  // cuBLASLt's C: the residual where one is added (only through cuBLASLt: gemm_residual), else the
  // output itself.
  const void* c_read = epilogue.residual != nullptr ? epilogue.residual : c;
  STRATA_ASSERT(epilogue.residual == nullptr || (api_ != nullptr && k > 0 && wide));
  if (api_ != nullptr && k > 0) {
    Key key;
    key.trans_a = trans_a;
    key.trans_b = trans_b;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.in_code = in_code;
    key.out_code = out_code;
    key.align_a = static_cast<int>(alignment_of(a));
    key.align_b = static_cast<int>(alignment_of(b));
    key.align_c = static_cast<int>(alignment_of(c));
    key.align_r = static_cast<int>(alignment_of(c_read));
    key.epilogue = epilogue.dgelu ? 3 : (bias == nullptr ? 0 : (epilogue.aux != nullptr ? 2 : 1));
    key.bias_code = epilogue.bias16 != nullptr ? out_code : cuda_kernels::kCodeF32;
    STRATA_ASSIGN_OR_RETURN(Entry * entry, lookup(key));
    if (entry->has_algo && key.epilogue != 0) {
      // The bias vector is cuBLAS's D row vector: one value per column of our row-major C.
      if (bias != nullptr) {
        const void* vector = epilogue.bias16 != nullptr ? epilogue.bias16 : bias;
        STRATA_TRY(STRATA_CUBLAS_CHECK(api_->desc_set(
            entry->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vector, sizeof(vector))));
      }
      if (epilogue.aux != nullptr) {
        const std::int64_t aux_ld = ldc;
        STRATA_TRY(STRATA_CUBLAS_CHECK(api_->desc_set(entry->desc,
                                                      CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                      &epilogue.aux, sizeof(epilogue.aux))));
        STRATA_TRY(STRATA_CUBLAS_CHECK(api_->desc_set(
            entry->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld))));
      }
    }
    if (entry->has_algo) {
      const cublasStatus_t status =
          api_->matmul(handle_, entry->desc, &alpha, b, entry->layout_a, a, entry->layout_b, &beta,
                       c_read, entry->layout_c, c, entry->layout_c, &entry->algo,
                       config_.cublas_workspace, config_.cublas_workspace_bytes, stream_);
      if (status != CUBLAS_STATUS_NOT_SUPPORTED) {
        if (epilogue.applied != nullptr) {
          *epilogue.applied = key.epilogue != 0 || epilogue.residual != nullptr;
        }
        return STRATA_CUBLAS_CHECK(status);
      }
      entry->has_algo = false;  // remember, and run the fallback from now on
    }
    // No algorithm with the epilogue at this shape: GELU's and DGELU's callers run their own path;
    // the bias's gets the plain product and adds the bias itself, but with a 16-bit C, whose
    // product may be rounded only once: the fallback kernel adds it.
    if (epilogue.aux != nullptr || epilogue.residual != nullptr) return Status::ok();
    if (bias != nullptr && wide) {
      return run(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, in_code);
    }
  }
  // An fp32 C's caller adds its bias itself (without cuBLASLt no epilogue is asked for); a 16-bit
  // C's bias and GELU are the fallback kernel's (product_to_16 asks it for them without cuBLASLt).
  if (wide) {
    return fallback(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, in_code,
                    out_code);
  }
  const int gelu = epilogue.dgelu            ? cuda_kernels::kGemmDgelu
                   : epilogue.aux != nullptr ? cuda_kernels::kGemmGeluAux
                                             : cuda_kernels::kGemmNoGelu;
  return fallback(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, in_code, out_code,
                  bias, epilogue.aux, gelu);
}

Status GemmEngine::fallback(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                            std::int64_t k, float alpha, const void* a, std::int64_t lda,
                            const void* b, std::int64_t ldb, float beta, void* c, std::int64_t ldc,
                            int in_code, int out_code, const float* bias, void* aux, int gelu) {
  ++fallback_calls_;
  return STRATA_CUDA_CHECK(cuda_kernels::gemm_fallback(stream_, trans_a, trans_b, m, n, k, alpha, a,
                                                       lda, b, ldb, beta, c, ldc, in_code, out_code,
                                                       bias, aux, gelu));
}

int GemmEngine::sixteen_code() const {
  return cuda::converts_operands(config_.precision) ? products_code() : -1;
}

std::int64_t GemmEngine::block_start(const std::uint16_t* at) const {
  const std::int64_t used = at - static_cast<const std::uint16_t*>(config_.convert_workspace);
  return (used + kWorkspaceBlockAlign - 1) / kWorkspaceBlockAlign * kWorkspaceBlockAlign;
}

Result<const void*> GemmEngine::operand_16(const float* x, std::int64_t rows, std::int64_t cols,
                                           std::int64_t ld, std::int64_t* ld16,
                                           std::uint16_t** workspace, const char* what) {
  const int code = products_code();
  bool companion = false;
  if (const void* twin = twin_of(x, rows, cols, ld, code, &companion)) {
    if (companion) {
      ++companion_reads_;
    } else {
      ++twin_calls_;
    }
    *ld16 = ld;
    return twin;
  }
  const std::int64_t start = block_start(*workspace);
  if (start + rows * cols > config_.convert_elements) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("a product written in 16 bits needs its {} ({} x {}) in 16 bits: it "
                              "has no 16-bit copy and does not fit the conversion workspace ({} "
                              "elements) whole",
                              what, rows, cols, config_.convert_elements));
  }
  std::uint16_t* dst = static_cast<std::uint16_t*>(config_.convert_workspace) + start;
  STRATA_TRY(STRATA_CUDA_CHECK(
      cuda_kernels::cast_block_to_16(stream_, dst, code, cols, x, ld, rows, cols)));
  *workspace = dst + rows * cols;
  *ld16 = cols;
  return static_cast<const void*>(dst);
}

Status GemmEngine::gemm_to_16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                              std::int64_t k, const float* a, std::int64_t lda, const float* b,
                              std::int64_t ldb, void* c, std::int64_t ldc, const float* bias,
                              const float* bias_home) {
  return product_to_16(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, {bias, bias_home});
}

Status GemmEngine::product_to_16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                 std::int64_t k, const float* a, std::int64_t lda, const float* b,
                                 std::int64_t ldb, void* c, std::int64_t ldc, const To16Epilogue& e,
                                 bool* applied) {
  STRATA_ASSERT(m >= 0 && n >= 0 && k >= 0);
  if (applied != nullptr) *applied = true;
  if (!cuda::converts_operands(config_.precision)) {
    return Status(ErrorCode::kUnavailable,
                  "a product written in 16 bits needs 16-bit GEMM inputs (bf16 or fp16)");
  }
  if (m == 0 || n == 0) return Status::ok();
  const int code = products_code();
  const float* bias = e.bias;
  auto* workspace = static_cast<std::uint16_t*>(config_.convert_workspace);
  std::int64_t lda16 = 0, ldb16 = 0;
  STRATA_ASSIGN_OR_RETURN(const void* a16, operand_16(a, trans_a ? k : m, trans_a ? m : k, lda,
                                                      &lda16, &workspace, "A operand"));
  // cuBLASLt's epilogue: a bias's where the bias epilogue is on, a GELU's (asked for only where
  // its own is on) always; without cuBLASLt (or with k = 0) the fallback kernel applies them.
  const bool gelu = e.gelu != cuda_kernels::kGemmNoGelu;
  const bool epilogue = (gelu || (bias != nullptr && bias_epilogue_)) && api_ != nullptr && k > 0;
  // cuBLASLt's bias is of D's type: a weight's 16-bit twin where it has one (an activation's
  // companion holds values rounded, so it is not one), else the fp32 bias rounded into the
  // workspace (a parameter's values: exact).
  const std::uint16_t* bias16 = nullptr;
  if (epilogue && bias != nullptr) {
    bool rounded = false;
    bias16 = static_cast<const std::uint16_t*>(
        twin_of(e.bias_home != nullptr ? e.bias_home : bias, 1, n, n, code, &rounded));
    if (bias16 == nullptr || rounded) {
      const std::int64_t start = block_start(workspace);
      if (start + n > config_.convert_elements) {
        return Status(ErrorCode::kUnavailable,
                      fmt::format("a product written in 16 bits needs its bias ({} values) in 16 "
                                  "bits beside its A operand: the conversion workspace ({} "
                                  "elements) is too small",
                                  n, config_.convert_elements));
      }
      std::uint16_t* dst = static_cast<std::uint16_t*>(config_.convert_workspace) + start;
      STRATA_TRY(
          STRATA_CUDA_CHECK(cuda_kernels::cast_block_to_16(stream_, dst, code, n, bias, n, 1, n)));
      workspace = dst + n;
      bias16 = dst;
    }
  }
  // B without a 16-bit copy that does not fit the workspace beside A is converted and multiplied
  // in blocks of its n columns of the product (each output still sums all of k and is rounded
  // once), of a multiple of 8 columns where it can, so that every block of C stays 16-byte aligned.
  const std::int64_t room = config_.convert_elements - block_start(workspace);
  std::int64_t block = n;
  if (twin_of(b, trans_b ? n : k, trans_b ? k : n, ldb, code) == nullptr && n * k > room &&
      room >= k) {
    block = room / k >= 8 ? room / k / 8 * 8 : room / k;
  }
  for (std::int64_t j = 0; j < n; j += block) {
    const std::int64_t cols = std::min(block, n - j);
    std::uint16_t* ws = workspace;  // each block's B converted at the same place, in stream order
    STRATA_ASSIGN_OR_RETURN(const void* b16,
                            operand_16(trans_b ? b + j * ldb : b + j, trans_b ? cols : k,
                                       trans_b ? k : cols, ldb, &ldb16, &ws, "B operand"));
    auto* c16 = static_cast<std::uint16_t*>(c) + j;
    void* aux = e.aux == nullptr ? nullptr : static_cast<std::uint16_t*>(e.aux) + j;
    if (bias == nullptr && !gelu) {
      STRATA_TRY(run(trans_a, trans_b, m, cols, k, 1.0f, a16, lda16, b16, ldb16, 0.0f, c16, ldc,
                     code, {}, code));
      continue;
    }
    const float* block_bias = bias == nullptr ? nullptr : bias + j;
    if (epilogue) {
      bool ran = false;
      GemmEpilogue with{block_bias, aux, &ran, e.gelu == cuda_kernels::kGemmDgelu};
      if (bias != nullptr) with.bias16 = bias16 + j;
      STRATA_TRY(run(trans_a, trans_b, m, cols, k, 1.0f, a16, lda16, b16, ldb16, 0.0f, c16, ldc,
                     code, with, code));
      // A bias alone is done either way (run's fallback kernel adds it where cuBLASLt cannot).
      if (!gelu) {
        ++(ran ? bias_fused_ : bias_unfused_);
        continue;
      }
      if (ran) continue;
      // No algorithm with the GELU epilogue: the caller computes it its own way, or where it has
      // none the fallback kernel does, block by block.
      if (applied != nullptr) *applied = false;
      if (!e.must) return Status::ok();
    }
    STRATA_TRY(fallback(trans_a, trans_b, m, cols, k, 1.0f, a16, lda16, b16, ldb16, 0.0f, c16, ldc,
                        code, code, block_bias, aux, e.gelu));
    if (!epilogue && bias_epilogue_ && !gelu) ++bias_unfused_;
  }
  return Status::ok();
}

Status GemmEngine::gemm_from_16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                std::int64_t k, float alpha, const void* a16, std::int64_t lda,
                                const float* b, std::int64_t ldb, float beta, float* c,
                                std::int64_t ldc) {
  STRATA_ASSERT(m >= 0 && n >= 0 && k >= 0);
  if (!cuda::converts_operands(config_.precision)) {
    return Status(ErrorCode::kUnavailable,
                  "a product reading a 16-bit operand needs 16-bit GEMM inputs (bf16 or fp16)");
  }
  if (m == 0 || n == 0) return Status::ok();
  forget_output(c, m, n, ldc);
  auto* workspace = static_cast<std::uint16_t*>(config_.convert_workspace);
  std::int64_t ldb16 = 0;
  STRATA_ASSIGN_OR_RETURN(const void* b16, operand_16(b, trans_b ? n : k, trans_b ? k : n, ldb,
                                                      &ldb16, &workspace, "B operand"));
  return run(trans_a, trans_b, m, n, k, alpha, a16, lda, b16, ldb16, beta, c, ldc, products_code());
}

bool GemmEngine::make_room(bool companion, int most) {
  const auto kind = [companion](const Twin& t) { return t.companion == companion; };
  if (std::count_if(twins_.begin(), twins_.end(), kind) < most) return true;
  const auto droppable =
      std::find_if(twins_.begin(), twins_.end(), [&](const Twin& t) { return kind(t) && !t.only; });
  if (droppable == twins_.end()) return false;
  twins_.erase(droppable);
  return true;
}

void GemmEngine::note_widened(const float* wide, const void* narrow, int code, std::int64_t n) {
  if (!twins_on_) return;
  forget_widened(wide);
  if (make_room(false, kTwinsMax)) twins_.push_back({wide, narrow, code, n, false, false});
}

int GemmEngine::products_code() const {
  return config_.precision == GemmPrecision::kBf16 ? cuda_kernels::kCodeBF16
                                                   : cuda_kernels::kCodeF16;
}

bool GemmEngine::note_weights_only_in_16(const float* wide, const void* narrow, int code,
                                         std::int64_t n) {
  if (!twins_on_ || !cuda::converts_operands(config_.precision) || code != products_code()) {
    return false;
  }
  forget_widened(wide);
  if (!make_room(false, kTwinsMax)) return false;
  twins_.push_back({wide, narrow, code, n, false, true});
  return true;
}

void GemmEngine::forget_widened(const float* wide) {
  std::erase_if(twins_, [wide](const Twin& t) { return t.wide == wide && !t.companion; });
}

void GemmEngine::forget_output(const float* c, std::int64_t m, std::int64_t n, std::int64_t ldc) {
  if (m < 1 || n < 1) return;
  forget_written(c, static_cast<std::uint64_t>((m - 1) * ldc + n) * sizeof(float));
}

void GemmEngine::note_rounded(const float* wide, const void* narrow, int code, std::int64_t n) {
  if (!companions_on_ || n < 1) return;
  forget_written(wide, static_cast<std::uint64_t>(n) * sizeof(float));
  make_room(true, kCompanionsMax);
  twins_.push_back({wide, narrow, code, n, true, false});
}

bool GemmEngine::note_rounded_alone(const float* wide, const void* narrow, int code,
                                    std::int64_t n) {
  if (!companions_on_ || n < 1 || !cuda::converts_operands(config_.precision) ||
      code != products_code()) {
    return false;
  }
  forget_alone(wide);
  forget_written(wide, static_cast<std::uint64_t>(n) * sizeof(float));
  twins_.push_back({wide, narrow, code, n, true, true});
  return true;
}

void GemmEngine::forget_alone(const float* wide) {
  std::erase_if(twins_, [wide](const Twin& t) { return t.wide == wide && t.companion && t.only; });
}

bool GemmEngine::has_companion(const float* p, std::int64_t n, int code) const {
  bool companion = false;
  return twin_of(p, 1, n, n, code, &companion) != nullptr && companion;
}

void GemmEngine::forget_written(const void* p, std::uint64_t bytes) {
  if (twins_.empty() || bytes == 0) return;
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  const auto end = begin + bytes;
  std::erase_if(twins_, [begin, end](const Twin& t) {
    // A copy without its weights keeps its 16-bit range: the parameters did not change, and no
    // product may read the weights from the copy.
    if (t.only) return false;
    const auto t_begin = reinterpret_cast<std::uintptr_t>(t.wide);
    const auto t_end = t_begin + static_cast<std::uintptr_t>(t.n) * sizeof(float);
    return t_begin < end && begin < t_end;
  });
}

const void* GemmEngine::twin_of(const float* b, std::int64_t rows, std::int64_t cols,
                                std::int64_t ld, int code, bool* companion) const {
  if (rows < 1 || cols < 1) return nullptr;
  const auto at = reinterpret_cast<std::uintptr_t>(b);
  const auto extent = static_cast<std::uintptr_t>((rows - 1) * ld + cols) * sizeof(float);
  for (const Twin& t : twins_) {
    const auto begin = reinterpret_cast<std::uintptr_t>(t.wide);
    const auto end = begin + static_cast<std::uintptr_t>(t.n) * sizeof(float);
    if (t.code != code || at < begin || at + extent > end) continue;
    if (companion != nullptr) *companion = t.companion;
    const std::uintptr_t offset = (at - begin) / sizeof(float);
    return static_cast<const std::uint16_t*>(t.narrow) + offset;
  }
  return nullptr;
}

Status GemmEngine::run_converted(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                 std::int64_t k, float alpha, const float* a, std::int64_t lda,
                                 const float* b, std::int64_t ldb, float beta, float* c,
                                 std::int64_t ldc, const GemmEpilogue& epilogue) {
  const int code = products_code();
  // An operand already in 16 bits (a weight's parameters, an activation's companion) is read in
  // place instead of converted: both, one call without the workspace; one, its blocks are read
  // where they lie while the other's are converted.
  bool a_companion = false, b_companion = false;
  const auto* a16 = static_cast<const std::uint16_t*>(
      twin_of(a, trans_a ? k : m, trans_a ? m : k, lda, code, &a_companion));
  const auto* b16 = static_cast<const std::uint16_t*>(
      twin_of(b, trans_b ? n : k, trans_b ? k : n, ldb, code, &b_companion));
  if (b16 != nullptr && !b_companion) ++twin_calls_;
  companion_reads_ += (a16 != nullptr && a_companion) + (b16 != nullptr && b_companion);
  if (a16 != nullptr && b16 != nullptr) {
    return run(trans_a, trans_b, m, n, k, alpha, a16, lda, b16, ldb, beta, c, ldc, code, epilogue);
  }
  const cuda::GemmBlocking blocking =
      cuda::plan_gemm_blocking(trans_a, trans_b, m, n, k, config_.convert_elements);
  // An epilogue applies only to a product that is one cuBLASLt call (a blocked product would need
  // the bias on the first k block of each output block): cut into blocks, a bias epilogue gives
  // the plain product (*applied stays false) and a GELU epilogue runs nothing.
  GemmEpilogue whole = epilogue;
  if ((epilogue.bias != nullptr || epilogue.dgelu || epilogue.residual != nullptr) &&
      blocking.blocks() != 1) {
    if (epilogue.aux != nullptr || epilogue.residual != nullptr) return Status::ok();
    whole = {};
  }
  auto* a_ws = static_cast<std::uint16_t*>(config_.convert_workspace);
  std::uint16_t* b_ws = a_ws + blocking.a_elements;
  auto convert_to = [&](std::uint16_t* dst) {
    return [this, dst, code](const BlockCopy& copy) {
      return STRATA_CUDA_CHECK(cuda_kernels::cast_block_to_16(
          stream_, dst, code, copy.dst_ld, copy.src, copy.src_ld, copy.rows, copy.cols));
    };
  };
  // A 16-bit operand's block lies at its fp32 block's offset.
  const std::uint16_t* a_block16 = nullptr;
  const std::uint16_t* b_block16 = nullptr;
  auto convert_a = [&](const BlockCopy& copy) {
    if (a16 == nullptr) return convert_to(a_ws)(copy);
    a_block16 = a16 + (copy.src - a);
    return Status::ok();
  };
  auto convert_b = [&](const BlockCopy& copy) {
    if (b16 == nullptr) return convert_to(b_ws)(copy);
    b_block16 = b16 + (copy.src - b);
    return Status::ok();
  };
  return walk_gemm_blocks(blocking, trans_a, trans_b, a, lda, b, ldb, beta, c, ldc, convert_a,
                          convert_b, [&](const BlockProduct& p) {
                            const void* a_in = a16 != nullptr ? a_block16 : a_ws;
                            const std::int64_t a_ld = a16 != nullptr ? lda : p.a_ld;
                            const void* b_in = b16 != nullptr ? b_block16 : b_ws;
                            const std::int64_t b_ld = b16 != nullptr ? ldb : p.b_ld;
                            return run(trans_a, trans_b, p.m, p.n, p.k, alpha, a_in, a_ld, b_in,
                                       b_ld, p.beta, p.c, ldc, code, whole);
                          });
}

Status GemmEngine::gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                        float alpha, const float* a, std::int64_t lda, const float* b,
                        std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  STRATA_ASSERT(m >= 0 && n >= 0 && k >= 0);
  if (m == 0 || n == 0) return Status::ok();
  forget_output(c, m, n, ldc);
  return product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

Status GemmEngine::product(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                           std::int64_t k, float alpha, const float* a, std::int64_t lda,
                           const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc,
                           const GemmEpilogue& epilogue) {
  if (k > 0 && cuda::converts_operands(config_.precision)) {
    return run_converted(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, epilogue);
  }
  return run(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, cuda_kernels::kCodeF32,
             epilogue);
}

Result<bool> GemmEngine::gemm_bias(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                   std::int64_t k, const float* a, std::int64_t lda, const float* b,
                                   std::int64_t ldb, const float* bias, float* c) {
  STRATA_ASSERT(m >= 0 && n >= 0 && k >= 0 && bias != nullptr);
  forget_output(c, m, n, n);
  if (!bias_epilogue_ || api_ == nullptr || m == 0 || n == 0 || k == 0) {
    STRATA_TRY(gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n));
    if (bias_epilogue_) ++bias_unfused_;
    return false;
  }
  bool applied = false;
  STRATA_TRY(product(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n,
                     {bias, nullptr, &applied}));
  ++(applied ? bias_fused_ : bias_unfused_);
  return applied;
}

Result<bool> GemmEngine::gemm_residual(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                       std::int64_t k, const float* a, std::int64_t lda,
                                       const float* b, std::int64_t ldb, const float* bias,
                                       const float* residual, float* c) {
  STRATA_ASSERT(m >= 0 && n >= 0 && k >= 0 && residual != nullptr && residual != c);
  if (!residual_epilogue_ || api_ == nullptr || m == 0 || n == 0 || k == 0) {
    if (residual_epilogue_) ++residual_unfused_;
    return false;
  }
  forget_output(c, m, n, n);
  bool applied = false;
  GemmEpilogue with{bias, nullptr, &applied};
  with.residual = residual;
  STRATA_TRY(product(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, n, with));
  ++(applied ? residual_fused_ : residual_unfused_);
  return applied;
}

Result<bool> GemmEngine::epilogue_only(bool on, std::int64_t* fused, std::int64_t* unfused,
                                       bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                       std::int64_t k, const float* a, std::int64_t lda,
                                       const float* b, std::int64_t ldb, float* c,
                                       GemmEpilogue epilogue) {
  if (!on || api_ == nullptr || m == 0 || n == 0 || k == 0 ||
      !cuda::converts_operands(config_.precision)) {
    if (on) ++*unfused;
    return false;
  }
  forget_output(c, m, n, n);
  if (epilogue.aux != nullptr) forget_output(static_cast<const float*>(epilogue.aux), m, n, n);
  bool applied = false;
  epilogue.applied = &applied;
  STRATA_TRY(run_converted(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n, epilogue));
  ++*(applied ? fused : unfused);
  return applied;
}

Result<bool> GemmEngine::gemm_bias_gelu(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                        std::int64_t k, const float* a, std::int64_t lda,
                                        const float* b, std::int64_t ldb, const float* bias,
                                        float* pre, float* act) {
  STRATA_ASSERT(m >= 0 && n >= 0 && k >= 0 && bias != nullptr && pre != nullptr);
  return epilogue_only(gelu_epilogue_, &gelu_fused_, &gelu_unfused_, trans_a, trans_b, m, n, k, a,
                       lda, b, ldb, act, {bias, pre});
}

Result<bool> GemmEngine::gemm_dgelu(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                    std::int64_t k, const float* a, std::int64_t lda,
                                    const float* b, std::int64_t ldb, const float* pre,
                                    float* dpre) {
  STRATA_ASSERT(m >= 0 && n >= 0 && k >= 0 && pre != nullptr && dpre != nullptr);
  // cuBLASLt reads the aux pointer for DGELU; the descriptor keeps it as a mutable pointer.
  return epilogue_only(dgelu_epilogue_, &dgelu_fused_, &dgelu_unfused_, trans_a, trans_b, m, n, k,
                       a, lda, b, ldb, dpre, {nullptr, const_cast<float*>(pre), nullptr, true});
}

Result<bool> GemmEngine::gelu_to_16(bool on, std::int64_t* fused, std::int64_t* unfused,
                                    bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                    std::int64_t k, const float* a, std::int64_t lda,
                                    const float* b, std::int64_t ldb, void* c,
                                    const To16Epilogue& e) {
  if (!on) return false;
  bool applied = false;
  const Status ran = product_to_16(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, n, e, &applied);
  // An operand or the bias that does not fit the conversion workspace (checked before anything is
  // queued for it) is declined too where the caller has its own way, which converts in blocks.
  if (ran.code() == ErrorCode::kUnavailable && !e.must) {
    applied = false;
  } else {
    STRATA_TRY(ran);
  }
  ++*(applied ? fused : unfused);
  return applied || e.must;
}

Result<bool> GemmEngine::gemm_bias_gelu_to_16(bool trans_a, bool trans_b, std::int64_t m,
                                              std::int64_t n, std::int64_t k, const float* a,
                                              std::int64_t lda, const float* b, std::int64_t ldb,
                                              const float* bias, const float* bias_home,
                                              void* pre16, void* act16) {
  STRATA_ASSERT(bias != nullptr && pre16 != nullptr && act16 != nullptr);
  return gelu_to_16(gelu16_epilogue_, &gelu16_fused_, &gelu16_unfused_, trans_a, trans_b, m, n, k,
                    a, lda, b, ldb, act16, {bias, bias_home, pre16, cuda_kernels::kGemmGeluAux});
}

Result<bool> GemmEngine::gemm_dgelu_to_16(bool trans_a, bool trans_b, std::int64_t m,
                                          std::int64_t n, std::int64_t k, const float* a,
                                          std::int64_t lda, const float* b, std::int64_t ldb,
                                          const void* pre16, void* dpre16, bool must) {
  STRATA_ASSERT(pre16 != nullptr && dpre16 != nullptr);
  // cuBLASLt reads the aux pointer for DGELU; the descriptor keeps it as a mutable pointer.
  return gelu_to_16(dgelu16_epilogue_, &dgelu16_fused_, &dgelu16_unfused_, trans_a, trans_b, m, n,
                    k, a, lda, b, ldb, dpre16,
                    {nullptr, nullptr, const_cast<void*>(pre16), cuda_kernels::kGemmDgelu, must});
}

}  // STRATA_CUDA_NAMESPACE(cuda)
