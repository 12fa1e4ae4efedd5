// Chrome / Perfetto trace writer (see trace.h).
#include "common/trace.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace strata {

const char* to_string(TraceLane lane) {
  switch (lane) {
    case TraceLane::kCompute:
      return "compute";
    case TraceLane::kHostToDevice:
      return "host->device";
    case TraceLane::kDeviceToHost:
      return "device->host";
    case TraceLane::kNvmeRead:
      return "nvme read";
    case TraceLane::kNvmeWrite:
      return "nvme write";
    case TraceLane::kAdam:
      return "adam";
    case TraceLane::kComputeWait:
      return "compute waiting for data";
  }
  return "unknown";
}

Result<std::unique_ptr<Trace>> Trace::open(const std::string& path, std::size_t events_max) {
  std::unique_ptr<Trace> t(new Trace());
  t->path_ = path;
  t->file_ = std::fopen(path.c_str(), "wb");
  if (t->file_ == nullptr) {
    return Status(ErrorCode::kIo,
                  fmt::format("cannot create the trace file: {}", std::strerror(errno)), path);
  }
  t->events_.resize(std::max<std::size_t>(events_max, 16));
  t->start_ = std::chrono::steady_clock::now();
  std::fputs("[\n", t->file_);
  for (int lane = 0; lane < kTraceLanes; ++lane) {
    std::fprintf(t->file_,
                 "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
                 "\"args\":{\"name\":\"%s\"}},\n"
                 "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
                 "\"args\":{\"sort_index\":%d}}",
                 lane == 0 ? "" : ",\n", lane, to_string(static_cast<TraceLane>(lane)), lane, lane);
  }
  std::fputs(",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"strata\"}}",
             t->file_);
  t->first_ = false;
  return t;
}

Trace::~Trace() {
  (void)close();
}

std::uint64_t Trace::now_us() const {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                        std::chrono::steady_clock::now() - start_)
                                        .count());
}

void Trace::add(TraceLane lane, const char* name, std::uint64_t begin_us, std::uint64_t end_us,
                int unit, std::uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (count_ == events_.size()) {
    ++dropped_;
    return;
  }
  events_[count_++] =
      Event{name, begin_us, end_us < begin_us ? begin_us : end_us, bytes, unit, lane};
}

Status Trace::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return Status::ok();
  for (std::size_t i = 0; i < count_; ++i) {
    const Event& e = events_[i];
    std::fprintf(file_,
                 ",\n{\"name\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%llu,"
                 "\"dur\":%llu,\"args\":{\"unit\":%d,\"bytes\":%llu}}",
                 e.name, static_cast<int>(e.lane), static_cast<unsigned long long>(e.begin_us),
                 static_cast<unsigned long long>(e.end_us - e.begin_us), e.unit,
                 static_cast<unsigned long long>(e.bytes));
  }
  count_ = 0;
  if (std::fflush(file_) != 0 || std::ferror(file_)) {
    return Status(ErrorCode::kIo, fmt::format("write failed: {}", std::strerror(errno)), path_);
  }
  return Status::ok();
}

Status Trace::close() {
  STRATA_TRY(flush());
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return Status::ok();
  std::fputs("\n]\n", file_);
  const bool ok = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok) return Status(ErrorCode::kIo, "cannot close the trace file", path_);
  return Status::ok();
}

std::uint64_t Trace::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

}  // namespace strata
