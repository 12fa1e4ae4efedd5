// Whole-array conversions (see cast.h).
#include "kernels/cpu/cast.h"

#include <cstring>

#include "common/assert.h"
#include "kernels/cpu/parallel.h"

namespace strata::kernels {
namespace {

constexpr std::int64_t kGrain = 1 << 16;

// Calls fn(i, value) with src[i] widened to float, for i in [begin, end).
template <typename Fn>
void for_each_as_float(const void* src, DType type, std::int64_t begin, std::int64_t end,
                       const Fn& fn) {
  switch (type) {
    case DType::kF32: {
      const float* s = static_cast<const float*>(src);
      for (std::int64_t i = begin; i < end; ++i)
        fn(i, s[i]);
      return;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::int64_t i = begin; i < end; ++i)
        fn(i, bf16_to_float(s[i]));
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::int64_t i = begin; i < end; ++i)
        fn(i, fp16_to_float(s[i]));
      return;
    }
  }
  STRATA_ASSERT_MSG(false, "unknown source type");
}

void store_float(void* dst, DType type, std::int64_t i, float value) {
  switch (type) {
    case DType::kF32:
      static_cast<float*>(dst)[i] = value;
      return;
    case DType::kBF16:
      static_cast<std::uint16_t*>(dst)[i] = float_to_bf16(value);
      return;
    case DType::kF16:
      static_cast<std::uint16_t*>(dst)[i] = float_to_fp16(value);
      return;
  }
}

}  // namespace

void cast_array(void* dst, DType dst_type, const void* src, DType src_type, std::int64_t n) {
  STRATA_ASSERT(n >= 0);
  if (dst_type == src_type) {
    const std::size_t size = dtype_bytes(dst_type);
    parallel_chunks(n, 1 << 18, [&](std::int64_t begin, std::int64_t end) {
      std::memcpy(static_cast<char*>(dst) + begin * size,
                  static_cast<const char*>(src) + begin * size,
                  static_cast<std::size_t>(end - begin) * size);
    });
    return;
  }
  parallel_chunks(n, kGrain, [&](std::int64_t begin, std::int64_t end) {
    for_each_as_float(src, src_type, begin, end,
                      [&](std::int64_t i, float v) { store_float(dst, dst_type, i, v); });
  });
}

void widen_to_f64(double* dst, const void* src, DType src_type, std::int64_t n) {
  parallel_chunks(n, kGrain, [&](std::int64_t begin, std::int64_t end) {
    for_each_as_float(src, src_type, begin, end,
                      [&](std::int64_t i, float v) { dst[i] = static_cast<double>(v); });
  });
}

void narrow_from_f64(void* dst, DType dst_type, const double* src, std::int64_t n) {
  parallel_chunks(n, kGrain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
      store_float(dst, dst_type, i, static_cast<float>(src[i]));
  });
}

void accumulate_from(float* acc, const void* src, DType src_type, std::int64_t n, bool assign) {
  parallel_chunks(n, kGrain, [&](std::int64_t begin, std::int64_t end) {
    if (assign) {
      for_each_as_float(src, src_type, begin, end, [&](std::int64_t i, float v) { acc[i] = v; });
    } else {
      for_each_as_float(src, src_type, begin, end, [&](std::int64_t i, float v) { acc[i] += v; });
    }
  });
}

}  // namespace strata::kernels
