#include "io/uring/uring_engine.h"

#include <liburing.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "common/fault_points.h"
#include "common/log.h"
#include "common/units.h"
#include "io/core/queue_engine.h"
#include "io/core/real_files.h"

namespace strata::io {
namespace {

using core::Piece;
using core::PieceStep;

constexpr std::uint64_t kWakeTag = UINT64_MAX;
constexpr std::uint64_t kRegisteredBufferBytesMax = 1ull << 30;  // kernel limit per buffer
// A failing io_uring_submit / io_uring_wait_cqe is retried only for EINTR, EAGAIN and EBUSY, at
// most this many times in a row, sleeping kBackoffUs, doubling up to kBackoffUsMax, in between
// (about 0.3 s in all); then the worker fails (see fail_worker()).
constexpr int kAttemptsMax = 40;
constexpr std::int64_t kBackoffUs = 50;
constexpr std::int64_t kBackoffUsMax = 10'000;
// io_uring_get_sqe finding the submission queue full this many times in a row (a submit between
// each) fails the worker.
constexpr int kSqeAttemptsMax = 8;
// A worker's wait for completions returns at least this often (where the kernel has timed
// waits, IORING_FEAT_EXT_ARG), so a failed worker still sees the engine stop.
constexpr long long kWaitSliceMs = 50;
// Marks the wake-up NOP in a worker's list of entries not yet handed to the kernel.
constexpr std::uint32_t kWakeEntry = UINT32_MAX;

bool retryable(int err) {
  return err == EINTR || err == EAGAIN || err == EBUSY;
}

void back_off(int attempt) {
  std::int64_t us = kBackoffUs << std::min(attempt, 20);
  std::this_thread::sleep_for(std::chrono::microseconds(std::min(us, kBackoffUsMax)));
}

std::string memlock_text() {
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "unknown";
  return rl.rlim_cur == RLIM_INFINITY ? "unlimited" : format_bytes(rl.rlim_cur);
}

class UringEngine final : public core::QueueEngine {
 public:
  explicit UringEngine(const EngineOptions& options) : QueueEngine(options) {}

  ~UringEngine() override {
    begin_shutdown();
    for (auto& w : workers_) {
      if (w->thread.joinable()) w->thread.join();
    }
    close_all_files();
    for (auto& w : workers_) {
      if (w->ring_ready) io_uring_queue_exit(&w->ring);
    }
  }

  const char* name() const override { return "uring"; }

  Result<std::uint64_t> free_bytes(const std::string& dir) override {
    return core::real_free_bytes(dir);
  }

  // Sets up every ring before any thread starts, so a failure leaves nothing running.
  Status start() {
    const EngineOptions& o = options();
    for (std::uint32_t t = 0; t < o.threads; ++t) {
      auto w = std::make_unique<Worker>();
      w->pieces.resize(o.queue_depth);
      w->ended.reserve(o.queue_depth);
      w->errors.resize(o.queue_depth);
      for (std::uint32_t e = o.queue_depth; e > 0; --e)
        w->free.push_back(e - 1);
      w->index = t;
      w->unsubmitted.reserve(o.queue_depth + 2);
      int rc = io_uring_queue_init(o.queue_depth + 2, &w->ring, 0);
      if (rc < 0) {
        return Status(ErrorCode::kUnavailable,
                      fmt::format("io_uring_queue_init({} entries) failed: {}", o.queue_depth + 2,
                                  core::errno_text(-rc)));
      }
      w->ring_ready = true;
      w->fixed_files = io_uring_register_files_sparse(&w->ring, o.files_max * kStripesMax) == 0;
      w->fixed_buffers = io_uring_register_buffers_sparse(&w->ring, o.buffers_max) == 0;
      workers_.push_back(std::move(w));
    }
    fixed_files_ = workers_.front()->fixed_files;
    fixed_buffers_ = workers_.front()->fixed_buffers;
    for (auto& w : workers_) {
      // All rings use the same mode so that the file table index means the same everywhere.
      w->fixed_files = fixed_files_;
      w->fixed_buffers = fixed_buffers_;
      Worker* raw = w.get();
      w->thread = std::thread([this, raw] { run(*raw); });
    }
    if (!fixed_files_ || !fixed_buffers_) {
      STRATA_LOG_DEBUG("io_uring: registered files {}, registered buffers {}",
                       fixed_files_ ? "on" : "off", fixed_buffers_ ? "on" : "off");
    }
    return Status::ok();
  }

 protected:
  Result<core::OpenedFile> open_backing(const FileSpec& spec, std::uint64_t stripe_bytes) override {
    return core::open_real_files(spec, stripe_bytes, options().direct_io);
  }

  Status close_backing(const core::OpenedFile& file, bool remove) override {
    return core::close_real_files(file, remove);
  }

  Status on_file_opened(std::int32_t index, const core::OpenedFile& file) override {
    if (!fixed_files_) return Status::ok();
    std::array<int, kStripesMax> fds = file.fds;
    for (auto& w : workers_) {
      int rc = io_uring_register_files_update(&w->ring, static_cast<unsigned>(index) * kStripesMax,
                                              fds.data(), kStripesMax);
      if (rc < 0) {
        on_file_closing(index);
        return Status(
            ErrorCode::kIo,
            fmt::format("cannot register the file with io_uring: {}", core::errno_text(-rc)),
            file.info.paths.front());
      }
    }
    return Status::ok();
  }

  void on_file_closing(std::int32_t index) override {
    if (!fixed_files_) return;
    std::array<int, kStripesMax> none;
    none.fill(-1);
    for (auto& w : workers_) {
      int rc = io_uring_register_files_update(&w->ring, static_cast<unsigned>(index) * kStripesMax,
                                              none.data(), kStripesMax);
      if (rc < 0)
        STRATA_LOG_WARN("io_uring: unregistering a file failed: {}", core::errno_text(-rc));
    }
  }

  Status on_buffer_changed(std::int32_t index, void* addr, std::uint64_t bytes) override {
    if (!fixed_buffers_) return Status::ok();
    if (bytes > kRegisteredBufferBytesMax) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("io_uring registers at most {} per buffer, got {}; register the "
                                "buffer in parts",
                                format_bytes(kRegisteredBufferBytesMax), format_bytes(bytes)));
    }
    struct iovec iov {};
    iov.iov_base = addr;
    iov.iov_len = bytes;
    __u64 tag = 0;
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      int rc = io_uring_register_buffers_update_tag(&workers_[i]->ring,
                                                    static_cast<unsigned>(index), &iov, &tag, 1);
      if (rc < 0) {
        // Undo the rings already updated.
        struct iovec empty {};
        for (std::size_t j = 0; j < i; ++j) {
          (void)io_uring_register_buffers_update_tag(&workers_[j]->ring,
                                                     static_cast<unsigned>(index), &empty, &tag, 1);
        }
        return Status(-rc == ENOMEM ? ErrorCode::kOutOfMemory : ErrorCode::kIo,
                      fmt::format("cannot register {} with io_uring: {} (locked-memory limit, "
                                  "ulimit -l: {})",
                                  format_bytes(bytes), core::errno_text(-rc), memlock_text()));
      }
    }
    return Status::ok();
  }

  // New pieces were queued: the submitting thread moves them into rings with room itself, so
  // no worker has to wake up to submit. Once shutdown began, a NOP wakes each worker to exit.
  void wake_workers() override {
    const bool stop = stopping();
    for (auto& w : workers_) {
      std::lock_guard<std::mutex> lock(w->sq_mu);
      if (stop) {
        // A failed worker hands nothing more to the kernel: it wakes from its bounded wait
        // (kWaitSliceMs) or, on kernels without timed waits, from this last NOP, tried once.
        if (!w->failure.is_ok()) {
          if (!(w->ring.features & IORING_FEAT_EXT_ARG)) {
            if (struct io_uring_sqe* sqe = io_uring_get_sqe(&w->ring); sqe != nullptr) {
              io_uring_prep_nop(sqe);
              io_uring_sqe_set_data64(sqe, kWakeTag);
              const int rc = io_uring_submit(&w->ring);
              if (rc < 0) STRATA_LOG_DEBUG("io_uring: wake-up NOP: {}", core::errno_text(-rc));
            }
          }
          continue;
        }
        struct io_uring_sqe* sqe = get_sqe(*w);
        if (sqe == nullptr) continue;
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, kWakeTag);
        w->unsubmitted.push_back(kWakeEntry);
        submit_locked(*w);
      } else if (!fill_locked(*w)) {
        break;  // the queues are empty
      }
    }
  }

 private:
  struct Worker {
    struct io_uring ring {};
    bool ring_ready = false;
    bool fixed_files = false;
    bool fixed_buffers = false;
    // Guards the submission queue and the piece table: submitters fill the ring, the worker
    // thread reaps completions (the CQ is the worker's alone).
    std::mutex sq_mu;
    std::vector<Piece> pieces;        // queue_depth entries; index = user_data
    std::vector<std::uint32_t> free;  // free entries of `pieces`
    std::uint32_t in_flight = 0;
    std::vector<std::uint32_t> ended;  // worker only: entries whose piece is over
    std::vector<Status> errors;        // worker only: their results, by entry
    std::uint32_t index = 0;
    // Entries prepared in the SQ but not yet taken by the kernel, in order (kWakeEntry: a NOP).
    std::vector<std::uint32_t> unsubmitted;
    // Set once the ring failed for good (a submit or wait that kept failing): the worker hands
    // nothing more to the kernel, fails every piece it is given with this, and only reaps what
    // the kernel already has.
    Status failure;
    std::thread thread;
  };

  // A free SQE, or nullptr once the worker failed (the SQ stayed full, or a submit failed).
  struct io_uring_sqe* get_sqe(Worker& w) {
    for (int attempt = 0; w.failure.is_ok(); ++attempt) {
      struct io_uring_sqe* sqe = io_uring_get_sqe(&w.ring);
      if (sqe != nullptr) return sqe;
      if (attempt == kSqeAttemptsMax) {
        fail_worker(
            w, "io_uring_get_sqe",
            fmt::format("the submission queue stayed full after {} submits", kSqeAttemptsMax));
        break;
      }
      submit_locked(w);  // the SQ is full: hand what is there to the kernel
    }
    return nullptr;
  }

  // Hands prepared SQEs to the kernel; caller holds w.sq_mu. EINTR/EAGAIN/EBUSY are retried a
  // bounded number of times; any other error, or running out of attempts, fails the worker.
  void submit_locked(Worker& w) {
    for (int attempt = 0; w.failure.is_ok() && io_uring_sq_ready(&w.ring) > 0; ++attempt) {
      const int injected = injected_uring_error(UringCall::kSubmit);
      const int rc = injected != 0 ? -injected : io_uring_submit(&w.ring);
      if (rc >= 0) {
        const auto taken =
            std::min<std::size_t>(static_cast<std::size_t>(rc), w.unsubmitted.size());
        w.unsubmitted.erase(w.unsubmitted.begin(),
                            w.unsubmitted.begin() + static_cast<std::ptrdiff_t>(taken));
        attempt = -1;  // progress: a later failure starts its own count
        continue;
      }
      if (!retryable(-rc) || attempt + 1 >= kAttemptsMax) {
        fail_worker(w, "io_uring_submit",
                    fmt::format("{}{}", core::errno_text(-rc),
                                retryable(-rc) ? fmt::format(", {} attempts", kAttemptsMax) : ""));
        return;
      }
      back_off(attempt);
    }
  }

  // The ring of `w` failed for good in `call`; caller holds w.sq_mu. Takes the SQEs the kernel
  // has not seen back out of the SQ (without SQPOLL the kernel reads the SQ only inside
  // io_uring_enter, which this thread holds the ring for), fails their pieces with a kIo error
  // naming the call, errno and engine, and from then on fails every piece the worker is given,
  // so no request waits forever. Pieces the kernel already has complete as usual.
  void fail_worker(Worker& w, const char* call, const std::string& why) {
    if (!w.failure.is_ok()) return;
    w.failure = Status(
        ErrorCode::kIo,
        fmt::format("{} failed in the uring I/O engine (worker {}): {}", call, w.index, why));
    STRATA_LOG_WARN("{}", w.failure.to_string());
    const unsigned head = io_uring_smp_load_acquire(w.ring.sq.khead);
    io_uring_smp_store_release(w.ring.sq.ktail, head);
    w.ring.sq.sqe_head = w.ring.sq.sqe_tail = head;
    for (std::uint32_t entry : w.unsubmitted) {
      if (entry == kWakeEntry) continue;
      finish_piece(w.pieces[entry], w.failure);
      w.free.push_back(entry);
      --w.in_flight;
    }
    w.unsubmitted.clear();
  }

  // Moves queued pieces into the ring while it has room (without overlap_events only when the
  // previous batch is all back) and submits them; caller holds w.sq_mu. False when the queues
  // ran dry.
  bool fill_locked(Worker& w) {
    const EngineOptions& o = options();
    bool more = true;
    if (!w.failure.is_ok()) {
      // A failed worker fails what it takes instead of leaving it queued forever.
      Piece piece;
      while (take_piece(&piece))
        finish_piece(piece, w.failure);
      return false;
    }
    if (o.overlap_events || w.in_flight == 0) {
      while (w.in_flight < o.queue_depth && w.failure.is_ok()) {
        const std::uint32_t entry = w.free.back();
        if (!take_piece(&w.pieces[entry])) {
          more = false;
          break;
        }
        w.free.pop_back();
        ++w.in_flight;
        if (!prep(w, entry)) {
          finish_piece(w.pieces[entry], w.failure);
          w.free.push_back(entry);
          --w.in_flight;
          break;
        }
        if (o.single_submit) submit_locked(w);
      }
    }
    submit_locked(w);
    return more;
  }

  // Puts the piece of `entry` in the SQ; false when the worker failed (w.failure says why).
  bool prep(Worker& w, std::uint32_t entry) {
    const Piece& p = w.pieces[entry];
    struct io_uring_sqe* sqe = get_sqe(w);
    if (sqe == nullptr) return false;
    const int fd = w.fixed_files ? static_cast<int>(p.file * kStripesMax + p.stripe) : p.fd;
    const auto length = static_cast<unsigned>(p.remaining);
    if (w.fixed_buffers && p.buffer_index >= 0) {
      if (p.op == Op::kRead) {
        io_uring_prep_read_fixed(sqe, fd, p.buffer, length, p.offset, p.buffer_index);
      } else {
        io_uring_prep_write_fixed(sqe, fd, p.buffer, length, p.offset, p.buffer_index);
      }
    } else if (p.op == Op::kRead) {
      io_uring_prep_read(sqe, fd, p.buffer, length, p.offset);
    } else {
      io_uring_prep_write(sqe, fd, p.buffer, length, p.offset);
    }
    if (w.fixed_files) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, entry);
    w.unsubmitted.push_back(entry);
    return true;
  }

  // Consumes the completions in the CQ: accounts them, resubmits short pieces, ends the others
  // and refills the ring. Only the worker thread calls it.
  void process(Worker& w) {
    w.ended.clear();
    {
      std::lock_guard<std::mutex> lock(w.sq_mu);
      unsigned head = 0;
      unsigned seen = 0;
      struct io_uring_cqe* cqe = nullptr;
      io_uring_for_each_cqe(&w.ring, head, cqe) {
        ++seen;
        const std::uint64_t tag = io_uring_cqe_get_data64(cqe);
        if (tag == kWakeTag) continue;
        const auto entry = static_cast<std::uint32_t>(tag);
        Piece& piece = w.pieces[entry];
        w.errors[entry] = Status::ok();
        if (account(&piece, cqe->res, &w.errors[entry]) == PieceStep::kAgain) {
          if (prep(w, entry)) continue;  // the remainder; submitted below
          w.errors[entry] = w.failure;
        }
        w.ended.push_back(entry);
      }
      io_uring_cq_advance(&w.ring, seen);
    }
    // Ending a piece may wake a waiter; do it without holding the ring.
    for (std::uint32_t entry : w.ended)
      finish_piece(w.pieces[entry], w.errors[entry]);
    std::lock_guard<std::mutex> lock(w.sq_mu);
    for (std::uint32_t entry : w.ended)
      w.free.push_back(entry);
    w.in_flight -= static_cast<std::uint32_t>(w.ended.size());
    fill_locked(w);
  }

  // The worker: waits for completions and processes them until shutdown. A wait that keeps
  // failing (EINTR/EAGAIN/EBUSY past kAttemptsMax, or any other error) fails the worker; a failed
  // worker reaps what the kernel still completes without waiting in it (the CQ is shared memory,
  // filled whenever this thread enters the kernel, its sleep included) and polls for shutdown.
  void run(Worker& w) {
    int failed_waits = 0;
    for (;;) {
      bool failed = false;
      {
        std::lock_guard<std::mutex> lock(w.sq_mu);
        failed = !w.failure.is_ok();
      }
      if (failed) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      } else {
        struct io_uring_cqe* cqe = nullptr;
        const int injected = injected_uring_error(UringCall::kWaitCqe);
        int rc = -injected;
        if (injected == 0 && (w.ring.features & IORING_FEAT_EXT_ARG)) {
          struct __kernel_timespec slice {};
          slice.tv_nsec = kWaitSliceMs * 1'000'000;
          rc = io_uring_wait_cqe_timeout(&w.ring, &cqe, &slice);
          if (rc == -ETIME) rc = 0;  // no completion in this slice
        } else if (injected == 0) {
          rc = io_uring_wait_cqe(&w.ring, &cqe);
        }
        if (rc >= 0) {
          failed_waits = 0;
        } else if (retryable(-rc) && ++failed_waits < kAttemptsMax) {
          back_off(failed_waits);
        } else {
          std::lock_guard<std::mutex> lock(w.sq_mu);
          fail_worker(
              w, "io_uring_wait_cqe",
              fmt::format("{}{}", core::errno_text(-rc),
                          retryable(-rc) ? fmt::format(", {} attempts", kAttemptsMax) : ""));
        }
      }
      process(w);
      std::lock_guard<std::mutex> lock(w.sq_mu);
      if (stopping() && (w.in_flight == 0 || !w.failure.is_ok())) break;
    }
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  bool fixed_files_ = false;
  bool fixed_buffers_ = false;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> make_uring_engine(const EngineOptions& options) {
  STRATA_TRY(validate(options));
  auto engine = std::make_unique<UringEngine>(options);
  STRATA_TRY(engine->start());
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace strata::io
