// A timeline of what the trainer's engines did, written as a Chrome / Perfetto trace (JSON array
// of complete events, "ph": "X"), one lane (thread row) per engine: compute, host->device,
// device->host, NVMe read, NVMe write, Adam, and the time compute sat waiting for data.
// Events go into a fixed-capacity buffer (allocated once) under a mutex, so copy threads can add
// them too; flush() appends the buffer to the file and empties it (the trainer calls it at the
// end of every step). Events beyond the capacity between two flushes are dropped and counted.
// Open the file in https://ui.perfetto.dev or chrome://tracing.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata {

enum class TraceLane : std::uint8_t {
  kCompute = 0,
  kHostToDevice,
  kDeviceToHost,
  kNvmeRead,
  kNvmeWrite,
  kAdam,
  kComputeWait,
};
inline constexpr int kTraceLanes = 7;
const char* to_string(TraceLane lane);

class Trace {
 public:
  // Creates (truncates) `path` and writes the lane names. kIo naming the path when it cannot.
  static Result<std::unique_ptr<Trace>> open(const std::string& path,
                                             std::size_t events_max = 1 << 18);
  ~Trace();
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  // Microseconds since the trace was opened (steady clock).
  std::uint64_t now_us() const;
  // Records that `name` (a string literal: it is kept as a pointer) ran on `lane` from
  // `begin_us` to `end_us`, for `unit` (-1: none), moving `bytes` (0: none). Thread-safe.
  void add(TraceLane lane, const char* name, std::uint64_t begin_us, std::uint64_t end_us,
           int unit = -1, std::uint64_t bytes = 0);
  // Appends the buffered events to the file and empties the buffer.
  Status flush();
  // Flushes and ends the JSON array; later calls do nothing.
  Status close();
  // Events dropped because the buffer was full.
  std::uint64_t dropped() const;
  const std::string& path() const { return path_; }

 private:
  struct Event {
    const char* name;
    std::uint64_t begin_us;
    std::uint64_t end_us;
    std::uint64_t bytes;
    std::int32_t unit;
    TraceLane lane;
  };
  Trace() = default;

  std::string path_;
  std::FILE* file_ = nullptr;
  std::chrono::steady_clock::time_point start_;
  mutable std::mutex mu_;
  std::vector<Event> events_;  // capacity fixed at open
  std::size_t count_ = 0;
  std::uint64_t dropped_ = 0;
  bool first_ = true;
};

// Adds an event from construction to destruction (no-op when `trace` is null).
class TraceScope {
 public:
  TraceScope(Trace* trace, TraceLane lane, const char* name, int unit = -1, std::uint64_t bytes = 0)
      : trace_(trace),
        lane_(lane),
        name_(name),
        unit_(unit),
        bytes_(bytes),
        begin_us_(trace ? trace->now_us() : 0) {}
  ~TraceScope() {
    if (trace_ != nullptr) trace_->add(lane_, name_, begin_us_, trace_->now_us(), unit_, bytes_);
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Trace* trace_;
  TraceLane lane_;
  const char* name_;
  int unit_;
  std::uint64_t bytes_;
  std::uint64_t begin_us_;
};

}  // namespace strata
