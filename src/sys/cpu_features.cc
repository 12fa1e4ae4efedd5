#include "sys/cpu_features.h"

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/log.h"

namespace strata::sys {
namespace {

std::uint64_t read_xcr0() {
  std::uint32_t eax = 0;
  std::uint32_t edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<std::uint64_t>(edx) << 32) | eax;
}

CpuFeatures probe() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf == 0) return f;

  __cpuid(0, eax, ebx, ecx, edx);
  char vendor[13] = {};
  std::memcpy(vendor + 0, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  f.vendor = vendor;

  __cpuid(1, eax, ebx, ecx, edx);
  f.sse42 = (ecx >> 20) & 1;
  const bool osxsave = (ecx >> 27) & 1;
  const bool cpu_avx = (ecx >> 28) & 1;
  f.fma = (ecx >> 12) & 1;
  f.f16c = (ecx >> 29) & 1;

  // The OS must save YMM (bits 1-2) for AVX and opmask/ZMM (bits 5-7) for AVX-512.
  std::uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  const bool os_ymm = (xcr0 & 0x6) == 0x6;
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;
  f.avx = cpu_avx && os_ymm;
  f.fma = f.fma && f.avx;
  f.f16c = f.f16c && f.avx;

  if (max_leaf >= 7) {
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    f.avx2 = f.avx && ((ebx >> 5) & 1);
    f.avx512f = os_zmm && ((ebx >> 16) & 1);
    f.avx512dq = f.avx512f && ((ebx >> 17) & 1);
    f.avx512bw = f.avx512f && ((ebx >> 30) & 1);
    f.avx512vl = f.avx512f && ((ebx >> 31) & 1);
    f.avx512_fp16 = f.avx512f && ((edx >> 23) & 1);
    f.amx_bf16 = os_amx && ((edx >> 22) & 1);
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    f.avx512_bf16 = f.avx512f && ((eax >> 5) & 1);
  }

  if (__get_cpuid_max(0x80000000, nullptr) >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      __cpuid(0x80000002 + i, eax, ebx, ecx, edx);
      std::memcpy(brand + 16 * i + 0, &eax, 4);
      std::memcpy(brand + 16 * i + 4, &ebx, 4);
      std::memcpy(brand + 16 * i + 8, &ecx, 4);
      std::memcpy(brand + 16 * i + 12, &edx, 4);
    }
    f.brand = brand;
    while (!f.brand.empty() && f.brand.back() == ' ')
      f.brand.pop_back();
    std::size_t first = f.brand.find_first_not_of(' ');
    f.brand = first == std::string::npos ? std::string() : f.brand.substr(first);
  }
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = probe();
  return features;
}

const char* to_string(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

SimdLevel best_simd_level() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) return SimdLevel::kAvx512;
  if (f.avx2 && f.fma && f.f16c) return SimdLevel::kAvx2;
  return SimdLevel::kScalar;
}

bool simd_level_supported(SimdLevel level) {
  return static_cast<int>(level) <= static_cast<int>(best_simd_level());
}

std::optional<SimdLevel> parse_simd_level(std::string_view text) {
  if (text == "scalar") return SimdLevel::kScalar;
  if (text == "avx2") return SimdLevel::kAvx2;
  if (text == "avx512") return SimdLevel::kAvx512;
  return std::nullopt;
}

SimdLevel default_simd_level() {
  static const SimdLevel level = [] {
    const char* env = std::getenv("STRATA_SIMD");
    if (env == nullptr || *env == '\0' || std::string_view(env) == "auto") return best_simd_level();
    std::optional<SimdLevel> wanted = parse_simd_level(env);
    if (!wanted) {
      STRATA_LOG_WARN("STRATA_SIMD='{}' is not one of auto, scalar, avx2, avx512; using {}", env,
                      to_string(best_simd_level()));
      return best_simd_level();
    }
    if (!simd_level_supported(*wanted)) {
      STRATA_LOG_WARN("STRATA_SIMD={} is not supported by this CPU; using {}", env,
                      to_string(best_simd_level()));
      return best_simd_level();
    }
    return *wanted;
  }();
  return level;
}

}  // namespace strata::sys
