// The readable references of one Adam/AdamW step that every SIMD path of AdamKernel is tested
// against: adam_reference() in double precision, following PyTorch's torch.optim.Adam/AdamW
// formulas literally (see adam.h for the formula list), and adam_state_reference(), the exact
// fp32 definition of a step over compressed state (bf16 master, bf16 or 8-bit moments) that every
// path must reproduce bit for bit. Both are slow and plain.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/adam.h"

namespace strata::kernels {

// The reference inputs: the fp32 state before the step and the gradient as stored.
struct AdamReferenceInput {
  const float* master = nullptr;      // [n]
  const float* exp_avg = nullptr;     // [n]
  const float* exp_avg_sq = nullptr;  // [n]
  const void* grad = nullptr;         // [n] of grad_dtype
  DType grad_dtype = DType::kF32;
  std::size_t n = 0;
};

// The state after the step, in double: out_master/out_exp_avg/out_exp_avg_sq have n elements.
// Returns what AdamKernel::step() returns; when it says skipped the outputs are the inputs.
AdamResult adam_reference(const AdamParams& params, const AdamFusion& fusion,
                          const AdamReferenceInput& in, double* out_master, double* out_exp_avg,
                          double* out_exp_avg_sq);

// One step over a tile in any state format, in place, as AdamKernel::step() does it: per
// element, decode the state to fp32 (bf16 widened; 8-bit codes as below), the fp32 update of the
// fp32 kernel (adam_update() in adam_internal.h, operation for operation), then encode: fp32
// stored as is, bf16 rounded stochastically (state_rounding_bits()), 8-bit moments block by block
// against the block's new absmax; the copy-out is the stored master widened, then rounded to
// nearest even (bf16/fp16) or as fp32. With check_finite and an inf/NaN gradient nothing is
// written. Allocates 12 bytes per element.
AdamResult adam_state_reference(const AdamParams& params, const AdamFusion& fusion,
                                const AdamTile& tile);

// The 32 random bits of element i (tile index) of a tile's rounding stream; array 0 is the
// master, 1 exp_avg, 2 exp_avg_sq. Only the low 16 are used.
std::uint32_t state_rounding_bits(std::uint32_t rounding_key, int array, std::size_t i);

// fp32 -> bf16 with stochastic rounding: (bits(x) + (r & 0xFFFF)) >> 16 for finite x; non-finite
// x rounds to nearest even (inf stays inf, NaN stays a quiet NaN).
std::uint16_t stochastic_round_bf16(float x, std::uint32_t r);

// 8-bit moments. exp_avg: code q in [-127, 127], m = copysign((t * t) * absmax, q) with
// t = |q| * (1 / 127.0f). exp_avg_sq: code q in [0, 255], v = (t2 * t2) * absmax with
// t = q * (1 / 255.0f), t2 = t * t.
float q8_decode_exp_avg(std::int8_t code, float absmax);
float q8_decode_exp_avg_sq(std::uint8_t code, float absmax);

// Encodes `count` new moments as one block whose first element has tile index `first` and
// returns the absmax stored for it: the block's max |m| (max v), or 0 with every code 0 when that
// is below FLT_MIN. Otherwise an element's code position is f = 127 * s, s = sqrt(|m| * inv) with
// inv = 1.0f / absmax (exp_avg; the code is negated when m < 0), or f = 255 * s,
// s = sqrt(sqrt(v) * inv_sqrt) with inv_sqrt = 1.0f / sqrt(absmax) (exp_avg_sq), and its code is
// floor(fma(s, 127 or 255, u)), at most 127 (255; NaN codes so too), with
// u = fma(j, (1 - 2^-10) / 65535, 2^-11) and j the low (exp_avg) or high (exp_avg_sq) 16 bits of
// state_rounding_bits(rounding_key, 1, i): stochastic rounding that leaves positions within 2^-11
// of an integer at that integer.
float q8_encode_exp_avg_block(const float* m, std::size_t count, std::int8_t* codes,
                              std::uint32_t rounding_key, std::size_t first);
float q8_encode_exp_avg_sq_block(const float* v, std::size_t count, std::uint8_t* codes,
                                 std::uint32_t rounding_key, std::size_t first);

}  // namespace strata::kernels
