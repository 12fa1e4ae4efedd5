#include "io/sim/sim_engine.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "common/units.h"
#include "io/core/queue_engine.h"
#include "io/core/real_files.h"

namespace strata::io {
namespace {

using core::Piece;
using core::PieceStep;

enum class Salt : std::uint64_t { kEio = 1, kEnospc, kShort, kTorn, kLatency, kAmount };

class SimEngine final : public core::QueueEngine, public SimControl {
 public:
  SimEngine(const EngineOptions& options, const SimOptions& sim)
      : QueueEngine(options), sim_(sim), faults_(sim.faults), tables_(options.files_max) {
    STRATA_LOG_INFO(
        "io sim: seed {} (rates: eio {}, enospc {}, short {}, torn {}, latency {} x {} us), "
        "capacity {}",
        sim.seed, faults_.eio_rate, faults_.enospc_rate, faults_.short_rate, faults_.torn_rate,
        faults_.latency_rate, faults_.latency_us, format_bytes(sim.capacity_bytes));
    for (std::uint32_t i = 0; i < options.threads; ++i)
      threads_.emplace_back([this] { run(); });
  }

  ~SimEngine() override {
    set_paused(false);
    begin_shutdown();
    for (std::thread& t : threads_)
      t.join();
    close_all_files();
  }

  const char* name() const override { return "sim"; }

  Result<std::uint64_t> free_bytes(const std::string&) override {
    std::lock_guard<std::mutex> lock(mu_);
    return sim_.capacity_bytes - used_bytes_;
  }

  // ---- SimControl ----
  std::uint64_t seed() const override { return sim_.seed; }

  void set_faults(const SimFaults& faults) override {
    std::lock_guard<std::mutex> lock(mu_);
    faults_ = faults;
  }

  void set_paused(bool paused) override { set_hold(paused); }

  SimCounters counters() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_;
  }

  Result<std::vector<std::uint8_t>> contents(const std::string& path) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = disk_.find(path);
    if (it == disk_.end()) {
      return Status(ErrorCode::kNotFound, "no such simulated file", path);
    }
    return it->second;
  }

  Status corrupt_byte(const std::string& path, std::uint64_t offset) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = disk_.find(path);
    if (it == disk_.end()) return Status(ErrorCode::kNotFound, "no such simulated file", path);
    if (offset >= it->second.size()) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("offset {} is past the file's {} bytes", offset, it->second.size()),
                    path);
    }
    it->second[offset] ^= 0xFF;
    return Status::ok();
  }

 protected:
  Result<core::OpenedFile> open_backing(const FileSpec& spec, std::uint64_t stripe_bytes) override {
    core::OpenedFile file;
    file.info.paths = spec.paths;
    file.info.stripe_bytes = stripe_bytes;
    file.info.alignment_bytes = sim_.alignment_bytes;
    file.info.direct = false;
    std::lock_guard<std::mutex> lock(mu_);
    if (!spec.create) {
      auto it = disk_.find(spec.paths.front());
      if (it == disk_.end()) {
        return Status(ErrorCode::kNotFound, "the file does not exist", spec.paths.front());
      }
      const std::uint64_t have = it->second.size() / sim_.alignment_bytes * sim_.alignment_bytes;
      file.info.size_bytes = spec.size_bytes != 0 ? spec.size_bytes : have;
      if (file.info.size_bytes == 0 || file.info.size_bytes > have) {
        return Status(ErrorCode::kInvalidArgument,
                      fmt::format("the file holds {} usable bytes, {} were asked for", have,
                                  file.info.size_bytes),
                      spec.paths.front());
      }
      return file;
    }
    file.info.size_bytes = spec.size_bytes;
    file.info.header_bytes =
        spec.header.empty() ? 0 : align_up(spec.header.size(), sim_.alignment_bytes);
    const std::uint64_t per_file =
        file.info.header_bytes +
        core::data_bytes_per_stripe_file(spec.size_bytes, stripe_bytes,
                                         static_cast<std::uint32_t>(spec.paths.size()));
    for (const std::string& path : spec.paths) {
      if (disk_.count(path) != 0) {
        return Status(ErrorCode::kIo,
                      "the file already exists; Strata only creates new files and never "
                      "overwrites one it did not create",
                      path);
      }
    }
    const std::uint64_t need = per_file * spec.paths.size();
    if (used_bytes_ + need > sim_.capacity_bytes) {
      return Status(
          ErrorCode::kNoSpace,
          fmt::format("cannot reserve {} ({} bytes) for the file: the simulated disk "
                      "has {} free (No space left on device (ENOSPC))",
                      format_bytes(need), need, format_bytes(sim_.capacity_bytes - used_bytes_)),
          spec.paths.front());
    }
    for (const std::string& path : spec.paths) {
      std::vector<std::uint8_t>& bytes = disk_[path];
      bytes.assign(per_file, 0);
      std::memcpy(bytes.data(), spec.header.data(), spec.header.size());
    }
    used_bytes_ += need;
    return file;
  }

  Status close_backing(const core::OpenedFile& file, bool remove) override {
    if (!remove) return Status::ok();
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& path : file.info.paths) {
      auto it = disk_.find(path);
      if (it == disk_.end()) continue;
      used_bytes_ -= it->second.size();
      disk_.erase(it);
    }
    return Status::ok();
  }

  Status on_file_opened(std::int32_t index, const core::OpenedFile& file) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < file.info.paths.size(); ++i) {
      tables_[index][i] = &disk_.at(file.info.paths[i]);
    }
    return Status::ok();
  }

  void on_file_closing(std::int32_t index) override {
    std::lock_guard<std::mutex> lock(mu_);
    tables_[index].fill(nullptr);
  }

 private:
  // A uniform draw in [0, 1) for one decision about one attempt.
  double draw(const Piece& p, Salt salt) const {
    const std::uint64_t key[5] = {p.serial, p.offset, p.retries, static_cast<std::uint64_t>(p.op),
                                  static_cast<std::uint64_t>(salt)};
    const std::uint64_t h = XXH3_64bits_withSeed(key, sizeof(key), sim_.seed);
    return static_cast<double>(h >> 11) * 0x1.0p-53;
  }

  // One attempt at `p`: bytes moved, or -errno, as a real system call would report.
  std::int64_t attempt(const Piece& p) {
    SimFaults f;
    std::vector<std::uint8_t>* file = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      f = faults_;
      file = tables_[p.file][p.stripe];
      counters_.attempts++;
    }
    auto count = [&](std::uint64_t SimCounters::*field) {
      std::lock_guard<std::mutex> lock(mu_);
      counters_.*field += 1;
    };
    if (draw(p, Salt::kLatency) < f.latency_rate) {
      count(&SimCounters::delayed);
      std::this_thread::sleep_for(std::chrono::microseconds(f.latency_us));
    }
    if (draw(p, Salt::kEio) < f.eio_rate) {
      count(&SimCounters::eio);
      return -EIO;
    }
    const bool write = p.op == Op::kWrite;
    if (write && draw(p, Salt::kEnospc) < f.enospc_rate) {
      count(&SimCounters::enospc);
      return -ENOSPC;
    }
    const std::uint64_t align = sim_.alignment_bytes;
    const std::uint64_t units = p.remaining / align;
    // A part of the piece, in whole alignment units: 0 < part < remaining when units > 1.
    auto part = [&](std::uint64_t lo) {
      const std::uint64_t span = units - lo;
      const auto pick =
          static_cast<std::uint64_t>(draw(p, Salt::kAmount) * static_cast<double>(span));
      return (lo + std::min(pick, span - 1)) * align;
    };
    std::uint8_t* disk = file->data() + p.offset;
    if (write && draw(p, Salt::kTorn) < f.torn_rate) {
      count(&SimCounters::torn);
      const std::uint64_t landed = units > 1 ? part(1) : 0;
      std::memcpy(disk, p.buffer, landed);
      return -EIO;
    }
    std::uint64_t n = p.remaining;
    if (units > 1 && draw(p, Salt::kShort) < f.short_rate) {
      count(&SimCounters::short_transfers);
      n = part(1);
    }
    if (write) {
      std::memcpy(disk, p.buffer, n);
    } else {
      std::memcpy(p.buffer, disk, n);
    }
    return static_cast<std::int64_t>(n);
  }

  void run() {
    Piece piece;
    for (;;) {
      if (!take_piece_wait(&piece)) return;
      for (;;) {
        Status error;
        PieceStep step = account(&piece, attempt(piece), &error);
        if (step == PieceStep::kAgain) continue;
        finish_piece(piece, error);
        break;
      }
    }
  }

  const SimOptions sim_;
  mutable std::mutex mu_;  // guards everything below
  SimFaults faults_;
  SimCounters counters_;
  std::map<std::string, std::vector<std::uint8_t>> disk_;
  std::uint64_t used_bytes_ = 0;
  std::vector<std::array<std::vector<std::uint8_t>*, kStripesMax>> tables_;
  std::vector<std::thread> threads_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> make_sim_engine(const EngineOptions& options,
                                                  const SimOptions& sim) {
  STRATA_TRY(validate(options));
  if (sim.alignment_bytes < 512 || (sim.alignment_bytes & (sim.alignment_bytes - 1)) != 0) {
    return Status(
        ErrorCode::kInvalidArgument,
        fmt::format("sim alignment {} is not a power of two >= 512", sim.alignment_bytes));
  }
  return std::unique_ptr<IoEngine>(std::make_unique<SimEngine>(options, sim));
}

SimControl* sim_control(IoEngine* engine) {
  return dynamic_cast<SimEngine*>(engine);
}

}  // namespace strata::io
