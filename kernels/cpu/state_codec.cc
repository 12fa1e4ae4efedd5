// The optimizer state's formats outside the Adam kernel (see state_codec.h).
#include "kernels/cpu/state_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/assert.h"
#include "kernels/cpu/adam_state.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/float16.h"
#include "kernels/cpu/parallel.h"

namespace strata::kernels {
namespace {

constexpr std::int64_t kGrain = 1 << 16;

bool valid_block(std::size_t block) {
  return block >= kQ8BlockMinElems && block <= kQ8BlockMaxElems && (block & (block - 1)) == 0;
}

// The kernel's code positions, rounded to nearest: 16 rounding bits of 0x8000 put u at the
// middle of its range (detail::q8_round).
constexpr std::uint32_t kNearest = 0x80008000u;

// The stream of a bf16 gradient's stochastic rounding beside the kernel's 0 (master), 1 and 2.
constexpr std::uint32_t kGradStream = 3;

}  // namespace

std::uint64_t absmax_count(MomentFormat format, std::uint64_t n, std::uint64_t block) {
  if (format != MomentFormat::kQ8) return 0;
  STRATA_ASSERT(valid_block(block) && n % block == 0);
  return n / block;
}

std::uint32_t rounding_key(std::uint64_t seed, std::int64_t step, int unit) {
  using detail::lowbias32;
  std::uint32_t k = lowbias32(static_cast<std::uint32_t>(seed) ^ 0x5bd1e995U);
  k = lowbias32(k ^ static_cast<std::uint32_t>(seed >> 32));
  k = lowbias32(k ^ static_cast<std::uint32_t>(step));
  k = lowbias32(k ^ static_cast<std::uint32_t>(static_cast<std::uint64_t>(step) >> 32));
  return lowbias32(k ^ static_cast<std::uint32_t>(unit));
}

float q8_value(Moment which, std::uint8_t code, float absmax) {
  return which == Moment::kExpAvg
             ? detail::q8_decode_exp_avg(static_cast<std::int8_t>(code), absmax)
             : detail::q8_decode_exp_avg_sq(code, absmax);
}

void decode_moment(MomentFormat format, Moment which, const void* src, const float* absmax,
                   std::size_t block, float* dst, std::size_t n) {
  if (format == MomentFormat::kF32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  if (format == MomentFormat::kBF16) {
    cast_array(dst, DType::kF32, src, DType::kBF16, static_cast<std::int64_t>(n));
    return;
  }
  STRATA_ASSERT(valid_block(block) && n % block == 0);
  const auto* codes = static_cast<const std::uint8_t*>(src);
  const auto blocks = static_cast<std::int64_t>(n / block);
  parallel_chunks(blocks, std::max<std::int64_t>(1, kGrain / static_cast<std::int64_t>(block)),
                  [&](std::int64_t b0, std::int64_t b1) {
                    for (std::int64_t b = b0; b < b1; ++b) {
                      const std::size_t at = static_cast<std::size_t>(b) * block;
                      for (std::size_t i = at; i < at + block; ++i)
                        dst[i] = q8_value(which, codes[i], absmax[b]);
                    }
                  });
}

void encode_moment(MomentFormat format, Moment which, const float* src, void* dst, float* absmax,
                   std::size_t block, std::size_t n) {
  if (format == MomentFormat::kF32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  if (format == MomentFormat::kBF16) {
    cast_array(dst, DType::kBF16, src, DType::kF32, static_cast<std::int64_t>(n));
    return;
  }
  STRATA_ASSERT(valid_block(block) && n % block == 0);
  auto* codes = static_cast<std::uint8_t*>(dst);
  const auto blocks = static_cast<std::int64_t>(n / block);
  parallel_chunks(
      blocks, std::max<std::int64_t>(1, kGrain / static_cast<std::int64_t>(block)),
      [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t b = b0; b < b1; ++b) {
          const std::size_t at = static_cast<std::size_t>(b) * block;
          float max = 0.0f;
          for (std::size_t i = at; i < at + block; ++i)
            max = std::max(max, std::fabs(src[i]));
          const float scale = detail::q8_block_scale(max);
          absmax[b] = scale;
          if (scale == 0.0f) {
            std::memset(codes + at, 0, block);
            continue;
          }
          if (which == Moment::kExpAvg) {
            const float inv = 1.0f / scale;
            for (std::size_t i = at; i < at + block; ++i)
              codes[i] =
                  static_cast<std::uint8_t>(detail::q8_encode_exp_avg(src[i], inv, kNearest));
          } else {
            const float inv_sqrt = 1.0f / std::sqrt(scale);
            for (std::size_t i = at; i < at + block; ++i)
              codes[i] = detail::q8_encode_exp_avg_sq(std::sqrt(src[i]), inv_sqrt, kNearest);
          }
        }
      });
}

void decode_values(DType dtype, const void* src, float* dst, std::size_t n) {
  STRATA_ASSERT(dtype == DType::kF32 || dtype == DType::kBF16);
  cast_array(dst, DType::kF32, src, dtype, static_cast<std::int64_t>(n));
}

void encode_values(DType dtype, const float* src, void* dst, std::size_t n) {
  STRATA_ASSERT(dtype == DType::kF32 || dtype == DType::kBF16);
  cast_array(dst, dtype, src, DType::kF32, static_cast<std::int64_t>(n));
}

double accumulate_bf16(std::uint16_t* acc, const void* src, DType src_type, std::size_t n,
                       bool assign, std::uint32_t key, std::uint32_t first_index,
                       bool sum_squares) {
  const auto count = static_cast<std::int64_t>(n);
  const std::uint32_t stream = detail::lowbias32(key + kGradStream + 1);
  std::vector<double> parts(static_cast<std::size_t>((count + kGrain - 1) / kGrain), 0.0);
  parallel_chunks(count, kGrain, [&](std::int64_t i0, std::int64_t i1) {
    double squares = 0.0;
    for (std::int64_t i = i0; i < i1; ++i) {
      float v = 0.0f;
      switch (src_type) {
        case DType::kF32:
          v = static_cast<const float*>(src)[i];
          break;
        case DType::kBF16:
          v = bf16_to_float(static_cast<const std::uint16_t*>(src)[i]);
          break;
        case DType::kF16:
          v = fp16_to_float(static_cast<const std::uint16_t*>(src)[i]);
          break;
      }
      if (assign) {
        acc[i] = float_to_bf16(v);
      } else {
        const float sum = bf16_to_float(acc[i]) + v;
        acc[i] = detail::sr_bf16(
            sum, detail::rounding_bits(stream, first_index + static_cast<std::size_t>(i)));
      }
      if (sum_squares) {
        const double stored = bf16_to_float(acc[i]);
        squares += stored * stored;
      }
    }
    parts[static_cast<std::size_t>(i0 / kGrain)] = squares;
  });
  double total = 0.0;
  for (double p : parts)
    total += p;
  return total;
}

}  // namespace strata::kernels
