// Mask files beside token files (see token_mask.h).
#include "data/token_mask.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <filesystem>

namespace strata::data {
namespace {

std::uint32_t read_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

std::uint64_t read_u64(const std::uint8_t* p) {
  return static_cast<std::uint64_t>(read_u32(p)) |
         (static_cast<std::uint64_t>(read_u32(p + 4)) << 32);
}

}  // namespace

std::string mask_path_for(const std::string& token_path) {
  constexpr std::string_view suffix = ".bin";
  if (token_path.size() > suffix.size() &&
      token_path.compare(token_path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return token_path.substr(0, token_path.size() - suffix.size()) + ".mask.bin";
  }
  return token_path + ".mask.bin";
}

std::uint64_t token_checksum(const TokenFile& tokens) {
  return XXH3_64bits(tokens.token_bytes(), tokens.token_bytes_size());
}

Result<std::optional<MaskFile>> MaskFile::open_beside(const TokenFile& tokens) {
  const std::string path = mask_path_for(tokens.path());
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::optional<MaskFile>();
  STRATA_ASSIGN_OR_RETURN(MaskFile mask, open(path, tokens));
  return std::optional<MaskFile>(std::move(mask));
}

Result<MaskFile> MaskFile::open(const std::string& path, const TokenFile& tokens) {
  MaskFile file;
  STRATA_ASSIGN_OR_RETURN(file.map_, MappedFile::open(path, "the mask file"));
  const std::uint64_t size = file.map_.size();
  if (size < kMaskHeaderBytes) {
    return Status(
        ErrorCode::kCorrupt,
        fmt::format("{} bytes is shorter than the {}-byte mask header", size, kMaskHeaderBytes),
        path);
  }
  file.path_ = path;
  const std::uint8_t* bytes = file.map_.bytes();
  if (static_cast<std::int32_t>(read_u32(bytes)) != kMaskMagic) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("not a mask file: the first int32 is {}, not the magic {} "
                              "(tools/prepare_data.py writes mask files)",
                              static_cast<std::int32_t>(read_u32(bytes)), kMaskMagic),
                  path);
  }
  const auto version = static_cast<std::int32_t>(read_u32(bytes + 4));
  if (version != kMaskVersion) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("mask file version {} is unknown; valid: {}", version, kMaskVersion),
                  path);
  }
  const auto count = static_cast<std::int64_t>(read_u64(bytes + 8));
  if (count < 0 || static_cast<std::uint64_t>(count) != size - kMaskHeaderBytes) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("the header says {} tokens but {} bytes of flags follow it", count,
                              size - kMaskHeaderBytes),
                  path);
  }
  if (count != tokens.size()) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("made for a token file of {} tokens, but {} holds {}: the pair does "
                              "not belong together (prepare the data again)",
                              count, tokens.path(), tokens.size()),
                  path);
  }
  const std::uint64_t recorded = read_u64(bytes + 16);
  const std::uint64_t actual = token_checksum(tokens);
  if (recorded != actual) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("made for other tokens: its checksum of the token file is {:016x} "
                              "but {} hashes to {:016x} (the token file changed since the mask "
                              "was written; prepare the data again)",
                              recorded, tokens.path(), actual),
                  path);
  }
  file.flags_ = bytes + kMaskHeaderBytes;
  file.tokens_ = count;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::uint8_t f = file.flags_[i];
    if ((f & ~(kCountsInLoss | kStartsDocument)) != 0) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("flags byte {:#04x} of token {} (byte offset {}) sets unknown "
                                "bits; valid: bit 0 (counts in the loss), bit 1 (starts a "
                                "document)",
                                f, i, kMaskHeaderBytes + static_cast<std::uint64_t>(i)),
                    path);
    }
    file.counted_ += f & kCountsInLoss;
    file.documents_ += (f & kStartsDocument) >> 1;
  }
  return file;
}

}  // namespace strata::data
