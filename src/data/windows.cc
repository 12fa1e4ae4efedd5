// Stream and packed windows over a token file (see windows.h).
#include "data/windows.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <utility>

namespace strata::data {

std::vector<std::int64_t> document_starts(const MaskFile& mask) {
  std::vector<std::int64_t> starts{0};
  for (std::int64_t i = 1; i < mask.size(); ++i) {
    if (mask.at(i) & kStartsDocument) starts.push_back(i);
  }
  return starts;
}

TokenWindows TokenWindows::stream(const TokenFile& file, const MaskFile* mask, std::int64_t seq_len,
                                  std::int64_t first, std::int64_t count) {
  TokenWindows w;
  w.file_ = &file;
  w.mask_ = mask;
  w.seq_len_ = seq_len;
  w.first_ = first;
  w.count_ = count;
  w.stats_.tokens = count * seq_len;
  return w;
}

TokenWindows TokenWindows::packed(const TokenFile& file, const MaskFile& mask, std::int64_t seq_len,
                                  const std::vector<std::int64_t>& starts, std::size_t doc_begin,
                                  std::size_t doc_end) {
  TokenWindows w;
  w.file_ = &file;
  w.mask_ = &mask;
  w.seq_len_ = seq_len;
  w.packed_ = true;
  const std::int64_t capacity = seq_len + 1;
  // Items: whole documents, or pieces of capacity tokens that overlap by one token, so that every
  // token of a long document is still predicted exactly once.
  std::vector<std::pair<std::int64_t, std::int64_t>> items;  // (offset, length)
  for (std::size_t d = doc_begin; d < doc_end; ++d) {
    const std::int64_t begin = starts[d];
    const std::int64_t end = d + 1 < starts.size() ? starts[d + 1] : file.size();
    const std::int64_t length = end - begin;
    ++w.stats_.documents;
    if (length > capacity) ++w.stats_.split_documents;
    for (std::int64_t at = begin; at + 1 < end; at += seq_len) {
      const std::int64_t piece = std::min(capacity, end - at);
      bool any = false;
      for (std::int64_t i = at + 1; i < at + piece && !any; ++i)
        any = (mask.at(i) & kCountsInLoss) != 0;
      if (!any) {
        ++w.stats_.pieces_skipped;
        continue;
      }
      items.emplace_back(at, piece);
      w.stats_.tokens += piece;
    }
  }
  // Best-fit decreasing: the longest item first, each into the fullest window it fits.
  std::vector<std::size_t> order(items.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return items[a].second > items[b].second; });
  std::vector<std::int64_t> window_of(items.size());
  std::set<std::pair<std::int64_t, std::int64_t>> open;  // (room left, window)
  std::int64_t windows = 0;
  for (std::size_t k : order) {
    const std::int64_t length = items[k].second;
    auto fit = open.lower_bound({length, -1});
    std::int64_t window = 0, room = 0;
    if (fit != open.end()) {
      window = fit->second;
      room = fit->first - length;
      open.erase(fit);
    } else {
      window = windows++;
      room = capacity - length;
    }
    window_of[k] = window;
    if (room >= 2) open.insert({room, window});  // an item needs two tokens to predict one
  }
  // Each window's items in file order, and the windows in the order of their first token.
  std::vector<std::vector<std::size_t>> members(static_cast<std::size_t>(windows));
  for (std::size_t k = 0; k < items.size(); ++k)
    members[static_cast<std::size_t>(window_of[k])].push_back(k);  // k ascends: file order
  std::sort(members.begin(), members.end(), [&](const auto& a, const auto& b) {
    return items[a.front()].first < items[b.front()].first;
  });
  w.window_segments_.push_back(0);
  for (const auto& m : members) {
    for (std::size_t k : m) {
      w.segment_offset_.push_back(items[k].first);
      w.segment_length_.push_back(items[k].second);
    }
    w.window_segments_.push_back(static_cast<std::int64_t>(w.segment_offset_.size()));
  }
  w.count_ = windows;
  return w;
}

double TokenWindows::fill_ratio() const {
  if (!packed_ || count_ == 0) return 1.0;
  return static_cast<double>(stats_.tokens) / static_cast<double>(count_ * (seq_len_ + 1));
}

Status TokenWindows::checked(std::int64_t i, std::int64_t vocab, std::int32_t* token) const {
  *token = file_->at(i);
  if (*token < 0 || *token >= vocab) {
    // A headerless file is read as uint16 ids: one of uint32 ids, or of text, reads as garbage.
    const char* hint = file_->format() == TokenFormat::kNanoGptU16
                           ? " (a file without an llm.c header is read as uint16 ids; "
                             "tools/prepare_data.py writes token files with the model's "
                             "tokenizer, uint32 for large vocabularies)"
                           : "";
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("token id {} at byte offset {} is outside the model's vocabulary "
                              "[0, {}){}",
                              *token < 0 ? std::int64_t{-1} : std::int64_t{*token},
                              file_->byte_offset(i), vocab, hint),
                  file_->path());
  }
  return Status::ok();
}

Status TokenWindows::fill(std::int64_t window, std::int64_t vocab, std::int32_t* inputs,
                          std::int32_t* targets, std::int32_t* positions) const {
  STRATA_ASSERT(window >= 0 && window < count_);
  const std::int64_t t_max = seq_len_;
  if (!packed_) {
    const std::int64_t start = (first_ + window) * t_max;
    std::int32_t token = 0;
    for (std::int64_t t = 0; t <= t_max; ++t) {
      STRATA_TRY(checked(start + t, vocab, &token));
      if (t < t_max) {
        inputs[t] = token;
        positions[t] = static_cast<std::int32_t>(t);
      }
      if (t > 0) targets[t - 1] = counts(start + t) ? token : -1;
    }
    return Status::ok();
  }
  std::int64_t t = 0;  // the window's token index; inputs are t < t_max
  for (std::int64_t s = window_segments_[static_cast<std::size_t>(window)];
       s < window_segments_[static_cast<std::size_t>(window) + 1]; ++s) {
    const std::int64_t offset = segment_offset_[static_cast<std::size_t>(s)];
    const std::int64_t length = segment_length_[static_cast<std::size_t>(s)];
    std::int32_t token = 0;
    for (std::int64_t j = 0; j < length; ++j, ++t) {
      STRATA_TRY(checked(offset + j, vocab, &token));
      if (j > 0 && t - 1 < t_max) targets[t - 1] = counts(offset + j) ? token : -1;
      if (t < t_max) {
        inputs[t] = token;
        positions[t] = static_cast<std::int32_t>(j);
        targets[t] = -1;  // the document's last token predicts nothing (overwritten otherwise)
      }
    }
  }
  for (std::int64_t pad = 0; t < t_max; ++t, ++pad) {
    inputs[t] = 0;
    targets[t] = -1;
    positions[t] = static_cast<std::int32_t>(pad);
  }
  return Status::ok();
}

}  // namespace strata::data
