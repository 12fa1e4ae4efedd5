// The start-up check of the activations only GEMMs read kept in 16 bits alone
// (`activations_16bit_alone`, Ops::pair_narrow_alone): each block's two norm outputs and its MLP's
// activation (GELU's or SwiGLU's output) are written into their 16-bit companions only, their
// fp32 arrays are never allocated (address ranges with nothing behind them, AddressRange, stand
// for them), and the products that read them read the companions. CUDA-free: the CUDA backend
// passes its ops, the tests fakes on the CPU backend.
//
// The companion of a buffer paired beside its fp32 values (pair_narrow, the verified path of
// gemm_activations_16bit) is what the GEMMs read already, so the path changes no bits, and the
// check asks for exactly those bits. For two shapes (rows of 40 columns, 16-byte aligned; rows of
// 33, not) it writes the activation both ways with each writer the model uses on such a buffer:
// LayerNorm and RMSNorm, each plain and with the residual add fused in front, GELU, SwiGLU, and
// the GEMM with bias and GELU (against the GEMM with bias, then GELU: the fused epilogue has no
// fp32 array to write). After each it asks for:
// - the two companions, bit for bit, and the norms' statistics and residual sums too;
// - the three products the model runs on such an activation (read as A, as A transposed for
//   GPT-2's weight gradients, as B for the Llama family's), bit for bit, reading the one kept
//   alone only after the backend says it reads it from the companion (any access to the key
//   faults);
// - the pre-activation of the GEMM with bias and GELU, bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/address_range.h"
#include "common/status.h"

namespace strata::backend {

inline constexpr const char* kActivations16AloneName = "activations_16bit_alone";
inline constexpr const char* kActivations16AloneReplaces =
    "the fp32 arrays of the activations only GEMMs read (each block's norm outputs and MLP "
    "activation) kept beside their 16-bit companions";

// C = op(A) op(B) (Ops::gemm with alpha 1 and beta 0; C's leading dimension ldc).
using AloneGemm = std::function<void(bool ta, bool tb, std::int64_t m, std::int64_t n,
                                     std::int64_t k, const float* a, std::int64_t lda,
                                     const float* b, std::int64_t ldb, float* c, std::int64_t ldc)>;

// The three products the model runs on an activation of rows x cols (read as A by the next
// projection, as A transposed by GPT-2's weight gradients, as B by the Llama family's), on
// `beside` (kept beside its fp32 values) and on `key` (kept alone): an error naming `where`, the
// writer `after` which they ran, the product and the first element whose bits differ.
Status check_products_alone(Backend& backend, const AloneGemm& gemm,
                            const std::function<Status()>& finish, const float* beside,
                            const float* key, std::int64_t rows, std::int64_t cols,
                            const std::string& where, const std::string& after);

// OK where a path's 16-bit `type` is bf16 or fp16; else kInvalidArgument: "{what} is bf16 or fp16,
// not {type}".
Status sixteen_bit_type(DType type, const std::string& what);

// The pairs a start-up check makes through its path (`pair` and `unpair`, as NarrowAlonePath's):
// buffers kept beside their fp32 values, and keys kept alone, each an address range the check
// reserves (any access to it faults). However the check ends, what was paired is unpaired, then
// the ranges are released.
class CheckPairs {
 public:
  using Pair = std::function<Status(float* wide, void* narrow, std::int64_t n, bool alone)>;
  using Unpair = std::function<void(const float* wide)>;
  CheckPairs(Pair pair, Unpair unpair) : pair_(std::move(pair)), unpair_(std::move(unpair)) {}
  ~CheckPairs();
  CheckPairs(const CheckPairs&) = delete;
  CheckPairs& operator=(const CheckPairs&) = delete;

  // The n floats at `wide` paired beside their values with `narrow`; the pairing's error in
  // `where`.
  Status beside(float* wide, void* narrow, std::int64_t n, const std::string& where);
  // A key of n floats reserved (`what` names it) and paired alone with `narrow`: the key, the
  // reservation's error, or the pairing's in `where`.
  Result<float*> alone(void* narrow, std::int64_t n, const std::string& what,
                       const std::string& where);

 private:
  Pair pair_;
  Unpair unpair_;
  std::vector<AddressRange> ranges_;
  std::vector<const float*> paired_;
};

// OK where the n 16-bit companions `beside` (kept beside fp32 values) and `alone` (kept alone)
// have the same bits; else an error naming `where`, the writer `op` and the first that differs.
Status same_companions(Backend& backend, const Buffer& beside, const Buffer& alone, std::int64_t n,
                       const std::string& where, const std::string& op);

// The ops the path runs through (the backend's Ops<float>, or fakes), with Ops' contracts. The
// void calls report their errors to `finish`.
struct NarrowAlonePath {
  DType type = DType::kBF16;  // the companions' type
  // `narrow` (n elements of `type`) paired with the n floats at `wide`: beside them (pair_narrow)
  // or alone (pair_narrow_alone, `wide` an address range with nothing behind it). An error where
  // the backend refuses.
  std::function<Status(float* wide, void* narrow, std::int64_t n, bool alone)> pair;
  std::function<void(const float* wide)> unpair;
  // Whether a product reading the n floats at p reads them from a 16-bit companion.
  std::function<bool(const float* p, std::int64_t n)> reads_companion;
  std::function<void(float* out, float* mean, float* rstd, const float* x, const float* w,
                     const float* b, std::int64_t rows, std::int64_t channels, double eps)>
      layernorm;
  std::function<void(float* res, const float* x, float* out, float* mean, float* rstd,
                     const float* w, const float* b, std::int64_t rows, std::int64_t channels,
                     double eps)>
      add_layernorm;
  std::function<void(float* out, float* rstd, const float* x, const float* w, std::int64_t rows,
                     std::int64_t channels, double eps)>
      rmsnorm;
  std::function<void(float* res, const float* x, float* out, float* rstd, const float* w,
                     std::int64_t rows, std::int64_t channels, double eps)>
      add_rmsnorm;
  std::function<void(float* out, const float* x, std::int64_t n)> gelu;
  std::function<void(float* out, const float* gate_up, std::int64_t rows, std::int64_t inner)>
      swiglu;
  std::function<void(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                     const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                     const float* bias, float* c)>
      gemm_bias;
  std::function<void(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                     const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                     const float* bias, float* pre, float* act)>
      gemm_bias_gelu;
  AloneGemm gemm;
  // Waits for the calls so far; their first error.
  std::function<Status()> finish;
};

// The path through a backend's own Ops<float> (pair_narrow, pair_narrow_alone, unpair_narrow, the
// writers, gemm with alpha 1 and beta 0), with the caller's reads_companion and finish.
NarrowAlonePath ops_alone_path(Ops<float>& ops,
                               std::function<bool(const float* p, std::int64_t n)> reads_companion,
                               std::function<Status()> finish);

// OK, or an error naming the shape, the writer and the first element whose bits differ (or the
// backend's refusal or error).
Status check_narrow_alone(Backend& backend, const NarrowAlonePath& path);

}  // namespace strata::backend
