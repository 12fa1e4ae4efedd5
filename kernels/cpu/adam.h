// CPU Adam / AdamW over one tile of master weights and moments, with the mixed-precision work
// fused into the same memory pass: gradient unscale (1/loss_scale), gradient clipping
// coefficient, optional inf/NaN detection that skips the whole tile, and the write of the updated
// weights as bf16 or fp16 for the compute copy. The state may be stored compressed (bf16 master,
// bf16 or 8-bit moments): it is decoded, updated and re-encoded in the same pass. See
// docs/adam.md.
//
// Semantics (PyTorch torch.optim.Adam / AdamW, and DeepSpeed's DeepSpeedCPUAdam), per element,
// with t = params.step (1 for the first step):
//   g  = grad * grad_scale_inv * clip_coef
//   g += weight_decay * p                          (Adam, adamw_mode = false: L2 in the gradient)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   bc1 = 1 - beta1^t,  bc2 = 1 - beta2^t          (both 1 when bias_correction = false)
//   p *= 1 - lr * weight_decay                     (AdamW, adamw_mode = true: decoupled decay)
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
//   copy_out = round_to_nearest_even(p)            (bf16 or fp16, when copy_out is given)
// Each SIMD path computes exactly the same fp32 operations (fma where written above as a*b + c),
// so all paths, and every thread count, give bit-identical results. Compressed state is decoded
// to fp32 before and encoded after these operations, bit-identically on every path too: the
// exact definition is adam_state_reference() in adam_reference.h.
//
// Typical use (the optimizer pipeline streams tiles; the trainer calls it per parameter buffer):
//   auto kernel = AdamKernel::create();                 // best SIMD path, or STRATA_SIMD
//   auto executor = runtime::CpuExecutor::create({.threads = 0});
//   AdamTile tile{.master = p, .exp_avg = m, .exp_avg_sq = v, .grad = g,
//                 .grad_dtype = DType::kBF16, .copy_out = p16, .copy_dtype = DType::kBF16, .n = n};
//   AdamResult r = kernel->step(params, fusion, tile, executor->get());
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "common/status.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/state_codec.h"
#include "runtime/cpu_executor.h"
#include "sys/cpu_features.h"

namespace strata::kernels {

// Hyperparameters of one parameter group for one step.
struct AdamParams {
  float lr = 1e-3f;             // learning rate, >= 0
  float beta1 = 0.9f;           // first-moment decay, in [0, 1)
  float beta2 = 0.999f;         // second-moment decay, in [0, 1)
  float eps = 1e-8f;            // added to the bias-corrected sqrt(v), >= 0
  float weight_decay = 0.0f;    // >= 0; how it acts depends on adamw_mode
  bool adamw_mode = true;       // true: AdamW (p *= 1 - lr*wd); false: Adam (g += wd*p)
  bool bias_correction = true;  // false reproduces DeepSpeed's bias_correction=False
  std::int64_t step = 1;        // steps taken including this one (PyTorch's state["step"]), >= 1
};

// Ok, or kInvalidArgument naming the field, its value and the valid range.
Status validate(const AdamParams& params);

// The optional work fused into the update pass.
struct AdamFusion {
  float grad_scale_inv = 1.0f;  // multiplies the gradient: 1 / loss_scale (1: no unscaling)
  float clip_coef = 1.0f;       // multiplies the gradient: max_norm / total_norm, at most 1
  // Scan the gradient for inf/NaN before touching anything; on a hit nothing is written and the
  // result says skipped. Costs one extra read of the gradient (2-4 of the tile's 26-30 bytes per
  // parameter). Callers that already know the gradient is finite (grad_stats() over all tiles,
  // needed anyway for global clipping and loss scaling) leave it off.
  bool check_finite = false;
};

// How a tile's moments are stored (MomentFormat, to_string, moment_bytes): state_codec.h, which
// also encodes and decodes them outside the update (initialisation, checkpoints, views).

// One tile: n elements of each array. Arrays must not overlap; any alignment of the element type
// is accepted (4 bytes for fp32, 2 for bf16/fp16, 1 for 8-bit codes).
//
// Compressed state (docs/adam.md, "Compressed optimizer state"), element i of the tile:
//   bf16 (master or moments): decoded exactly; after the update rounded stochastically with 16
//     random bits that depend on rounding_key, the array and rounding_offset + i only (not on
//     the thread split; the offset makes the bits those of the element's place in a larger
//     array, so a unit's elements round alike however it is tiled).
//   kQ8 exp_avg: int8 code q in [-127, 127]; m = sign(q) * (|q| / 127)^2 * absmax of its block.
//   kQ8 exp_avg_sq: uint8 code q in [0, 255]; v = (q / 255)^4 * absmax of its block.
//   Each block of `block` elements (from element 0) is re-encoded after the update against the
//   block's new max |m| and max v; a block whose max is below FLT_MIN is stored as zeros.
struct AdamTile {
  void* master = nullptr;            // [n] of master_dtype, updated in place
  DType master_dtype = DType::kF32;  // kF32, or kBF16 (stochastically rounded after each update)
  void* exp_avg = nullptr;           // [n] first moment: fp32 / bf16 / int8 codes, per `moments`
  void* exp_avg_sq = nullptr;        // [n] second moment: fp32 / bf16 / uint8 codes, per `moments`
  MomentFormat moments = MomentFormat::kF32;
  float* exp_avg_absmax = nullptr;     // kQ8: [n / block] per-block scale of exp_avg
  float* exp_avg_sq_absmax = nullptr;  // kQ8: [n / block] per-block scale of exp_avg_sq
  std::size_t block =
      2048;  // kQ8: elements per block; a power of two in [64, 2048]; n % block == 0
  std::uint32_t rounding_key = 0;  // the tile's stochastic-rounding stream (bf16 master or moments)
  std::uint32_t rounding_offset = 0;  // element i hashes index rounding_offset + i
  const void* grad = nullptr;         // [n] gradient of grad_dtype, read only
  DType grad_dtype = DType::kF32;
  void* copy_out = nullptr;  // [n] of copy_dtype receiving the new weights: the stored master
                             // rounded to nearest even (bf16/fp16), or as fp32; null: no copy
  DType copy_dtype = DType::kBF16;
  std::size_t n = 0;
};

struct AdamResult {
  bool skipped = false;               // check_finite found inf/NaN: nothing was written
  std::uint64_t nonfinite_count = 0;  // how many gradient elements were inf/NaN (check_finite)
};

// One read-only pass over a gradient: what clipping and loss scaling need.
struct GradStats {
  std::uint64_t nonfinite_count = 0;  // inf/NaN elements
  double sum_sq = 0.0;                // sum of grad^2 of the raw (still scaled) gradient, in
                                      // double; inf/NaN when nonfinite_count > 0
};

// Work below this many elements runs on the calling thread even when an executor is given.
inline constexpr std::size_t kAdamParallelMinElems = 64 * 1024;
// Elements per scheduling block (64 KiB per fp32 array); blocks are dealt to threads statically.
inline constexpr std::size_t kAdamBlockElems = 16 * 1024;
// Threads split tiles at multiples of kAdamBlockElems, a multiple of the largest 8-bit block
// (kQ8BlockMaxElems, state_codec.h), so every 8-bit block stays on one thread.
static_assert(kAdamBlockElems % kQ8BlockMaxElems == 0);

class AdamKernel {
 public:
  // The path for `simd`, or sys::default_simd_level() (STRATA_SIMD or the best here) when not
  // given. Errors: kUnavailable when this CPU cannot run the requested path.
  static Result<AdamKernel> create(std::optional<sys::SimdLevel> simd = std::nullopt);

  // The SIMD path this kernel runs.
  sys::SimdLevel simd() const { return simd_; }

  // One Adam step over one tile. With an executor (and n >= kAdamParallelMinElems) the tile is
  // split over its threads; without, it runs on the calling thread. Asserts on programmer errors
  // (null arrays with n > 0, overlapping arrays, bad dtypes or formats, a bad 8-bit block size,
  // invalid params).
  AdamResult step(const AdamParams& params, const AdamFusion& fusion, const AdamTile& tile,
                  runtime::CpuExecutor* executor = nullptr) const;

  // Counts inf/NaN and sums grad^2 over n elements. Deterministic: the same bits whatever the
  // thread count (blocks are summed in a fixed tree); paths may differ in the last bits.
  GradStats grad_stats(const void* grad, DType grad_dtype, std::size_t n,
                       runtime::CpuExecutor* executor = nullptr) const;

  // The bandwidth ceiling of step()'s access pattern: p += g; m += g; v += g over n floats in
  // place (reads 4 arrays, writes 3), with the same SIMD path, threads and blocking as step().
  void roofline_step(float* p, float* m, float* v, const float* g, std::size_t n,
                     runtime::CpuExecutor* executor = nullptr) const;

 private:
  explicit AdamKernel(sys::SimdLevel simd) : simd_(simd) {}
  sys::SimdLevel simd_;
};

}  // namespace strata::kernels
