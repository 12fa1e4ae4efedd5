#include "bench/io_passes.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>

#include "common/log.h"
#include "common/units.h"

namespace strata::bench {
namespace {

using io::EngineOptions;
using io::FileId;
using io::FileInfo;
using io::FileSpec;
using io::IoCompletion;
using io::IoEngine;
using io::IoHandle;
using io::IoRequest;
using io::Op;

constexpr std::uint64_t kRegisterChunkBytes = 1ull << 30;  // io_uring's limit per buffer

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Anonymous memory on 2 MiB boundaries, asked to be backed by huge pages (physically contiguous
// runs: a 1 MiB block is one DMA segment instead of 256 pages, which drivers with a segment
// limit would otherwise split), faulted in up front, unmapped on destruction.
class Mapping {
 public:
  ~Mapping() {
    if (raw_ != nullptr) ::munmap(raw_, raw_bytes_);
  }
  Status map(std::uint64_t bytes) {
    constexpr std::uint64_t kHuge = 2ull << 20;
    raw_bytes_ = align_up(bytes, kHuge) + kHuge;
    void* p =
        ::mmap(nullptr, raw_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      raw_ = nullptr;
      return Status(ErrorCode::kOutOfMemory,
                    fmt::format("cannot map {} of buffers", format_bytes(bytes)));
    }
    raw_ = p;
    data_ = reinterpret_cast<std::uint8_t*>(align_up(reinterpret_cast<std::uintptr_t>(p), kHuge));
    bytes_ = bytes;
    (void)::madvise(data_, align_up(bytes, kHuge), MADV_HUGEPAGE);  // a hint; fine if refused
    std::memset(data_, 0, bytes_);                                  // fault it in now
    return Status::ok();
  }
  std::uint8_t* data() const { return data_; }
  std::uint64_t bytes() const { return bytes_; }

 private:
  void* raw_ = nullptr;
  std::uint64_t raw_bytes_ = 0;
  std::uint8_t* data_ = nullptr;
  std::uint64_t bytes_ = 0;
};

LatencyPercentiles percentiles(std::vector<std::uint64_t>* latencies_ns) {
  LatencyPercentiles p;
  if (latencies_ns->empty()) return p;
  std::sort(latencies_ns->begin(), latencies_ns->end());
  auto at = [&](double q) {
    const auto i = static_cast<std::size_t>(
        std::min<double>(static_cast<double>(latencies_ns->size() - 1),
                         std::ceil(q * static_cast<double>(latencies_ns->size())) - 1));
    return static_cast<double>((*latencies_ns)[i]) / 1000.0;
  };
  p.p50_us = at(0.50);
  p.p90_us = at(0.90);
  p.p99_us = at(0.99);
  p.p999_us = at(0.999);
  p.max_us = static_cast<double>(latencies_ns->back()) / 1000.0;
  return p;
}

struct Bench {
  const IoBenchConfig& config;
  IoEngine& engine;
  FileId file;
  std::uint64_t pass_bytes;
  Mapping staging;             // threads * queue_depth blocks
  Mapping destination;         // the copy path's target
  std::vector<IoHandle> ring;  // the request in flight per staging slot, or invalid
  std::vector<std::uint64_t> latencies_ns;
  // Scratch for refilling, sized once (threads * queue_depth).
  std::vector<std::uint32_t> freed;
  std::vector<std::uint32_t> batch_slots;
  std::vector<IoRequest> batch_requests;
  std::vector<IoHandle> batch_handles;

  // One sequential pass; `copy` memcpys each completed block to the destination.
  Result<PassResult> pass(Op op, bool copy, const char* name) {
    const std::uint64_t block = config.engine.block_size_bytes;
    const std::uint64_t requests = pass_bytes / block;
    const auto slots = static_cast<std::uint32_t>(ring.size());
    latencies_ns.clear();
    latencies_ns.reserve(requests);
    std::uint64_t next = 0;
    std::uint64_t done = 0;
    std::uint64_t copied = 0;
    auto last_progress = Clock::now();
    const auto start = Clock::now();
    // Refills the slots in freed[0, n) in one batch, as far as requests remain.
    auto refill = [&](std::uint32_t n) -> Status {
      std::uint32_t batch = 0;
      for (std::uint32_t i = 0; i < n && next < requests; ++i, ++next) {
        const std::uint32_t slot = freed[i];
        batch_slots[batch] = slot;
        batch_requests[batch++] = {op, file, next * block, block,
                                   staging.data() + std::uint64_t{slot} * block};
      }
      STRATA_TRY(engine.submit_batch(batch_requests.data(), batch, batch_handles.data()));
      for (std::uint32_t i = 0; i < batch; ++i)
        ring[batch_slots[i]] = batch_handles[i];
      return Status::ok();
    };
    auto drain = [&] {
      for (IoHandle& h : ring) {
        if (h.valid()) (void)engine.wait(h);
        h = IoHandle{};
      }
    };
    // Ends the completed request of `slot`.
    auto complete = [&](std::uint32_t slot, const IoCompletion& c) -> Status {
      ring[slot] = IoHandle{};
      STRATA_TRY(c.status);
      latencies_ns.push_back(c.latency_ns);
      ++done;
      if (copy) {
        const std::uint64_t at = copied % (destination.bytes() / block) * block;
        std::memcpy(destination.data() + at, staging.data() + std::uint64_t{slot} * block, block);
        ++copied;
      }
      return Status::ok();
    };
    for (std::uint32_t s = 0; s < slots; ++s)
      freed[s] = s;
    STRATA_TRY(refill(slots));
    // Like fio: wait for any request, take every other one that is done too, and refill all
    // their slots in one submission.
    while (done < requests) {
      std::uint32_t n = 0;
      std::uint32_t s = 0;
      IoCompletion c = engine.wait_any(ring.data(), slots, &s);
      Status ended = complete(s, c);
      freed[n++] = s;
      for (std::uint32_t i = 0; ended.is_ok() && i < slots; ++i) {
        if (!ring[i].valid()) continue;
        std::optional<IoCompletion> other = engine.poll(ring[i]);
        if (!other.has_value()) continue;
        ended = complete(i, *other);
        freed[n++] = i;
      }
      if (ended.is_ok()) ended = refill(n);
      if (!ended.is_ok()) {
        drain();  // so the file can be closed (and removed) on the way out
        return ended;
      }
      if (config.progress && seconds_since(last_progress) > 0.1) {
        config.progress(name, static_cast<double>(done) / static_cast<double>(requests));
        last_progress = Clock::now();
      }
    }
    PassResult r;
    r.ran = true;
    r.seconds = seconds_since(start);
    r.bytes = requests * block;
    r.gbps = static_cast<double>(r.bytes) / r.seconds / 1e9;
    r.latency = percentiles(&latencies_ns);
    if (config.progress) config.progress(name, 1.0);
    return r;
  }
};

// The pass with the median GB/s (the lower middle one for an even count); not run if none.
PassResult median_pass(std::vector<PassResult>* passes) {
  if (passes->empty()) return PassResult{};
  std::sort(passes->begin(), passes->end(),
            [](const PassResult& a, const PassResult& b) { return a.gbps < b.gbps; });
  return (*passes)[(passes->size() - 1) / 2];
}

Status check_config(const IoBenchConfig& c) {
  const std::uint64_t block = c.engine.block_size_bytes;
  const std::uint64_t staging = block * c.engine.queue_depth * c.engine.threads;
  if (c.file.empty()) return Status(ErrorCode::kInvalidArgument, "no benchmark file given");
  if (c.file_size_bytes < block || c.file_size_bytes % block != 0) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("file size {} must be a positive multiple of the block size {}",
                              c.file_size_bytes, block));
  }
  if (staging > c.memory_max_bytes) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("block size x queue depth x threads = {} of staging buffers is "
                              "more than the {} allowed (--memory-max)",
                              format_bytes(staging), format_bytes(c.memory_max_bytes)));
  }
  return Status::ok();
}

}  // namespace

Result<IoBenchResult> run_io_bench(const IoBenchConfig& config) {
  STRATA_TRY(check_config(config));
  EngineOptions options = config.engine;
  options.requests_max =
      std::max<std::uint32_t>(options.requests_max, options.queue_depth * options.threads);
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, make_engine(options));

  struct stat st {};
  const bool existed = ::stat(config.file.c_str(), &st) == 0;
  FileSpec spec;
  spec.paths = {config.file};
  spec.create = !existed;
  spec.size_bytes = config.file_size_bytes;
  STRATA_ASSIGN_OR_RETURN(FileId file, engine->open_file(spec));
  // Closes (and removes a file this run made) on every path out.
  struct Closer {
    IoEngine* engine;
    FileId file;
    bool remove;
    ~Closer() { (void)engine->close_file(file, remove); }
  } closer{engine.get(), file, !existed && !config.keep_file};
  STRATA_ASSIGN_OR_RETURN(FileInfo info, engine->file_info(file));

  const std::uint64_t block = options.block_size_bytes;
  const std::uint64_t pass_bytes =
      std::min(config.pass_bytes != 0 ? config.pass_bytes : config.file_size_bytes,
               config.file_size_bytes) /
      block * block;
  if (pass_bytes == 0) {
    return Status(ErrorCode::kInvalidArgument, "the pass is shorter than one block");
  }
  const std::uint32_t slots = options.queue_depth * options.threads;
  Bench bench{config,
              *engine,
              file,
              pass_bytes,
              {},
              {},
              std::vector<IoHandle>(slots),
              {},
              std::vector<std::uint32_t>(slots),
              std::vector<std::uint32_t>(slots),
              std::vector<IoRequest>(slots),
              std::vector<IoHandle>(slots)};
  STRATA_TRY(bench.staging.map(std::uint64_t{slots} * block));
  // Staging is pinned by registering it (fixed-buffer I/O); without the privilege (ulimit -l)
  // the run goes on unregistered and says so.
  IoBenchResult result;
  result.engine = engine->name();
  result.direct = info.direct;
  result.alignment_bytes = info.alignment_bytes;
  result.registered_buffers = true;
  for (std::uint64_t off = 0; off < bench.staging.bytes(); off += kRegisterChunkBytes) {
    Status registered = engine->register_buffer(
        bench.staging.data() + off, std::min(kRegisterChunkBytes, bench.staging.bytes() - off));
    if (!registered.is_ok()) {
      STRATA_LOG_WARN("bench io: staging buffers not registered ({}); measuring without",
                      registered.to_string());
      result.registered_buffers = false;
      break;
    }
  }
  if (!info.direct) {
    STRATA_LOG_WARN(
        "bench io: {} is not on a file system with O_DIRECT; the figures include "
        "the page cache",
        config.file);
  }
  std::memset(bench.staging.data(), 0xA5, bench.staging.bytes());

  // A new file gets real data before anything reads it (unwritten extents read as zeros
  // without touching the drive).
  if (!config.write && !existed && (config.read || config.copy_path)) {
    STRATA_TRY(bench.pass(Op::kWrite, false, "fill").status());
  }
  if (config.copy_path) {
    STRATA_TRY(bench.destination.map(std::min<std::uint64_t>(pass_bytes, 256ull << 20)));
  }
  std::vector<PassResult> writes, reads, copies;
  for (std::uint32_t rep = 0; rep < std::max<std::uint32_t>(config.repeat, 1); ++rep) {
    if (config.write) {
      STRATA_ASSIGN_OR_RETURN(PassResult w, bench.pass(Op::kWrite, false, "write"));
      writes.push_back(w);
    }
    if (config.read) {
      STRATA_ASSIGN_OR_RETURN(PassResult r, bench.pass(Op::kRead, false, "read"));
      reads.push_back(r);
    }
    if (config.copy_path) {
      STRATA_ASSIGN_OR_RETURN(PassResult c, bench.pass(Op::kRead, true, "copy"));
      copies.push_back(c);
    }
  }
  result.write = median_pass(&writes);
  result.read = median_pass(&reads);
  result.copy = median_pass(&copies);
  return result;
}

Result<std::vector<SweepPoint>> run_io_sweep(const IoBenchConfig& base, const SweepGrid& grid) {
  std::vector<SweepPoint> points;
  for (std::uint64_t block : grid.block_sizes_bytes) {
    for (std::uint32_t threads : grid.threads) {
      for (std::uint32_t depth : grid.queue_depths) {
        SweepPoint point;
        point.block_size_bytes = block;
        point.queue_depth = depth;
        point.threads = threads;
        const std::uint64_t staging = block * depth * threads;
        if (staging > base.memory_max_bytes) {
          point.skipped = true;
          point.skip_reason = fmt::format("staging {} > --memory-max {}", format_bytes(staging),
                                          format_bytes(base.memory_max_bytes));
        } else {
          IoBenchConfig config = base;
          config.engine.block_size_bytes = block;
          config.engine.queue_depth = depth;
          config.engine.threads = threads;
          config.copy_path = false;
          STRATA_ASSIGN_OR_RETURN(point.result, run_io_bench(config));
        }
        points.push_back(std::move(point));
      }
    }
  }
  return points;
}

const SweepPoint* best_point(const std::vector<SweepPoint>& points) {
  auto score = [](const SweepPoint& p) {
    const double r = p.result.read.ran ? p.result.read.gbps : 0.0;
    const double w = p.result.write.ran ? p.result.write.gbps : 0.0;
    if (p.result.read.ran && p.result.write.ran) return r > 0 && w > 0 ? 2 / (1 / r + 1 / w) : 0;
    return r + w;
  };
  double best = 0;
  for (const SweepPoint& p : points) {
    if (!p.skipped) best = std::max(best, score(p));
  }
  const SweepPoint* chosen = nullptr;
  for (const SweepPoint& p : points) {
    if (p.skipped || best == 0 || score(p) < 0.97 * best) continue;
    const std::uint64_t memory = p.block_size_bytes * p.queue_depth * p.threads;
    if (chosen == nullptr ||
        memory < chosen->block_size_bytes * chosen->queue_depth * chosen->threads) {
      chosen = &p;
    }
  }
  return chosen;
}

std::string aio_section_json(const SweepPoint& point) {
  return fmt::format(
      "{{\n  \"aio\": {{\n    \"block_size\": {},\n    \"queue_depth\": {},\n"
      "    \"intra_op_parallelism\": {},\n    \"single_submit\": false,\n"
      "    \"overlap_events\": true\n  }}\n}}\n",
      point.block_size_bytes, point.queue_depth, point.threads);
}

}  // namespace strata::bench
