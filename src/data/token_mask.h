// Per-token flags beside a token file: which targets count in the loss (instruction tuning masks
// the prompt) and where documents start (packing restarts positions there). The file sits beside
// the token file it describes, "<stem>.mask.bin" for "<stem>.bin" (tools/prepare_data.py writes
// both), memory-mapped read-only:
//   header: 256 little-endian int32 — magic 0x4b53414d ("MASK" in file order), version 1, the
//           token file's token count (int64: words 2 and 3), XXH3-64 of the token file's token
//           bytes, header excluded (uint64: words 4 and 5); the other words are zero;
//   then one byte per token: bit 0 (kCountsInLoss) = the token counts when it is a target,
//           bit 1 (kStartsDocument) = a document starts at this token; the other bits are zero.
// A pair whose count or checksum disagrees is refused (the mask was made for another token file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/mapped_file.h"
#include "common/status.h"
#include "data/token_file.h"

namespace strata::data {

inline constexpr std::int32_t kMaskMagic = 0x4b53414d;
inline constexpr std::int32_t kMaskVersion = 1;
inline constexpr std::uint64_t kMaskHeaderBytes = 256 * 4;
inline constexpr std::uint8_t kCountsInLoss = 1;
inline constexpr std::uint8_t kStartsDocument = 2;

// "<dir>/<stem>.mask.bin" for "<dir>/<stem>.bin", else "<path>.mask.bin".
std::string mask_path_for(const std::string& token_path);

// XXH3-64 of a token file's token bytes (header excluded): what a mask file records.
std::uint64_t token_checksum(const TokenFile& tokens);

class MaskFile {
 public:
  ~MaskFile() = default;
  MaskFile(MaskFile&& other) noexcept = default;
  MaskFile& operator=(MaskFile&&) = delete;
  MaskFile(const MaskFile&) = delete;

  // Opens the mask file at `path` for `tokens`; errors name the file and what disagrees.
  static Result<MaskFile> open(const std::string& path, const TokenFile& tokens);
  // The mask beside `tokens` (mask_path_for), or nothing when there is none.
  static Result<std::optional<MaskFile>> open_beside(const TokenFile& tokens);

  const std::string& path() const { return path_; }
  std::int64_t size() const { return tokens_; }
  // Token i's flags (0 <= i < size()).
  std::uint8_t at(std::int64_t i) const {
    STRATA_ASSERT(i >= 0 && i < tokens_);
    return flags_[i];
  }
  // Tokens whose kCountsInLoss bit is set, and documents (kStartsDocument bits).
  std::int64_t counted() const { return counted_; }
  std::int64_t documents() const { return documents_; }

 private:
  MaskFile() = default;
  std::string path_;
  MappedFile map_;
  const std::uint8_t* flags_ = nullptr;
  std::int64_t tokens_ = 0;
  std::int64_t counted_ = 0;
  std::int64_t documents_ = 0;
};

}  // namespace strata::data
