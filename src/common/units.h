// Byte counts for humans and from humans: "1.5 GiB", "512MiB", "4k", "5e8".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata {

inline constexpr std::uint64_t kKiB = 1024;
inline constexpr std::uint64_t kMiB = 1024 * kKiB;
inline constexpr std::uint64_t kGiB = 1024 * kMiB;
inline constexpr std::uint64_t kTiB = 1024 * kGiB;

// "0 B", "4.0 KiB", "1.50 GiB": binary units, three significant digits.
std::string format_bytes(std::uint64_t bytes);

// Parses a byte count: a plain integer, a decimal/exponent number ("5e8"), or a number with a
// binary (KiB, MiB, GiB, TiB; K, M, G, T) or decimal (KB, MB, GB, TB) suffix. Case-insensitive,
// optional space and trailing "B". Returns nullopt when the text is not a non-negative byte count
// that fits in 64 bits.
std::optional<std::uint64_t> parse_bytes(std::string_view text);

// Parses a count of things (parameters, elements): a plain integer, a decimal/exponent number
// ("7e9", "1.3e9"), or a number with a decimal suffix: K (1e3), M (1e6), B or G (1e9), T (1e12),
// case-insensitive ("124M", "7B"). Returns nullopt when the text is not a whole non-negative count
// that fits in 64 bits.
std::optional<std::uint64_t> parse_count(std::string_view text);

// Rounds `value` up to a multiple of `alignment` (a power of two).
constexpr std::uint64_t align_up(std::uint64_t value, std::uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace strata
