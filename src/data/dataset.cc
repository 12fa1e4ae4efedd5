// Token-file, text and synthetic datasets (see dataset.h).
#include "data/dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "data/markov.h"
#include "data/token_file.h"

namespace strata::data {
namespace {

// The most tokens one batch may hold: a caller's buffers of batch x seq_len tokens must be
// addressable, so a larger request is refused before anything is written.
constexpr std::int64_t kBatchTokensMax = std::int64_t{1} << 31;

Status check_batch(std::int64_t index, std::int64_t batch, std::int64_t seq_len) {
  if (batch < 0 || index < 0 || index > kBatchTokensMax ||
      (batch > 0 && seq_len > kBatchTokensMax / batch)) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("a batch of {} samples of {} tokens (batch index {}) is beyond the "
                              "{} tokens a batch may hold",
                              batch, seq_len, index, kBatchTokensMax),
                  "train_micro_batch_size_per_gpu");
  }
  return Status::ok();
}

// Non-overlapping windows of seq_len + 1 tokens over one file, from window `first` on.
struct WindowSet {
  const TokenFile* file = nullptr;
  std::int64_t first = 0;
  std::int64_t count = 0;
};

class FileDataset final : public Dataset {
 public:
  FileDataset(TokenFile train, std::optional<TokenFile> val, const config::DataConfig& config,
              std::int64_t vocab, std::uint64_t seed)
      : train_file_(std::move(train)),
        val_file_(std::move(val)),
        seq_len_(config.seq_len),
        shuffle_(config.shuffle),
        vocab_(vocab),
        seed_(seed) {}

  Status split(double val_fraction) {
    const std::int64_t windows = (train_file_.size() - 1) / seq_len_;
    if (val_file_) {
      const std::int64_t val_windows = (val_file_->size() - 1) / seq_len_;
      if (windows < 1) return too_short(train_file_, 1);
      if (val_windows < 1) return too_short(*val_file_, 1);
      train_ = {&train_file_, 0, windows};
      val_ = {&*val_file_, 0, val_windows};
    } else if (val_fraction > 0.0) {
      if (windows < 2) return too_short(train_file_, 2);
      std::int64_t held =
          static_cast<std::int64_t>(std::ceil(val_fraction * static_cast<double>(windows)));
      held = std::clamp<std::int64_t>(held, 1, windows - 1);
      train_ = {&train_file_, 0, windows - held};
      val_ = {&train_file_, windows - held, held};
    } else {
      if (windows < 1) return too_short(train_file_, 1);
      train_ = {&train_file_, 0, windows};
      val_ = train_;  // no held-out data: evaluate on training windows
    }
    order_.resize(static_cast<std::size_t>(train_.count));
    make_order(0);
    return Status::ok();
  }

  Status next_train(std::int64_t batch, std::int32_t* inputs, std::int32_t* targets) override {
    STRATA_TRY(check_batch(0, batch, seq_len_));
    for (std::int64_t b = 0; b < batch; ++b) {
      if (position_.sample >= train_.count) {
        ++position_.epoch;
        position_.sample = 0;
        make_order(position_.epoch);
      }
      const std::int64_t window = train_.first + order_[static_cast<std::size_t>(position_.sample)];
      STRATA_TRY(copy_window(train_, window, inputs + b * seq_len_, targets + b * seq_len_));
      ++position_.sample;
    }
    return Status::ok();
  }

  Status val_batch(std::int64_t index, std::int64_t batch, std::int32_t* inputs,
                   std::int32_t* targets) override {
    STRATA_TRY(check_batch(index, batch, seq_len_));
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t window = val_.first + (index * batch + b) % val_.count;
      STRATA_TRY(copy_window(val_, window, inputs + b * seq_len_, targets + b * seq_len_));
    }
    return Status::ok();
  }

  std::int64_t train_samples() const override { return train_.count; }
  DataPosition position() const override { return position_; }
  Status seek(const DataPosition& p) override {
    if (p.epoch < 0 || p.sample < 0 || p.sample > train_.count) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("data position (epoch {}, sample {}) does not exist: the training "
                                "split has {} samples",
                                p.epoch, p.sample, train_.count),
                    train_file_.path());
    }
    position_ = p;
    make_order(p.epoch);
    return Status::ok();
  }
  std::optional<double> entropy_floor() const override { return std::nullopt; }
  std::string describe() const override {
    return fmt::format("{} ({}, {} tokens): {} training and {} validation samples of {} tokens{}",
                       train_file_.path(), to_string(train_file_.format()), train_file_.size(),
                       train_.count, val_.count, seq_len_,
                       val_file_ ? ", validation from " + val_file_->path() : std::string());
  }

 private:
  Status too_short(const TokenFile& file, std::int64_t windows) const {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("{} tokens are too few: {} sample(s) of seq_len {} need at least {} "
                              "tokens",
                              file.size(), windows, seq_len_, windows * seq_len_ + 1),
                  file.path());
  }

  void make_order(std::int64_t epoch) {
    std::iota(order_.begin(), order_.end(), 0);
    if (!shuffle_) return;
    std::uint64_t state = seed_ ^ (0x5851f42d4c957f2dull * static_cast<std::uint64_t>(epoch + 1));
    splitmix64_next(state);
    for (std::int64_t i = train_.count - 1; i > 0; --i) {
      const auto j =
          static_cast<std::int64_t>(uniform_below(state, static_cast<std::uint64_t>(i + 1)));
      std::swap(order_[static_cast<std::size_t>(i)], order_[static_cast<std::size_t>(j)]);
    }
  }

  Status copy_window(const WindowSet& set, std::int64_t window, std::int32_t* inputs,
                     std::int32_t* targets) const {
    const TokenFile& file = *set.file;
    const std::int64_t start = window * seq_len_;
    for (std::int64_t t = 0; t <= seq_len_; ++t) {
      const std::int32_t token = file.at(start + t);
      if (token < 0 || token >= vocab_) {
        return Status(ErrorCode::kInvalidArgument,
                      fmt::format("token id {} at byte offset {} is outside the model's "
                                  "vocabulary [0, {})",
                                  token < 0 ? std::int64_t{-1} : std::int64_t{token},
                                  file.byte_offset(start + t), vocab_),
                      file.path());
      }
      if (t < seq_len_) inputs[t] = token;
      if (t > 0) targets[t - 1] = token;
    }
    return Status::ok();
  }

  TokenFile train_file_;
  std::optional<TokenFile> val_file_;
  std::int64_t seq_len_;
  bool shuffle_;
  std::int64_t vocab_;
  std::uint64_t seed_;
  WindowSet train_;
  WindowSet val_;
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

  Status next_train(std::int64_t batch, std::int32_t* inputs, std::int32_t* targets) override {
    STRATA_TRY(check_batch(0, batch, seq_len_));
    for (std::int64_t b = 0; b < batch; ++b) {
      emit(0, static_cast<std::uint64_t>(position_.sample), inputs + b * seq_len_,
           targets + b * seq_len_);
      ++position_.sample;
    }
    return Status::ok();
  }
  Status val_batch(std::int64_t index, std::int64_t batch, std::int32_t* inputs,
                   std::int32_t* targets) override {
    STRATA_TRY(check_batch(index, batch, seq_len_));
    for (std::int64_t b = 0; b < batch; ++b) {
      emit(1, static_cast<std::uint64_t>(index * batch + b), inputs + b * seq_len_,
           targets + b * seq_len_);
    }
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
  void emit(std::uint64_t stream, std::uint64_t index, std::int32_t* inputs,
            std::int32_t* targets) {
    chain_.sequence(stream, index, seq_len_ + 1, window_.data());
    std::copy(window_.begin(), window_.end() - 1, inputs);
    std::copy(window_.begin() + 1, window_.end(), targets);
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
  STRATA_ASSIGN_OR_RETURN(TokenFile train, TokenFile::open(data.path, text));
  std::optional<TokenFile> val;
  if (!data.val_path.empty()) {
    STRATA_ASSIGN_OR_RETURN(TokenFile v, TokenFile::open(data.val_path, text));
    val.emplace(std::move(v));
  }
  auto dataset =
      std::make_unique<FileDataset>(std::move(train), std::move(val), data, vocab_size, seed);
  STRATA_TRY(dataset->split(data.val_fraction));
  return std::unique_ptr<Dataset>(std::move(dataset));
}

}  // namespace strata::data
