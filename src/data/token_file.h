// Token files, memory-mapped read-only:
//   - llm.c: a header of 256 little-endian int32 (magic 20240520, version 1 = uint16 tokens or
//     2 = uint32 tokens, token count), then the tokens;
//   - nanoGPT: headerless uint16 tokens (np.memmap(..., dtype=np.uint16));
//   - text: any file, each byte one token (vocabulary 256).
// A file starting with the llm.c magic is read as llm.c, anything else as nanoGPT. Missing,
// empty, truncated or inconsistent files are errors naming the file and what is wrong, and so is
// a headerless file whose first bytes are printable text (text given as tokens: the error names
// tools/prepare_data.py, which tokenizes it).
#pragma once

#include <cstdint>
#include <string>

#include "common/mapped_file.h"
#include "common/status.h"

namespace strata::data {

enum class TokenFormat { kLlmcU16, kLlmcU32, kNanoGptU16, kTextBytes };
const char* to_string(TokenFormat format);

inline constexpr std::int32_t kLlmcMagic = 20240520;
inline constexpr std::uint64_t kLlmcHeaderBytes = 256 * 4;

class TokenFile {
 public:
  ~TokenFile() = default;
  TokenFile(TokenFile&& other) noexcept = default;
  TokenFile& operator=(TokenFile&&) = delete;
  TokenFile(const TokenFile&) = delete;

  // Opens a token file (text = false) or a text file (text = true).
  static Result<TokenFile> open(const std::string& path, bool text);

  const std::string& path() const { return path_; }
  TokenFormat format() const { return format_; }
  std::int64_t size() const { return tokens_; }
  // Token i (0 <= i < size()).
  std::int32_t at(std::int64_t i) const;
  // The largest token id a reader could find: 255 for text, 65535 or 2^32-1 otherwise.
  std::int64_t id_max() const;
  // Byte offset in the file of token i (for error messages).
  std::uint64_t byte_offset(std::int64_t i) const;
  // The token bytes, header excluded (what a mask file's checksum covers).
  const std::uint8_t* token_bytes() const { return tokens_begin_; }
  std::uint64_t token_bytes_size() const { return map_.size() - header_bytes_; }

 private:
  TokenFile() = default;
  std::string path_;
  TokenFormat format_ = TokenFormat::kNanoGptU16;
  MappedFile map_;
  const std::uint8_t* tokens_begin_ = nullptr;
  std::uint64_t header_bytes_ = 0;
  std::int64_t tokens_ = 0;
};

}  // namespace strata::data
