// Token files (see token_file.h).
#include "data/token_file.h"

#include <fmt/format.h>

#include <algorithm>

namespace strata::data {
namespace {

std::int32_t read_i32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i)
    v = (v << 8) | p[i];
  return static_cast<std::int32_t>(v);
}

// Whether the first bytes of a file read as headerless uint16 tokens are printable UTF-8 text.
// Token ids in both bytes of a uint16 rarely all land in printable text (for ids below 256 the
// high byte is 0), so 32 or more such bytes in a row mean a text file given as tokens.
bool looks_like_text(const std::uint8_t* p, std::uint64_t size) {
  const std::uint64_t n = std::min<std::uint64_t>(size, 64 << 10);
  if (n < 32) return false;
  std::uint64_t i = 0;
  while (i < n) {
    const std::uint8_t c = p[i];
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) return false;
      ++i;
      continue;
    }
    const int extra = (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : -1;
    if (extra < 0 || (extra == 1 && c < 0xc2)) return false;
    for (int k = 1; k <= extra; ++k) {
      if (i + k >= n) return true;  // cut at the end of the sample
      if ((p[i + k] & 0xc0) != 0x80) return false;
    }
    i += static_cast<std::uint64_t>(extra) + 1;
  }
  return true;
}

}  // namespace

const char* to_string(TokenFormat format) {
  switch (format) {
    case TokenFormat::kLlmcU16:
      return "llm.c uint16";
    case TokenFormat::kLlmcU32:
      return "llm.c uint32";
    case TokenFormat::kNanoGptU16:
      return "nanoGPT uint16";
    case TokenFormat::kTextBytes:
      return "text bytes";
  }
  return "unknown";
}

Result<TokenFile> TokenFile::open(const std::string& path, bool text) {
  // A regular file only: a FIFO or a device would hang the open or never end.
  TokenFile file;
  STRATA_ASSIGN_OR_RETURN(file.map_,
                          MappedFile::open(path, "the data file", MappedFile::Access::kRandom));
  const std::uint64_t size = file.map_.size();
  if (size == 0) return Status(ErrorCode::kInvalidArgument, "the data file is empty", path);
  file.path_ = path;
  const std::uint8_t* bytes = file.map_.bytes();
  if (text) {
    file.format_ = TokenFormat::kTextBytes;
    file.tokens_begin_ = bytes;
    file.tokens_ = static_cast<std::int64_t>(size);
    return file;
  }
  if (size >= 4 && read_i32(bytes) == kLlmcMagic) {
    if (size < kLlmcHeaderBytes) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("starts with the llm.c magic but holds only {} bytes, less than "
                                "the {}-byte header",
                                size, kLlmcHeaderBytes),
                    path);
    }
    const std::int32_t version = read_i32(bytes + 4);
    const std::int32_t count = read_i32(bytes + 8);
    std::uint64_t width = 0;
    if (version == 1) {
      file.format_ = TokenFormat::kLlmcU16;
      width = 2;
    } else if (version == 2) {
      file.format_ = TokenFormat::kLlmcU32;
      width = 4;
    } else {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("llm.c header version {} is unknown; valid: 1 (uint16 tokens) or "
                                "2 (uint32 tokens)",
                                version),
                    path);
    }
    const std::uint64_t payload = size - kLlmcHeaderBytes;
    if (count < 0 || static_cast<std::uint64_t>(count) * width != payload) {
      return Status(
          ErrorCode::kCorrupt,
          fmt::format("the llm.c header says {} tokens ({} bytes) but {} bytes follow "
                      "the header",
                      count, static_cast<std::int64_t>(count) * static_cast<std::int64_t>(width),
                      payload),
          path);
    }
    file.header_bytes_ = kLlmcHeaderBytes;
    file.tokens_begin_ = bytes + kLlmcHeaderBytes;
    file.tokens_ = count;
    if (count == 0) {
      return Status(ErrorCode::kInvalidArgument, "the llm.c file holds no tokens", path);
    }
    return file;
  }
  if (looks_like_text(bytes, size)) {
    return Status(ErrorCode::kInvalidArgument,
                  "looks like text, not tokens (its first bytes are printable UTF-8, and it has "
                  "no llm.c header): tokenize it with the model's tokenizer, "
                  "tools/prepare_data.py --model MODEL_DIR --input FILE --output DIR, and use "
                  "DIR/train.bin; or read it as bytes (strata.data.source \"text\", strata eval "
                  "--format text)",
                  path);
  }
  if (size % 2 != 0) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("{} bytes is not a whole number of uint16 tokens (no llm.c header "
                              "either: the first int32 is not {})",
                              size, kLlmcMagic),
                  path);
  }
  file.format_ = TokenFormat::kNanoGptU16;
  file.tokens_begin_ = bytes;
  file.tokens_ = static_cast<std::int64_t>(size / 2);
  return file;
}

std::int32_t TokenFile::at(std::int64_t i) const {
  STRATA_ASSERT(i >= 0 && i < tokens_);
  const std::uint8_t* p = tokens_begin_;
  switch (format_) {
    case TokenFormat::kTextBytes:
      return p[i];
    case TokenFormat::kLlmcU16:
    case TokenFormat::kNanoGptU16:
      return static_cast<std::int32_t>(p[2 * i] | (p[2 * i + 1] << 8));
    case TokenFormat::kLlmcU32: {
      const std::uint32_t v = static_cast<std::uint32_t>(p[4 * i]) |
                              (static_cast<std::uint32_t>(p[4 * i + 1]) << 8) |
                              (static_cast<std::uint32_t>(p[4 * i + 2]) << 16) |
                              (static_cast<std::uint32_t>(p[4 * i + 3]) << 24);
      // Ids beyond int32 cannot be valid for any model; report them as -1 (out of range).
      return v > 0x7fffffffu ? -1 : static_cast<std::int32_t>(v);
    }
  }
  return -1;
}

std::int64_t TokenFile::id_max() const {
  switch (format_) {
    case TokenFormat::kTextBytes:
      return 255;
    case TokenFormat::kLlmcU32:
      return 0xffffffffll;
    default:
      return 65535;
  }
}

std::uint64_t TokenFile::byte_offset(std::int64_t i) const {
  const std::uint64_t width = format_ == TokenFormat::kTextBytes ? 1
                              : format_ == TokenFormat::kLlmcU32 ? 4
                                                                 : 2;
  return header_bytes_ + static_cast<std::uint64_t>(i) * width;
}

}  // namespace strata::data
