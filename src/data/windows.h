// Samples of seq_len input positions cut from one token file (with its mask file, when there is
// one), in one of two ways:
//   - stream: non-overlapping windows of seq_len + 1 tokens (stride seq_len) over the whole
//     stream, documents and all; the inputs are the first seq_len tokens, the targets the last
//     seq_len, and a target whose token the mask does not count is -1. Positions are 0..seq_len-1.
//   - packed: whole documents (or, for one longer than seq_len + 1 tokens, pieces of it) placed
//     into windows of seq_len + 1 tokens by best-fit decreasing; positions restart at 0 at each
//     document, the last token of a document predicts nothing (its target is -1), and the rest
//     of a window is padding (input 0, target -1, positions counting from 0 again).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "data/token_file.h"
#include "data/token_mask.h"

namespace strata::data {

// Token offsets where documents start (the mask's kStartsDocument bits; token 0 always starts
// one).
std::vector<std::int64_t> document_starts(const MaskFile& mask);

struct PackingStats {
  std::int64_t documents = 0;        // documents packed (whole or in pieces)
  std::int64_t split_documents = 0;  // longer than seq_len + 1 tokens: cut into pieces
  std::int64_t pieces_skipped = 0;   // pieces (or documents) without a target that counts
  std::int64_t tokens = 0;           // tokens placed into windows
};

class TokenWindows {
 public:
  TokenWindows() = default;
  // Windows first .. first + count - 1 of the stream (window w starts at token w * seq_len).
  static TokenWindows stream(const TokenFile& file, const MaskFile* mask, std::int64_t seq_len,
                             std::int64_t first, std::int64_t count);
  // Packs documents doc_begin .. doc_end - 1 of `starts` (document d spans starts[d] up to the
  // next start, the last one up to the end of the file).
  static TokenWindows packed(const TokenFile& file, const MaskFile& mask, std::int64_t seq_len,
                             const std::vector<std::int64_t>& starts, std::size_t doc_begin,
                             std::size_t doc_end);

  std::int64_t count() const { return count_; }
  bool is_packed() const { return packed_; }
  const PackingStats& stats() const { return stats_; }
  // Fills one row (seq_len entries each) from window `window` (0 <= window < count()). Token ids
  // outside [0, vocab) are kInvalidArgument naming the file and byte offset.
  Status fill(std::int64_t window, std::int64_t vocab, std::int32_t* inputs, std::int32_t* targets,
              std::int32_t* positions) const;
  // Share of the windows' input positions that hold a document's token (packed; 1 for stream).
  double fill_ratio() const;

 private:
  Status checked(std::int64_t i, std::int64_t vocab, std::int32_t* token) const;
  bool counts(std::int64_t i) const { return mask_ == nullptr || (mask_->at(i) & kCountsInLoss); }

  const TokenFile* file_ = nullptr;
  const MaskFile* mask_ = nullptr;
  std::int64_t seq_len_ = 0;
  std::int64_t count_ = 0;
  bool packed_ = false;
  std::int64_t first_ = 0;                     // stream: the first window
  std::vector<std::int64_t> segment_offset_;   // packed: each segment's first token
  std::vector<std::int64_t> segment_length_;   // packed: its tokens
  std::vector<std::int64_t> window_segments_;  // packed: window w's segments, CSR (count + 1)
  PackingStats stats_;
};

}  // namespace strata::data
