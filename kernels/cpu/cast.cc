// Whole-array casts between f32, f64, bf16 and f16 (see cast.h).
#include "kernels/cpu/cast.h"

#include <cstring>

#include "common/assert.h"
#include "kernels/cpu/parallel.h"

namespace strata::kernels {
namespace {

float load_as_float(const void* src, DType type, std::int64_t i) {
  switch (type) {
    case DType::kF32:
      return static_cast<const float*>(src)[i];
    case DType::kF64:
      return static_cast<float>(static_cast<const double*>(src)[i]);
    case DType::kBF16:
      return bf16_to_float(static_cast<const std::uint16_t*>(src)[i]);
    case DType::kF16:
      return fp16_to_float(static_cast<const std::uint16_t*>(src)[i]);
    case DType::kI32:
      break;
  }
  STRATA_ASSERT_MSG(false, "cast_array: unsupported source type");
  return 0.0f;
}

template <typename Load>
void store_all(void* dst, DType dst_type, std::int64_t begin, std::int64_t end, const Load& load) {
  switch (dst_type) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst);
      for (std::int64_t i = begin; i < end; ++i)
        d[i] = static_cast<float>(load(i));
      return;
    }
    case DType::kF64: {
      double* d = static_cast<double*>(dst);
      for (std::int64_t i = begin; i < end; ++i)
        d[i] = load(i);
      return;
    }
    case DType::kBF16: {
      std::uint16_t* d = static_cast<std::uint16_t*>(dst);
      for (std::int64_t i = begin; i < end; ++i)
        d[i] = float_to_bf16(static_cast<float>(load(i)));
      return;
    }
    case DType::kF16: {
      std::uint16_t* d = static_cast<std::uint16_t*>(dst);
      for (std::int64_t i = begin; i < end; ++i)
        d[i] = float_to_fp16(static_cast<float>(load(i)));
      return;
    }
    case DType::kI32:
      break;
  }
  STRATA_ASSERT_MSG(false, "cast_array: unsupported destination type");
}

}  // namespace

const char* dtype_name(DType type) {
  switch (type) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
  }
  return "unknown";
}

void cast_array(void* dst, DType dst_type, const void* src, DType src_type, std::int64_t n) {
  STRATA_ASSERT(n >= 0);
  STRATA_ASSERT(dst_type != DType::kI32 && src_type != DType::kI32);
  if (dst_type == src_type) {
    const std::uint64_t size = dtype_bytes(dst_type);
    parallel_chunks(n, 1 << 18, [&](std::int64_t begin, std::int64_t end) {
      std::memcpy(static_cast<char*>(dst) + begin * size,
                  static_cast<const char*>(src) + begin * size, (end - begin) * size);
    });
    return;
  }
  parallel_chunks(n, 1 << 16, [&](std::int64_t begin, std::int64_t end) {
    if (src_type == DType::kF64) {
      const double* s = static_cast<const double*>(src);
      store_all(dst, dst_type, begin, end, [&](std::int64_t i) { return s[i]; });
    } else {
      store_all(dst, dst_type, begin, end, [&](std::int64_t i) {
        return static_cast<double>(load_as_float(src, src_type, i));
      });
    }
  });
}

}  // namespace strata::kernels
