// Token-file, text and synthetic datasets (see dataset.h).
#include "data/dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "data/markov.h"
#include "data/token_file.h"
#include "data/token_mask.h"
#include "data/windows.h"

namespace strata::data {
namespace {

// One token file with its mask file, if any.
struct Source {
  explicit Source(TokenFile f) : file(std::move(f)) {}
  TokenFile file;
  std::optional<MaskFile> mask;
  const MaskFile* mask_ptr() const { return mask ? &*mask : nullptr; }
};

class FileDataset final : public Dataset {
 public:
  FileDataset(std::unique_ptr<Source> train, std::unique_ptr<Source> val,
              const config::DataConfig& config, std::int64_t vocab, std::uint64_t seed)
      : train_file_(std::move(train)),
        val_file_(std::move(val)),
        seq_len_(config.seq_len),
        shuffle_(config.shuffle),
        packing_(config.packing),
        vocab_(vocab),
        seed_(seed) {}

  Status split(double val_fraction) {
    val_is_train_ = !val_file_ && val_fraction <= 0.0;
    if (packing_) {
      STRATA_TRY(split_packed(val_fraction));
    } else {
      STRATA_TRY(split_stream(val_fraction));
    }
    order_.resize(static_cast<std::size_t>(train_.count()));
    make_order(0);
    return Status::ok();
  }

  Status next_train(Batch& batch) override {
    for (std::int64_t b = 0; b < batch.rows; ++b) {
      if (position_.sample >= train_.count()) {
        ++position_.epoch;
        position_.sample = 0;
        make_order(position_.epoch);
      }
      STRATA_TRY(fill_row(train_, order_[static_cast<std::size_t>(position_.sample)], batch, b));
      ++position_.sample;
    }
    finish(batch);
    return Status::ok();
  }

  Status val_batch(std::int64_t index, Batch& batch) override {
    for (std::int64_t b = 0; b < batch.rows; ++b)
      STRATA_TRY(fill_row(val_, (index * batch.rows + b) % val_.count(), batch, b));
    finish(batch);
    return Status::ok();
  }

  std::int64_t train_samples() const override { return train_.count(); }
  DataPosition position() const override { return position_; }
  Status seek(const DataPosition& p) override {
    if (p.epoch < 0 || p.sample < 0 || p.sample > train_.count()) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("data position (epoch {}, sample {}) does not exist: the training "
                                "split has {} samples",
                                p.epoch, p.sample, train_.count()),
                    train_file_->file.path());
    }
    position_ = p;
    make_order(p.epoch);
    return Status::ok();
  }
  std::optional<double> entropy_floor() const override { return std::nullopt; }
  std::string describe() const override {
    auto file_line = [](const Source& s) {
      std::string line = fmt::format("{} ({}, {} tokens", s.file.path(), to_string(s.file.format()),
                                     s.file.size());
      if (s.mask) {
        line += fmt::format("; mask {}: {:.1f}% of tokens count in the loss, {} documents",
                            s.mask->path(),
                            100.0 * static_cast<double>(s.mask->counted()) /
                                static_cast<double>(std::max<std::int64_t>(s.mask->size(), 1)),
                            s.mask->documents());
      }
      return line + ")";
    };
    std::string packed;
    if (packing_) {
      packed = fmt::format(", packed: {} documents, windows {:.1f}% full",
                           train_starts_.size() + val_starts_.size(), 100.0 * train_.fill_ratio());
    }
    return fmt::format("{}: {} training and {} validation samples of {} tokens{}{}",
                       file_line(*train_file_), train_.count(), val_.count(), seq_len_, packed,
                       val_file_ ? ", validation from " + file_line(*val_file_) : std::string());
  }
  std::vector<std::string> warnings() const override {
    std::vector<std::string> lines;
    for (const TokenWindows* w : {&train_, &val_}) {
      if (w->stats().split_documents > 0) {
        lines.push_back(fmt::format(
            "{} {} document(s) are longer than seq_len + 1 = {} tokens and were cut into pieces "
            "of {} tokens; a piece after the first is trained without the tokens before it "
            "(raise strata.data.seq_len, or drop long examples: tools/prepare_data.py "
            "--max-tokens)",
            w == &train_ ? "training:" : "validation:", w->stats().split_documents, seq_len_ + 1,
            seq_len_ + 1));
      }
      if (val_is_train_) break;
    }
    return lines;
  }

 private:
  Status split_stream(double val_fraction) {
    const TokenFile& file = train_file_->file;
    const MaskFile* mask = train_file_->mask_ptr();
    const std::int64_t windows = (file.size() - 1) / seq_len_;
    if (val_file_) {
      const std::int64_t val_windows = (val_file_->file.size() - 1) / seq_len_;
      if (windows < 1) return too_short(file, 1);
      if (val_windows < 1) return too_short(val_file_->file, 1);
      train_ = TokenWindows::stream(file, mask, seq_len_, 0, windows);
      val_ = TokenWindows::stream(val_file_->file, val_file_->mask_ptr(), seq_len_, 0, val_windows);
    } else if (val_fraction > 0.0) {
      if (windows < 2) return too_short(file, 2);
      std::int64_t held =
          static_cast<std::int64_t>(std::ceil(val_fraction * static_cast<double>(windows)));
      held = std::clamp<std::int64_t>(held, 1, windows - 1);
      train_ = TokenWindows::stream(file, mask, seq_len_, 0, windows - held);
      val_ = TokenWindows::stream(file, mask, seq_len_, windows - held, held);
    } else {
      if (windows < 1) return too_short(file, 1);
      train_ = TokenWindows::stream(file, mask, seq_len_, 0, windows);
      val_ = train_;  // no held-out data: evaluate on training windows
    }
    return Status::ok();
  }

  Status split_packed(double val_fraction) {
    const MaskFile& mask = *train_file_->mask;
    train_starts_ = document_starts(mask);
    const std::size_t docs = train_starts_.size();
    std::size_t train_docs = docs;
    if (val_file_) {
      val_starts_ = document_starts(*val_file_->mask);
      val_ = TokenWindows::packed(val_file_->file, *val_file_->mask, seq_len_, val_starts_, 0,
                                  val_starts_.size());
    } else if (val_fraction > 0.0) {
      if (docs < 2) return too_few_documents(train_file_->file, docs, 2);
      auto held = static_cast<std::size_t>(std::ceil(val_fraction * static_cast<double>(docs)));
      held = std::clamp<std::size_t>(held, 1, docs - 1);
      train_docs = docs - held;
      val_ =
          TokenWindows::packed(train_file_->file, mask, seq_len_, train_starts_, train_docs, docs);
    }
    train_ = TokenWindows::packed(train_file_->file, mask, seq_len_, train_starts_, 0, train_docs);
    if (!val_file_ && val_fraction <= 0.0) val_ = train_;
    if (train_.count() < 1) return no_windows(train_file_->file, train_);
    if (val_.count() < 1) {
      return no_windows(val_file_ ? val_file_->file : train_file_->file, val_);
    }
    return Status::ok();
  }

  Status too_short(const TokenFile& file, std::int64_t windows) const {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("{} tokens are too few: {} sample(s) of seq_len {} need at least {} "
                              "tokens",
                              file.size(), windows, seq_len_, windows * seq_len_ + 1),
                  file.path());
  }
  Status too_few_documents(const TokenFile& file, std::size_t docs, std::size_t need) const {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("{} document(s) are too few to hold some out for validation with "
                              "packing; need at least {} (or set strata.data.val_fraction 0, or "
                              "give strata.data.val_path)",
                              docs, need),
                  file.path());
  }
  Status no_windows(const TokenFile& file, const TokenWindows& w) const {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("packing found no document with a target that counts ({} "
                              "document(s), {} without any token the mask counts)",
                              w.stats().documents, w.stats().pieces_skipped),
                  file.path());
  }

  Status fill_row(const TokenWindows& windows, std::int64_t window, Batch& batch,
                  std::int64_t row) const {
    const std::int64_t at = row * seq_len_;
    return windows.fill(window, vocab_, batch.inputs.data() + at, batch.targets.data() + at,
                        batch.positions.data() + at);
  }

  void finish(Batch& batch) const {
    batch.packed = packing_;
    batch.count_targets();
  }

  void make_order(std::int64_t epoch) {
    std::iota(order_.begin(), order_.end(), 0);
    if (!shuffle_) return;
    std::uint64_t state = seed_ ^ (0x5851f42d4c957f2dull * static_cast<std::uint64_t>(epoch + 1));
    splitmix64_next(state);
    for (std::int64_t i = train_.count() - 1; i > 0; --i) {
      const auto j =
          static_cast<std::int64_t>(uniform_below(state, static_cast<std::uint64_t>(i + 1)));
      std::swap(order_[static_cast<std::size_t>(i)], order_[static_cast<std::size_t>(j)]);
    }
  }

  std::unique_ptr<Source> train_file_;  // heap: the windows point into it
  std::unique_ptr<Source> val_file_;
  std::int64_t seq_len_;
  bool shuffle_;
  bool packing_;
  bool val_is_train_ = false;  // no held-out data: validation uses the training windows
  std::int64_t vocab_;
  std::uint64_t seed_;
  std::vector<std::int64_t> train_starts_, val_starts_;
  TokenWindows train_;
  TokenWindows val_;
  std::vector<std::int64_t> order_;
  DataPosition position_;
};

class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(std::int64_t vocab, std::int64_t branching, std::int64_t seq_len,
                   std::uint64_t seed)
      : chain_(vocab, branching, seed),
        seq_len_(seq_len),
        window_(static_cast<std::size_t>(seq_len + 1)) {}

  Status next_train(Batch& batch) override {
    for (std::int64_t b = 0; b < batch.rows; ++b) {
      emit(0, static_cast<std::uint64_t>(position_.sample), batch, b);
      ++position_.sample;
    }
    batch.packed = false;
    batch.counted = batch.size();
    return Status::ok();
  }
  Status val_batch(std::int64_t index, Batch& batch) override {
    for (std::int64_t b = 0; b < batch.rows; ++b)
      emit(1, static_cast<std::uint64_t>(index * batch.rows + b), batch, b);
    batch.packed = false;
    batch.counted = batch.size();
    return Status::ok();
  }
  std::int64_t train_samples() const override { return 0; }
  DataPosition position() const override { return position_; }
  Status seek(const DataPosition& p) override {
    if (p.epoch != 0 || p.sample < 0) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("data position (epoch {}, sample {}) does not exist for the "
                                "synthetic source (one endless epoch)",
                                p.epoch, p.sample));
    }
    position_ = p;
    return Status::ok();
  }
  std::optional<double> entropy_floor() const override { return chain_.entropy_nats(); }
  std::string describe() const override {
    return fmt::format(
        "synthetic Markov chain: vocabulary {}, {} successors per state, entropy "
        "floor ln({}) = {:.6f} nats per token, samples of {} tokens",
        chain_.vocab(), chain_.branching(), chain_.branching(), chain_.entropy_nats(), seq_len_);
  }

 private:
  void emit(std::uint64_t stream, std::uint64_t index, Batch& batch, std::int64_t row) {
    chain_.sequence(stream, index, seq_len_ + 1, window_.data());
    const std::size_t at = static_cast<std::size_t>(row * seq_len_);
    std::copy(window_.begin(), window_.end() - 1, batch.inputs.begin() + at);
    std::copy(window_.begin() + 1, window_.end(), batch.targets.begin() + at);
    for (std::int64_t t = 0; t < seq_len_; ++t)
      batch.positions[at + static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t);
  }

  MarkovChain chain_;
  std::int64_t seq_len_;
  std::vector<std::int32_t> window_;
  DataPosition position_;
};

}  // namespace

Result<std::unique_ptr<Dataset>> make_dataset(const config::DataConfig& data,
                                              std::int64_t vocab_size, std::uint64_t seed) {
  if (data.source == config::DataSource::kSynthetic) {
    if (data.synthetic_vocab_size > vocab_size) {
      return Status(ErrorCode::kConfig,
                    fmt::format("synthetic_vocab_size {} exceeds the model's vocab_size {}",
                                data.synthetic_vocab_size, vocab_size),
                    "strata.data.synthetic_vocab_size");
    }
    if (data.synthetic_branching > data.synthetic_vocab_size) {
      return Status(ErrorCode::kConfig,
                    fmt::format("synthetic_branching {} exceeds synthetic_vocab_size {}; valid: "
                                "1 to {}",
                                data.synthetic_branching, data.synthetic_vocab_size,
                                data.synthetic_vocab_size),
                    "strata.data.synthetic_branching");
    }
    return std::unique_ptr<Dataset>(new SyntheticDataset(
        data.synthetic_vocab_size, data.synthetic_branching, data.seq_len, seed));
  }
  const bool text = data.source == config::DataSource::kText;
  if (text && vocab_size < 256) {
    return Status(ErrorCode::kConfig,
                  fmt::format("text is read as bytes (256 token values) but the model's "
                              "vocab_size is {}; valid: at least 256",
                              vocab_size),
                  "strata.model.vocab_size");
  }
  if (data.path.empty()) {
    return Status(ErrorCode::kConfig, "no data file given", "strata.data.path");
  }
  auto open_source = [&](const std::string& path) -> Result<std::unique_ptr<Source>> {
    STRATA_ASSIGN_OR_RETURN(TokenFile file, TokenFile::open(path, text));
    auto source = std::make_unique<Source>(std::move(file));
    if (!text) {
      STRATA_ASSIGN_OR_RETURN(std::optional<MaskFile> mask, MaskFile::open_beside(source->file));
      if (mask) source->mask.emplace(std::move(*mask));
    }
    if (data.packing && !source->mask) {
      return Status(ErrorCode::kConfig,
                    fmt::format("packing needs the documents' boundaries, which a mask file "
                                "beside the token file records, and {} has none: prepare the "
                                "data with tools/prepare_data.py (it writes both), or set "
                                "strata.data.packing false",
                                mask_path_for(path)),
                    path);
    }
    return source;
  };
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Source> train, open_source(data.path));
  std::unique_ptr<Source> val;
  if (!data.val_path.empty()) {
    STRATA_ASSIGN_OR_RETURN(val, open_source(data.val_path));
  }
  auto dataset =
      std::make_unique<FileDataset>(std::move(train), std::move(val), data, vocab_size, seed);
  STRATA_TRY(dataset->split(data.val_fraction));
  return std::unique_ptr<Dataset>(std::move(dataset));
}

}  // namespace strata::data
