// The optimizer state's compressed formats (strata.optimizer_state, docs/adam.md), defined once:
// how many bytes they take, and their encoding and decoding outside the Adam kernel's fused pass
// (initialisation, checkpoints, loads, views). The Adam kernel (adam.h) performs the same
// operations element by element inside its update, so a state decoded here and re-encoded by the
// kernel, or the other way round, agrees bit for bit.
//
//   moments kF32   fp32, as Adam keeps them
//           kBF16  bf16; the kernel rounds stochastically (unbiased), loads round to nearest even
//           kQ8    one byte per element and an fp32 absmax per block of `block` elements (a power
//                  of two in [64, 2048]): exp_avg as int8 q in [-127, 127] with
//                      m = sign(q) * ((|q| / 127)^2 * absmax)      (power-law code, densest near 0)
//                  exp_avg_sq as uint8 q in [0, 255] with
//                      v = ((q / 255)^2)^2 * absmax
//                  and, encoding, q = rint(127 * sqrt(|m| / absmax)), rint(255 * sqrt(sqrt(v /
//                  absmax))), with absmax the block's largest |m| or v (0: every code is 0).
//   master bf16    the fp32 master's bytes halved; the kernel rounds stochastically.
//   gradient bf16  the accumulated gradient in bf16 (micro-batches added with stochastic
//                  rounding).
// Stochastic rounding adds 16 random bits below a bf16's mantissa and truncates; the bits come
// from a counter-based hash of (the key of the seed, step and unit, the stream, the element's
// index in its unit), so they depend on neither threads nor timing, nor on tiles or ranks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/state_format.h"
#include "kernels/cpu/dtype.h"

namespace strata::kernels {

// How Adam's moments are stored (MomentFormat, to_string): common/state_format.h, where the
// configuration names them too.
using strata::MomentFormat;

inline constexpr std::size_t kQ8BlockMinElems = 64;
inline constexpr std::size_t kQ8BlockMaxElems = 2048;

// Which moment: the signed first or the non-negative second.
enum class Moment : std::uint8_t { kExpAvg = 0, kExpAvgSq = 1 };

// Bytes of n elements of a moment's values or codes (absmax not included): 4, 2 or 1 each.
constexpr std::uint64_t moment_bytes(MomentFormat format, std::uint64_t n = 1) {
  return n * (format == MomentFormat::kF32 ? 4 : format == MomentFormat::kBF16 ? 2 : 1);
}
// The absmax floats of n elements (kQ8: n / block; else 0). n must be a multiple of block.
std::uint64_t absmax_count(MomentFormat format, std::uint64_t n, std::uint64_t block);

// The stochastic-rounding key of one unit's update (or gradient addition) `step`: one stream
// per (seed, step, unit), `unit` being the unit's id among all units (not its position among
// those a process holds). Within it, element e of the unit (its index in the unit's flat buffer)
// gets rounding_bits(key, stream, e), so the bits do not depend on how the unit is tiled or
// sharded over ranks.
std::uint32_t rounding_key(std::uint64_t seed, std::int64_t step, int unit);

// One 8-bit code of a moment decoded against its block's absmax (the kernel's arithmetic).
float q8_value(Moment which, std::uint8_t code, float absmax);

// n elements of a moment in `format` (codes at `src`, absmax per block for kQ8) to fp32 `dst`.
void decode_moment(MomentFormat format, Moment which, const void* src, const float* absmax,
                   std::size_t block, float* dst, std::size_t n);
// n fp32 elements to `format`: bf16 rounds to nearest even; kQ8 takes each block's absmax as the
// kernel does (0 below FLT_MIN) and codes each element with the kernel's code positions, rounded
// to nearest (the kernel rounds stochastically; a decoded code re-encodes to itself either way).
// n must be a multiple of block for kQ8.
void encode_moment(MomentFormat format, Moment which, const float* src, void* dst, float* absmax,
                   std::size_t block, std::size_t n);

// fp32 <-> a master or gradient of `dtype` (kF32 or kBF16; narrowing rounds to nearest even).
void decode_values(DType dtype, const void* src, float* dst, std::size_t n);
void encode_values(DType dtype, const float* src, void* dst, std::size_t n);

// grad (+)= src for a bf16 accumulator: `assign` stores src rounded to nearest even (the first
// micro-batch: a bf16 gradient is stored exactly); else float(acc) + float(src) rounded
// stochastically, as the Adam kernel rounds, with the bits of stream 3 of `key` (the kernel's
// streams 0-2 are master and moments) at index first_index + i. With `sum_squares`, returns
// the sum of the squares of the stored results in double, in a fixed order (chunks of 64 Ki
// elements, in order), whatever the threads; else 0.
double accumulate_bf16(std::uint16_t* acc, const void* src, DType src_type, std::size_t n,
                       bool assign, std::uint32_t key, std::uint32_t first_index, bool sum_squares);

}  // namespace strata::kernels
