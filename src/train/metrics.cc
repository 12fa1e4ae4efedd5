// Metrics lines and the progress bar (see metrics.h).
#include "train/metrics.h"

#include <fmt/format.h>

#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

#include "common/bounded_read.h"
#include "common/durable_file.h"

namespace strata::train {

MetricsLog::~MetricsLog() {
  if (file_ != nullptr) std::fclose(file_);
}

namespace {

// The metrics of a run resumed from `resumed_step`: keeps every complete line up to that step
// (and lines without a step, such as an earlier summary); rewrites the file (atomically) only
// when something must go.
Status repair(const std::string& path, std::int64_t resumed_step) {
  Result<RegularFile> file = open_regular_file(path, "the metrics file");
  if (file.status().code() == ErrorCode::kNotFound) return Status::ok();  // created on append
  STRATA_TRY(file.status());
  std::FILE* in = ::fdopen(file->fd, "rb");
  if (in == nullptr) {
    ::close(file->fd);
    return Status(ErrorCode::kIo, fmt::format("cannot read: {}", std::strerror(errno)), path);
  }
  std::string kept;
  bool dropped = false;
  char* line = nullptr;
  std::size_t capacity = 0;
  ssize_t n = 0;
  JsonLimits limits;
  limits.bytes_max = 1 << 20;
  limits.depth_max = 8;
  while ((n = ::getline(&line, &capacity, in)) > 0) {
    const std::string_view text(line, static_cast<std::size_t>(n));
    bool keep = text.back() == '\n';  // a torn last line has no newline
    if (keep) {
      Result<Json::Value> v = parse_json_bounded(text, path, limits);
      keep = !(v.is_ok() && v->isObject() && (*v)["step"].isInt64() &&
               (*v)["step"].asInt64() > resumed_step);
    }
    if (keep) {
      kept.append(text);
    } else {
      dropped = true;
    }
  }
  std::free(line);
  const bool failed = std::ferror(in) != 0;
  std::fclose(in);
  if (failed) return Status(ErrorCode::kIo, "cannot read the metrics to append to them", path);
  return dropped ? write_file_atomically(path, kept) : Status::ok();
}

}  // namespace

Status MetricsLog::open(const std::string& path, std::int64_t resumed_step) {
  const bool append = resumed_step >= 0;
  if (append) STRATA_TRY(repair(path, resumed_step));
  file_ = std::fopen(path.c_str(), append ? "ab" : "wb");
  if (file_ == nullptr) {
    return Status(ErrorCode::kIo, fmt::format("cannot open for writing: {}", std::strerror(errno)),
                  path);
  }
  path_ = path;
  return Status::ok();
}

std::string MetricsLog::to_line(const Json::Value& value) {
  Json::StreamWriterBuilder builder;
  builder["indentation"] = "";
  builder["precision"] = 17;
  return Json::writeString(builder, value);
}

Status MetricsLog::write(const Json::Value& line) {
  if (file_ == nullptr) return Status::ok();
  const std::string text = to_line(line) + "\n";
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0) {
    return Status(ErrorCode::kIo, fmt::format("write failed: {}", std::strerror(errno)), path_);
  }
  return Status::ok();
}

Progress::Progress(std::int64_t total_steps, bool tty, std::int64_t print_every)
    : total_(total_steps), tty_(tty), print_every_(std::max<std::int64_t>(print_every, 1)) {}

void Progress::step(std::int64_t step, double loss, double lr, double tokens_per_s, bool skipped,
                    const std::string& extra) {
  const std::string tail =
      fmt::format("loss {:.4f}  lr {:.3e}  {:.0f} tok/s{}{}{}", loss, lr, tokens_per_s,
                  skipped ? "  (skipped: overflow)" : "", extra.empty() ? "" : "  ", extra);
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * step / total_) : 0;
    std::fprintf(stderr, "\r\033[Kstep %lld/%lld [%s%s] %s", static_cast<long long>(step),
                 static_cast<long long>(total_), std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), tail.c_str());
    std::fflush(stderr);
    drawn_ = true;
  } else if (step % print_every_ == 0 || step == total_) {
    std::fprintf(stderr, "strata: step %lld/%lld  %s\n", static_cast<long long>(step),
                 static_cast<long long>(total_), tail.c_str());
  }
}

void Progress::note(const std::string& message) {
  if (tty_ && drawn_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "strata: %s\n", message.c_str());
}

void Progress::finish() {
  if (tty_ && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace strata::train
