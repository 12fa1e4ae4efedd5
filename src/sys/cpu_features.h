// What the CPU can run: instruction-set extensions from CPUID, checked against the operating
// system's XSAVE support (a CPU with AVX-512 under an OS that does not save ZMM state cannot use
// it).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace strata::sys {

struct CpuFeatures {
  bool sse42 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;
  bool avx512_fp16 = false;
  bool amx_bf16 = false;
  std::string vendor;
  std::string brand;
};

// Probed once (thread-safe) and cached.
const CpuFeatures& cpu_features();

// The widest SIMD level the kernels can use here.
enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

const char* to_string(SimdLevel level);

// AVX-512 needs F+BW+VL+DQ; AVX2 needs AVX2+FMA+F16C.
SimdLevel best_simd_level();

// Whether this CPU (and OS) can run the kernels' code for `level`.
bool simd_level_supported(SimdLevel level);

// Parses "scalar", "avx2", "avx512"; nullopt for anything else ("auto" included).
std::optional<SimdLevel> parse_simd_level(std::string_view text);

// The level the kernels use when the caller does not name one: STRATA_SIMD from the environment
// (scalar, avx2, avx512 or auto) when it is set and supported here, else best_simd_level(). An
// unusable STRATA_SIMD value is reported once on stderr and ignored.
SimdLevel default_simd_level();

}  // namespace strata::sys
