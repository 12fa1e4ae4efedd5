// Test helper: a token file in llm.c's format (1024-byte header, uint16 tokens), the format
// strata.data.source "tokens" reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::testing {

inline std::string llmc_file(const std::vector<std::int32_t>& tokens) {
  std::string bytes(1024, '\0');
  auto put = [&](int at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i)
      bytes[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put(0, 20240520);
  put(4, 1);
  put(8, static_cast<std::uint32_t>(tokens.size()));
  for (std::int32_t t : tokens) {
    bytes += static_cast<char>(t & 0xff);
    bytes += static_cast<char>((t >> 8) & 0xff);
  }
  return bytes;
}

}  // namespace strata::testing
