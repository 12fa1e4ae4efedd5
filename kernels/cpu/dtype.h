// Element types of the arrays the CPU kernels read and write: fp32, bf16 and fp16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata::kernels {

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

}  // namespace strata::kernels
