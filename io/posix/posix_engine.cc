#include "io/posix/posix_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <vector>

#include "io/core/queue_engine.h"
#include "io/core/real_files.h"

namespace strata::io {
namespace {

using core::Piece;
using core::PieceStep;

class PosixEngine final : public core::QueueEngine {
 public:
  explicit PosixEngine(const EngineOptions& options) : QueueEngine(options) {
    const std::uint32_t count =
        std::min<std::uint32_t>(options.threads * options.queue_depth, kPosixThreadsMax);
    threads_.reserve(count);
    for (std::uint32_t i = 0; i < count; ++i)
      threads_.emplace_back([this] { run(); });
  }

  ~PosixEngine() override {
    begin_shutdown();
    for (std::thread& t : threads_)
      t.join();
    close_all_files();
  }

  const char* name() const override { return "posix"; }

  Result<std::uint64_t> free_bytes(const std::string& dir) override {
    return core::real_free_bytes(dir);
  }

 protected:
  Result<core::OpenedFile> open_backing(const FileSpec& spec, std::uint64_t stripe_bytes) override {
    return core::open_real_files(spec, stripe_bytes, options().direct_io);
  }

  Status close_backing(const core::OpenedFile& file, bool remove) override {
    return core::close_real_files(file, remove);
  }

 private:
  void run() {
    Piece piece;
    while (take_piece_wait(&piece)) {
      for (;;) {
        ssize_t n = piece.op == Op::kRead ? ::pread(piece.fd, piece.buffer, piece.remaining,
                                                    static_cast<off_t>(piece.offset))
                                          : ::pwrite(piece.fd, piece.buffer, piece.remaining,
                                                     static_cast<off_t>(piece.offset));
        const std::int64_t result = n >= 0 ? static_cast<std::int64_t>(n) : -errno;
        Status error;
        PieceStep step = account(&piece, result, &error);
        if (step == PieceStep::kAgain) continue;
        finish_piece(piece, error);
        break;
      }
    }
  }

  std::vector<std::thread> threads_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> make_posix_engine(const EngineOptions& options) {
  STRATA_TRY(validate(options));
  return std::unique_ptr<IoEngine>(std::make_unique<PosixEngine>(options));
}

}  // namespace strata::io
