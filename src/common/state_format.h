// The optimizer state's format, defined once for every layer: the configuration reads it
// (strata.optimizer_state), the tier plan sizes the state by it, and the Adam kernel and the state
// codec (kernels/cpu/state_codec.h) encode and decode it. It lives here, in the base layer, because
// both the configuration and the kernels must name it and neither may include the other.
//
// A new format (say 4-bit moments) is a value here, in kMomentFormats and in to_string(); the
// configuration takes its name from there. The files that encode, decode and size it are listed in
// NOTES-state.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

// Element types of the arrays the kernels read and write, and of the stored master weights and
// gradients: fp32, bf16 and fp16.
enum class DType : std::uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Bytes per element: 4 for kF32, 2 for kBF16 and kF16.
constexpr std::size_t dtype_bytes(DType dtype) {
  return dtype == DType::kF32 ? 4 : 2;
}

// "fp32", "bf16", "fp16".
constexpr const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "fp32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "fp16";
  }
  return "unknown";
}

// Parses "fp32"/"f32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16"; nullopt otherwise.
constexpr std::optional<DType> parse_dtype(std::string_view text) {
  if (text == "fp32" || text == "f32" || text == "float32") return DType::kF32;
  if (text == "bf16" || text == "bfloat16") return DType::kBF16;
  if (text == "fp16" || text == "f16" || text == "float16") return DType::kF16;
  return std::nullopt;
}

// How Adam's moments are stored (the codes: kernels/cpu/state_codec.h).
enum class MomentFormat : std::uint8_t {
  kF32 = 0,
  kBF16 = 1,  // bf16, stochastically rounded after each update
  kQ8 = 2,    // 8 bits per element and an fp32 absmax per block
};

// Every format: the configuration offers these, by their to_string() names.
inline constexpr MomentFormat kMomentFormats[] = {MomentFormat::kF32, MomentFormat::kBF16,
                                                  MomentFormat::kQ8};

// "fp32", "bf16", "8bit": also the names strata.optimizer_state.moments takes.
constexpr const char* to_string(MomentFormat format) {
  switch (format) {
    case MomentFormat::kF32:
      return "fp32";
    case MomentFormat::kBF16:
      return "bf16";
    case MomentFormat::kQ8:
      return "8bit";
  }
  return "unknown";
}

// How the optimizer state is stored outside the device (strata.optimizer_state): fp32 throughout
// by default, so results are those of fp32 AdamW. Anything else is CPU Adam's (host or NVMe).
struct StateFormat {
  DType master = DType::kF32;                 // kF32, or kBF16 (stochastically rounded)
  MomentFormat moments = MomentFormat::kF32;  // Adam's two moments
  std::int64_t block = 2048;                  // kQ8: elements per absmax block (a power of two)
  DType grad = DType::kF32;                   // kF32, or kBF16 (the accumulated gradient)
  // Whether anything is stored in less than fp32.
  constexpr bool compressed() const {
    return master != DType::kF32 || moments != MomentFormat::kF32 || grad != DType::kF32;
  }
};

}  // namespace strata
