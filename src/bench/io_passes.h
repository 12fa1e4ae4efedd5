// The NVMe throughput benchmark behind `strata bench io`: sequential write and read passes over
// one file through the IoEngine (O_DIRECT, so the page cache is out of the way), per-request
// latency percentiles, the NVMe -> pinned staging -> destination copy path the trainer uses,
// and a sweep over block size x queue depth x threads that picks the best `aio` settings.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/engine.h"

namespace strata::bench {

struct IoBenchConfig {
  std::string file;        // benchmark file; created if missing
  bool keep_file = false;  // keep a file this run created
  std::uint64_t file_size_bytes = 1ull << 30;
  std::uint64_t pass_bytes = 0;  // bytes per pass; 0 = the whole file
  bool read = true;
  bool write = true;
  bool copy_path = true;     // also measure NVMe -> staging -> destination
  std::uint32_t repeat = 1;  // passes of each kind; the one with the median GB/s is reported
  std::uint64_t memory_max_bytes = 1ull << 30;  // staging buffers at most (threads*qd*block)
  io::EngineOptions engine;
  // Called now and then with the pass's name and the fraction done (for a progress bar).
  std::function<void(const char* pass, double fraction)> progress;
};

struct LatencyPercentiles {
  double p50_us = 0, p90_us = 0, p99_us = 0, p999_us = 0, max_us = 0;
};

struct PassResult {
  bool ran = false;
  std::uint64_t bytes = 0;
  double seconds = 0;
  double gbps = 0;  // 1e9 bytes per second
  LatencyPercentiles latency;
};

struct IoBenchResult {
  std::string engine;  // "uring" or "posix"
  bool direct = false;
  std::uint32_t alignment_bytes = 0;
  bool registered_buffers = false;
  PassResult write;
  PassResult read;
  PassResult copy;  // read into staging, then memcpy to a destination buffer
};

// Runs the passes `config` asks for (write first: a read pass needs data on the file). When the
// file is new, it is filled before a read-only run, and removed afterwards unless keep_file.
Result<IoBenchResult> run_io_bench(const IoBenchConfig& config);

struct SweepPoint {
  std::uint64_t block_size_bytes = 0;
  std::uint32_t queue_depth = 0;
  std::uint32_t threads = 0;
  bool skipped = false;
  std::string skip_reason;
  IoBenchResult result;
};

struct SweepGrid {
  std::vector<std::uint64_t> block_sizes_bytes = {128 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20};
  std::vector<std::uint32_t> queue_depths = {1, 4, 8, 32, 128};
  std::vector<std::uint32_t> threads = {1, 2, 4, 8};
};

// Runs `base` at every point of `grid` (points whose staging memory exceeds
// base.memory_max_bytes are skipped, with the reason).
Result<std::vector<SweepPoint>> run_io_sweep(const IoBenchConfig& base, const SweepGrid& grid);

// The point with the best harmonic mean of read and write GB/s; among points within 3% of it,
// the one with the least staging memory. nullptr when none ran.
const SweepPoint* best_point(const std::vector<SweepPoint>& points);

// A ready `aio` config section for `point`, as JSON text.
std::string aio_section_json(const SweepPoint& point);

}  // namespace strata::bench
