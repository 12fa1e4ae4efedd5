// The rank-order fold (reduce.h). Works in blocks of kBlock elements through a small accumulator
// on the stack, so `out` may alias a source (each block reads every source before it writes), and
// the inner loops are plain element-wise loops the compiler vectorises.
#include "comm/reduce.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/float16.h"

namespace strata::comm {
namespace {

constexpr std::uint64_t kBlock = 1024;

// Reading an element into the accumulator type and writing it back.
template <DataType T>
struct Element;
template <>
struct Element<DataType::kF32> {
  using Stored = float;
  using Acc = float;
  static Acc load(Stored v) { return v; }
  static Stored store(Acc v) { return v; }
};
template <>
struct Element<DataType::kBF16> {
  using Stored = std::uint16_t;
  using Acc = float;
  static Acc load(Stored v) { return kernels::bf16_to_float(v); }
  static Stored store(Acc v) { return kernels::float_to_bf16(v); }
};
template <>
struct Element<DataType::kF16> {
  using Stored = std::uint16_t;
  using Acc = float;
  static Acc load(Stored v) { return kernels::fp16_to_float(v); }
  static Stored store(Acc v) { return kernels::float_to_fp16(v); }
};
template <>
struct Element<DataType::kF64> {
  using Stored = double;
  using Acc = double;
  static Acc load(Stored v) { return v; }
  static Stored store(Acc v) { return v; }
};
template <>
struct Element<DataType::kI32> {
  using Stored = std::int32_t;
  using Acc = std::uint64_t;  // unsigned: wrapping sums are defined
  static Acc load(Stored v) { return static_cast<Acc>(static_cast<std::int64_t>(v)); }
  static Stored store(Acc v) { return static_cast<Stored>(static_cast<std::uint32_t>(v)); }
};
template <>
struct Element<DataType::kI64> {
  using Stored = std::int64_t;
  using Acc = std::uint64_t;
  static Acc load(Stored v) { return static_cast<Acc>(v); }
  static Stored store(Acc v) { return static_cast<Stored>(v); }
};
template <>
struct Element<DataType::kU8> {
  using Stored = std::uint8_t;
  using Acc = std::uint64_t;
  static Acc load(Stored v) { return v; }
  static Stored store(Acc v) { return static_cast<Stored>(v); }
};

// The maximum of two accumulator values, NaN winning (for floating types).
template <typename A>
inline A max_of(A a, A b) {
  if constexpr (std::numeric_limits<A>::has_quiet_NaN) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return b > a ? b : a;
}

// Signed comparison for the integer types whose accumulator is unsigned.
template <DataType T>
inline typename Element<T>::Acc max_acc(typename Element<T>::Acc a, typename Element<T>::Acc b) {
  if constexpr (T == DataType::kI32 || T == DataType::kI64) {
    return static_cast<std::int64_t>(b) > static_cast<std::int64_t>(a) ? b : a;
  } else {
    return max_of(a, b);
  }
}

template <DataType T>
void fold_typed(void* out, const void* const* sources, int source_count, std::uint64_t count,
                ReduceOp op) {
  using E = Element<T>;
  using Stored = typename E::Stored;
  using Acc = typename E::Acc;
  Acc acc[kBlock];
  auto* dst = static_cast<Stored*>(out);
  for (std::uint64_t begin = 0; begin < count; begin += kBlock) {
    const std::uint64_t n = count - begin < kBlock ? count - begin : kBlock;
    const auto* first = static_cast<const Stored*>(sources[0]) + begin;
    for (std::uint64_t i = 0; i < n; ++i)
      acc[i] = E::load(first[i]);
    for (int k = 1; k < source_count; ++k) {
      const auto* src = static_cast<const Stored*>(sources[k]) + begin;
      if (op == ReduceOp::kSum) {
        for (std::uint64_t i = 0; i < n; ++i)
          acc[i] = acc[i] + E::load(src[i]);
      } else {
        for (std::uint64_t i = 0; i < n; ++i)
          acc[i] = max_acc<T>(acc[i], E::load(src[i]));
      }
    }
    for (std::uint64_t i = 0; i < n; ++i)
      dst[begin + i] = E::store(acc[i]);
  }
}

}  // namespace

void fold_in_order(void* out, const void* const* sources, int source_count, std::uint64_t count,
                   DataType type, ReduceOp op) {
  STRATA_ASSERT(source_count >= 1);
  switch (type) {
    case DataType::kF32:
      return fold_typed<DataType::kF32>(out, sources, source_count, count, op);
    case DataType::kBF16:
      return fold_typed<DataType::kBF16>(out, sources, source_count, count, op);
    case DataType::kF16:
      return fold_typed<DataType::kF16>(out, sources, source_count, count, op);
    case DataType::kF64:
      return fold_typed<DataType::kF64>(out, sources, source_count, count, op);
    case DataType::kI32:
      return fold_typed<DataType::kI32>(out, sources, source_count, count, op);
    case DataType::kI64:
      return fold_typed<DataType::kI64>(out, sources, source_count, count, op);
    case DataType::kU8:
      return fold_typed<DataType::kU8>(out, sources, source_count, count, op);
  }
}

}  // namespace strata::comm
