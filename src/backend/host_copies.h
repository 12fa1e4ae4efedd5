// Copies between host vectors and a backend's device memory for the backends' start-up checks
// (attention_check.cc, gemm_check.cc, norm_check.cc, apart_check.cc): through the compute stream,
// from and to ordinary (pageable) host memory, so each copy has completed when the call returns
// (Backend::copy_async); and the checks' random inputs and bitwise comparison.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/backend.h"
#include "common/status.h"
#include "kernels/cpu/cast.h"

namespace strata::backend {

// A device buffer (256-byte aligned, at least one element) holding a copy of `host`.
template <typename T>
Result<Buffer> device_copy(Backend& backend, const std::vector<T>& host, const char* purpose) {
  const std::uint64_t bytes = std::max<std::uint64_t>(host.size() * sizeof(T), sizeof(T));
  STRATA_ASSIGN_OR_RETURN(Buffer buffer, backend.allocate_device(bytes, purpose, 256));
  if (!host.empty()) {
    STRATA_TRY(backend.copy_async(StreamKind::kCompute, buffer.data(), host.data(),
                                  host.size() * sizeof(T)));
  }
  return buffer;
}

// The first host->size() elements of `buffer` into *host.
template <typename T>
Status copy_to_host(Backend& backend, std::vector<T>* host, const Buffer& buffer) {
  return backend.copy_async(StreamKind::kCompute, host->data(), buffer.data(),
                            host->size() * sizeof(T));
}

// `count` values offset + scale * N(0, 1) from `rng`: a check's inputs.
inline std::vector<float> normal_values(std::mt19937_64& rng, std::int64_t count, float scale,
                                        float offset) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(std::max<std::int64_t>(count, 0)));
  for (float& x : v)
    x = offset + scale * normal(rng);
  return v;
}

// `values` rounded to the 16-bit `type` (bf16 or fp16) and widened back: what a parameter widened
// from its 16-bit copy holds (a check's bias, which a 16-bit epilogue reads in D's type).
inline std::vector<float> sixteen_bit_values(std::vector<float> values, DType type) {
  const auto n = static_cast<std::int64_t>(values.size());
  std::vector<std::uint16_t> rounded(values.size());
  kernels::cast_array(rounded.data(), type, values.data(), DType::kF32, n);
  kernels::cast_array(values.data(), DType::kF32, rounded.data(), type, n);
  return values;
}

// The first of n floats whose bits differ between two device buffers (index -1: none), with
// both values.
struct BitsDiffer {
  std::int64_t index = -1;
  float want = 0.0f, got = 0.0f;
};
inline Result<BitsDiffer> first_bits_differ(Backend& backend, const Buffer& want, const Buffer& got,
                                            std::int64_t n) {
  std::vector<float> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
  STRATA_TRY(copy_to_host(backend, &a, want));
  STRATA_TRY(copy_to_host(backend, &b, got));
  BitsDiffer d;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      d.index = static_cast<std::int64_t>(i);
      d.want = a[i];
      d.got = b[i];
      break;
    }
  }
  return d;
}

// OK where the first n floats of two device buffers have the same bits; else an error naming
// `where`, `what`, the first element whose bits differ and both values.
inline Status same_bits(Backend& backend, const Buffer& want, const Buffer& got, std::int64_t n,
                        const std::string& where, const std::string& what) {
  STRATA_ASSIGN_OR_RETURN(const BitsDiffer d, first_bits_differ(backend, want, got, n));
  if (d.index < 0) return Status::ok();
  return Status(ErrorCode::kInternal,
                fmt::format("{}, {}[{}] is {}, the verified path gives {} (the bits must match)",
                            where, what, d.index, d.got, d.want));
}

// A bf16 or fp16 value's bits as an integer that orders like the value: the distance between two
// of them in units in the last place.
inline std::int32_t ordered_16(std::uint16_t h) {
  return (h & 0x8000) != 0 ? -static_cast<std::int32_t>(h & 0x7fff) : static_cast<std::int32_t>(h);
}

// The first of the 16-bit values `got` (of `type`, bf16 or fp16) more than 1 unit in the last
// place from the fp32 `want` rounded to that type (index -1: none), with both values.
struct BeyondOneUnit {
  std::int64_t index = -1;
  float got = 0.0f, want = 0.0f;
};
inline BeyondOneUnit first_beyond_one_unit(const std::vector<std::uint16_t>& got,
                                           const std::vector<float>& want, DType type) {
  std::vector<std::uint16_t> rounded(want.size());
  kernels::cast_array(rounded.data(), type, want.data(), DType::kF32,
                      static_cast<std::int64_t>(want.size()));
  BeyondOneUnit d;
  for (std::size_t i = 0; i < got.size() && i < rounded.size(); ++i) {
    if (std::abs(ordered_16(got[i]) - ordered_16(rounded[i])) > 1) {
      d.index = static_cast<std::int64_t>(i);
      kernels::cast_array(&d.got, DType::kF32, &got[i], type, 1);
      d.want = want[i];
      break;
    }
  }
  return d;
}

// The n 16-bit values of `type` in `narrow`, from a product rounded once, each within 1 unit in the
// last place of the verified fp32 product in `verified` rounded: OK, with `verified` then holding
// the 16-bit values widened (what the verified readers are run on); else an error naming `where`,
// `what` (the 16-bit values) and the first element beyond.
inline Status within_one_unit_then_widen(Backend& backend, const Buffer& verified,
                                         const Buffer& narrow, std::int64_t n, DType type,
                                         const std::string& where, const std::string& what) {
  std::vector<float> wide(static_cast<std::size_t>(n));
  std::vector<std::uint16_t> got16(static_cast<std::size_t>(n));
  STRATA_TRY(copy_to_host(backend, &wide, verified));
  STRATA_TRY(copy_to_host(backend, &got16, narrow));
  const BeyondOneUnit apart = first_beyond_one_unit(got16, wide, type);
  if (apart.index >= 0) {
    return Status(ErrorCode::kInternal,
                  fmt::format("{}: {}'s element {} is {}, the verified fp32 product {} (allowed: 1 "
                              "unit in the last place of its rounding)",
                              where, what, apart.index, apart.got, apart.want));
  }
  kernels::cast_array(wide.data(), DType::kF32, got16.data(), type, n);
  return backend.copy_async(StreamKind::kCompute, verified.data(), wide.data(),
                            wide.size() * sizeof(float));
}

// The first of n 16-bit elements whose bits differ between two device buffers (index -1: none).
struct Bits16Differ {
  std::int64_t index = -1;
  std::uint16_t want = 0, got = 0;
};
inline Result<Bits16Differ> first_16_bits_differ(Backend& backend, const Buffer& want,
                                                 const Buffer& got, std::int64_t n) {
  std::vector<std::uint16_t> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
  STRATA_TRY(copy_to_host(backend, &a, want));
  STRATA_TRY(copy_to_host(backend, &b, got));
  Bits16Differ d;
  const auto at = std::mismatch(a.begin(), a.end(), b.begin());
  if (at.first != a.end()) {
    d.index = at.first - a.begin();
    d.want = *at.first;
    d.got = *at.second;
  }
  return d;
}

}  // namespace strata::backend
